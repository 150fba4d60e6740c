"""Entry point of the ``sojourn`` command. Commands live in their own modules."""

from __future__ import annotations

import sys

import click

from sojourn.errors import SojournError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except SojournError as e:
            click.echo(f"sojourn: error: {e}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sojourn")
def cli() -> None:
    """Make a running Python program portable."""


def _register() -> None:
    from sojourn.cli import capsule_cmds, session_cmds

    cli.add_command(capsule_cmds.inspect_cmd)
    cli.add_command(capsule_cmds.verify_cmd)
    session_cmds.register(cli)


_register()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
