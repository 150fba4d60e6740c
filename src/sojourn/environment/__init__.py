"""The program's environment, recorded at capture and rebuilt where it resumes.

- ``record``: what a capsule needs: the interpreter and platform, every distribution the
  captured objects come from with its requirements, versions, origin and build variant;
- ``probe``: what a target interpreter has (run in that interpreter, stdlib only);
- ``plan``: what is missing or differs there, and the one-line refusal that names it;
- ``build``: a virtual environment with what the capsule needs, made with ``uv`` into a
  cache keyed by the environment's hash.

Nothing here imports a capsule; ``capsule`` imports this (docs/environment.md).
"""
