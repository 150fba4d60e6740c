"""Entry point of the ``sojourn`` command. Commands live in their own modules."""

from __future__ import annotations

import sys

if sys.argv[1:2] in (["run"], ["resume"]):
    # First, before the imports: a signal while `sojourn run` starts up is served by its
    # supervisor once it runs (workspace/held.py), not the default death.
    import signal

    from sojourn.workspace import held

    held.hold((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1))

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
    from sojourn.cli import capsule_cmds, history_cmds, session_cmds

    cli.add_command(capsule_cmds.inspect_cmd)
    cli.add_command(capsule_cmds.verify_cmd)
    cli.add_command(capsule_cmds.source_cmd)
    cli.add_command(capsule_cmds.env_cmd)
    from sojourn.cli import machine_cmds

    cli.add_command(machine_cmds.machines_cmd)
    session_cmds.register(cli)
    from sojourn.cli import offer_cmds

    offer_cmds.register(cli)
    for cmd in (history_cmds.fork_cmd, history_cmds.history_cmd, history_cmds.gc_cmd, history_cmds.checkpoint_cmd):
        cli.add_command(cmd)
    from sojourn.cli import move_cmds

    cli.add_command(move_cmds.move_cmd)
    from sojourn.cli import policy_cmds

    policy_cmds.register(cli)
    from sojourn.cli import repo_cmds

    cli.add_command(repo_cmds.init_cmd)
    from sojourn.cli import console_cmd

    cli.add_command(console_cmd.console_cmd)


_register()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
