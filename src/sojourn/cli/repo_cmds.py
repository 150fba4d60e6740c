"""``sojourn init``: create a repository on purpose, encrypted or not."""

from __future__ import annotations

import click

from sojourn import ops
from sojourn.cli.output import emit_json


@click.command("init")
@click.option("--repo", envvar="SOJOURN_REPO", default=None, help="Repository path or s3://bucket/prefix.")
@click.option("--encrypt/--no-encrypt", default=None,
              help="Encrypt chunks, manifests and records (default: yes for s3://, no for a local path).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def init_cmd(repo: str | None, encrypt: bool | None, as_json: bool) -> None:
    """Create a repository (or show the one that is there)."""
    info = ops.init_repository(repo, encrypt=encrypt)
    if as_json:
        emit_json(info.to_json())
        return
    kind = "encrypted" if info.encrypted else "plain"
    verb = "created" if info.created else "already there:"
    click.echo(f"{verb} {kind} repository {info.id} at {info.url}")
    click.echo(f"key: {info.key} (every machine that uses the repository needs it; keep it 0600)")
