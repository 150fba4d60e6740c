"""``sojourn console``: a web console over ``sojourn.ops`` (docs/console.md).

Server-rendered pages (Starlette + Jinja2, served by uvicorn; the ``console`` extra) with a
little inline script for the live log. Every page reads through ``ops`` and every action
calls ``ops``: the console shows what the CLI would and does what it would do."""
