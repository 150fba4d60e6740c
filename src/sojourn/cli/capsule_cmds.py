"""``sojourn inspect``, ``sojourn verify`` and ``sojourn source``."""

from __future__ import annotations

import click

from sojourn import ops
from sojourn.cli.output import emit_json, human_size, table

repo_option = click.option(
    "--repo", envvar="SOJOURN_REPO", default=None, help="Repository path or s3://bucket/prefix."
)


@click.command("inspect")
@click.argument("capsule")
@repo_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def inspect_cmd(capsule: str, repo: str | None, as_json: bool) -> None:
    """Show what a capsule holds: variables, files, environment, parent."""
    info = ops.inspect(capsule, repo)
    if as_json:
        emit_json(info.to_json())
        return
    env = info.environment
    click.echo(f"capsule   {info.id}")
    click.echo(f"created   {info.created}")
    click.echo(f"parent    {info.parent or '-'}")
    click.echo(f"size      {human_size(info.size)} ({info.stats.get('bytes_written', 0)} bytes written)")
    click.echo(
        f"python    {env.get('python')} ({env.get('implementation')}, {env.get('machine')}, "
        f"{env.get('byteorder')}-endian)"
    )
    table(
        "variables",
        ["name", "type", "size", "fingerprint"],
        [[v.name, v.type, human_size(v.size), v.fingerprint[:16]] for v in info.variables],
    )
    if info.files:
        table(
            "files",
            ["path", "size", "mode", "hash"],
            [[f["path"], human_size(f["size"]), oct(f["mode"]), f["hash"][:16]] for f in info.files],
        )
    if info.distributions:
        table("distributions", ["name", "version"], [[k, v] for k, v in sorted(info.distributions.items())])
    if info.user_modules:
        table("workspace modules", ["module", "sha256"], [[k, v[:16]] for k, v in sorted(info.user_modules.items())])


@click.command("verify")
@click.argument("capsule")
@repo_option
@click.option("--python", "python", default=None, help="Interpreter to verify with (default: this one).")
@click.option("--build-env", is_flag=True,
              help="Build the capsule's environment (uv, cached) for the interpreter if it lacks it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def verify_cmd(capsule: str, repo: str | None, python: str | None, build_env: bool, as_json: bool) -> None:
    """Restore a capsule in a fresh interpreter and compare every fingerprint."""
    report = ops.verify(capsule, repo, python=python, build_env=build_env)
    if as_json:
        emit_json(report.to_json())
    elif report.ok:
        click.echo(
            f"{report.capsule}: OK, {len(report.variables)} fingerprints matched in a fresh "
            f"Python {report.python} ({report.seconds:.2f} s)"
        )
        for note in report.notes:
            click.echo(f"  note: {note}")
    else:
        click.echo(f"{report.capsule}: FAILED: {report.error}", err=True)
    if not report.ok:
        raise SystemExit(1)


@click.command("source")
@click.argument("capsule")
@click.argument("file", required=False)
@repo_option
@click.option("--to", "to", default=None, type=click.Path(file_okay=False),
              help="Write the captured files under this directory (their places relative to the script's folder).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def source_cmd(capsule: str, file: str | None, repo: str | None, to: str | None, as_json: bool) -> None:
    """Print the program's source as the capsule captured it (FILE: one file, by its path or
    module name), or write it under a directory: to recover it, or diff it with an edit."""
    found = ops.sources(capsule, repo)
    if file is not None:
        found = [s for s in found if file in (s.relpath, s.module, s.path)]
        if not found:
            names = ", ".join(s.relpath for s in ops.sources(capsule, repo))
            raise click.ClickException(f"the capsule holds no source {file!r}; it holds {names}")
    if to is not None:
        written = ops.write_sources(found, to)
        if as_json:
            emit_json({"written": written})
        else:
            for path in written:
                click.echo(path)
    elif as_json:
        emit_json([s.to_json() for s in found])
    elif file is not None:
        click.echo(found[0].text, nl=False)
    else:
        for s in found:
            click.echo(f"# ==> {s.relpath} ({s.module}, {s.now} since the capture) <==")
            click.echo(s.text, nl=not s.text.endswith("\n"))


@click.command("env")
@click.argument("capsule")
@repo_option
@click.option("--python", "python", default=None, help="The interpreter to compare with (default: this one).")
@click.option("--mode", type=click.Choice(["exact", "compatible"]), default="exact", show_default=True)
@click.option("--build", is_flag=True, help="Build the environment (uv, cached) and print its interpreter.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def env_cmd(capsule: str, repo: str | None, python: str | None, mode: str, build: bool, as_json: bool) -> None:
    """Show the environment CAPSULE needs against an interpreter, or build it (docs/environment.md)."""
    from sojourn.ops import environment as E

    if build:
        click.echo(E.build(capsule, repo, python=python, mode=mode))
        return
    p = E.plan(capsule, repo, python=python, mode=mode)
    if as_json:
        emit_json(p.to_json())
        return
    click.echo(f"capsule   {p.capsule}")
    click.echo(f"target    {p.python} (Python {p.version}{'' if p.supported else ', not supported'})")
    click.echo(f"key       {p.key} ({mode})")
    table("needs", ["module", "distribution", "version", "variables", "here"],
          [[m, n.get("distribution") or "-", n.get("version") or "-", ", ".join(n.get("variables") or []),
            "missing" if m in p.missing else "ok"] for m, n in sorted(p.needs.items())])
    table("packages", ["name", "version", "source", "variant"],
          [[k, v.get("version", ""), (v.get("source") or {}).get("kind", ""),
            ", ".join(f"{a}={b}" for a, b in (v.get("variant") or {}).items())] for k, v in sorted(p.packages.items())])
    for d in p.differences:
        click.echo(f"  differs: {d}")
    if p.sojourn_missing:
        click.echo(f"  the target lacks sojourn's own: {', '.join(p.sojourn_missing)}")
    if p.missing or p.sojourn_missing or not p.supported:
        click.echo("not resumable there as it is: `sojourn env CAP --build` or `sojourn resume WS --build-env`")
