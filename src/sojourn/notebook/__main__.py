"""``python -m sojourn.notebook install [--sys-prefix] [--machine M] [--repo R] [--autosave]
[--standby N] [--standby-preload torch,numpy]``"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sojourn.notebook")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="install the 'sojourn' Jupyter kernel")
    i.add_argument("--name", default="sojourn")
    i.add_argument("--sys-prefix", action="store_true", help="into this environment, not the user's")
    i.add_argument("--machine", default="local")
    i.add_argument("--repo")
    i.add_argument("--autosave", action="store_true")
    i.add_argument("--standby", type=int, default=0, help="warm standby kernels kept ready (each holds its "
                   "imported libraries in memory; see docs/notebooks.md)")
    i.add_argument("--standby-preload", default="", help="libraries a standby imports, comma-separated "
                   "(default: learned from the kernels' imports)")
    args = p.parse_args(argv)
    from sojourn.notebook.kernelspec import install

    where = install(args.name, user=not args.sys_prefix, prefix=sys.prefix if args.sys_prefix else None,
                    machine=args.machine, repo=args.repo, autosave=args.autosave, standby=args.standby,
                    standby_preload=[n.strip() for n in args.standby_preload.split(",") if n.strip()])
    print(f"installed kernel {args.name!r} in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
