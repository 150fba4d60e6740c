"""``sojourn console``: the web console (docs/console.md)."""

from __future__ import annotations

import click


@click.command("console")
@click.option("--port", type=int, default=8765, show_default=True, help="Port to listen on (0: a free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback lets other machines reach the login page.")
@click.option("--no-browser", is_flag=True, help="Print the URL without opening a browser.")
@click.option("--repo", default=None, help="Repository (default: $SOJOURN_REPO or ~/.sojourn/repo).")
def console_cmd(port: int, host: str, no_browser: bool, repo: str | None) -> None:
    """Serve a web console over the repository's workspaces, on 127.0.0.1 with a token."""
    from sojourn.console.server import serve

    serve(repo, host=host, port=port, open_browser=not no_browser, announce=lambda s: click.echo(s, err=True))
