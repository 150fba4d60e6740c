"""``sojourn offers`` (and ``offers refresh``) and ``sojourn plan``."""

from __future__ import annotations

import click

from sojourn.cli.capsule_cmds import repo_option
from sojourn.cli.output import emit_json, human_size, table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")


def _gpu(o: object) -> str:
    gpus, gpu, mem = getattr(o, "gpus", 0), getattr(o, "gpu", None), getattr(o, "gpu_memory", None)
    if not gpus:
        return "-"
    return f"{gpus}x {gpu or '?'}" + (f" {mem / 1024**3:.0f}G" if mem else "")


def _price(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.4g}"


@click.group("offers", invoke_without_command=True)
@click.option("--gpu", default=None, help="GPU model (prefix, case-insensitive), e.g. A100, H100.")
@click.option("--gpus", type=int, default=0, help="At least this many GPUs.")
@click.option("--memory", default=None, help="At least this much memory, e.g. 64GiB.")
@click.option("--cpus", type=int, default=None, help="At least this many vCPUs.")
@click.option("--arch", default=None, help="x86_64 or arm64.")
@click.option("--spot/--on-demand", "spot", default=None,
              help="Only offers with a spot price (sorted by it) / sort by on-demand price.")
@click.option("--provider", default=None, help="Only this provider (aws, gcp, azure, lambda, runpod, local).")
@click.option("--workspace", "-w", default=None,
              help="Say whether each spot notice is long enough to save this workspace's state.")
@click.option("--limit", type=int, default=40, show_default=True, help="Rows to show (0: all).")
@repo_option
@json_option
@click.pass_context
def offers_cmd(ctx: click.Context, gpu: str | None, gpus: int, memory: str | None, cpus: int | None,
               arch: str | None, spot: bool | None, provider: str | None, workspace: str | None, limit: int,
               repo: str | None, as_json: bool) -> None:
    """Machines that fit, cheapest first, from the price catalog and the repository's machines.

    `sojourn offers refresh` fetches new prices from public sources.
    """
    if ctx.invoked_subcommand is not None:
        return
    from sojourn.ops import offers as ops_offers
    from sojourn.providers.base import Requirements
    from sojourn.providers.catalog import NOTE_TEXT
    from sojourn.workspace.sessions import parse_size

    req = Requirements(memory=parse_size(memory), cpus=cpus, gpus=gpus, gpu=gpu, arch=arch, spot=spot,
                       provider=provider)
    t = ops_offers.offers(req, repo=repo, workspace=workspace)
    if as_json:
        emit_json(t.to_json())
        return
    rows = t.rows if limit <= 0 else t.rows[:limit]
    cols = ["OFFER", "GPU", "CPUS", "MEMORY", "ARCH", "REGION", "$/H", "SPOT $/H", "NOTICE"]
    if t.save_s is not None:
        cols.append("SAVES?")
    cols.append("NOTES")
    seen: set[str] = set()
    out = []
    for r in rows:
        o = r.offer
        notice = r.spot.notice_s if r.spot else None
        line = [r.ref.removesuffix(":spot"), _gpu(o), o.cpus or "-", human_size(o.memory) if o.memory else "?",
                o.arch, o.region or "-", _price(r.on_demand.price if r.on_demand else None),
                _price(r.spot.price if r.spot else None),
                "-" if r.spot is None else (f"{notice:.0f}s" if notice is not None else "?")]
        if t.save_s is not None:
            line.append({True: "yes", False: "NO", None: "?"}[r.can_save] if r.spot else "-")
        line.append(",".join(r.notes) or "")
        seen.update(r.notes)
        out.append(line)
    table(t.caption, cols, out)
    if len(rows) < len(t.rows):
        click.echo(f"({len(t.rows) - len(rows)} more; --limit 0 shows all)")
    if t.save_s is not None:
        click.echo(f"SAVES?: the spot notice covers saving workspace {t.workspace} in about {t.save_s:.0f} s "
                   f"({t.save_basis})")
    for n in sorted(seen):
        click.echo(f"{n}: {NOTE_TEXT.get(n, n)}")
    if not t.rows:
        click.echo("no offer fits; loosen the requirements or try --provider / without --spot", err=True)


@offers_cmd.command("refresh")
@click.option("--source", type=click.Choice(["skypilot", "aws", "azure"]), default="skypilot", show_default=True,
              help="skypilot: the SkyPilot catalog (every provider); aws: the AWS Price List bulk API and "
                   "spot feed; azure: the Azure Retail Prices API.")
@click.option("--provider", "providers", multiple=True, help="Refresh only this provider's rows (repeatable).")
@json_option
def refresh_cmd(source: str, providers: tuple[str, ...], as_json: bool) -> None:
    """Fetch current list prices for the catalog's machines from public sources."""
    from sojourn.ops import offers as ops_offers

    res = ops_offers.refresh(source, providers=list(providers) or None)
    if as_json:
        emit_json(res.to_json())
        return
    rep = res.report
    click.echo(f"refreshed {len(rep.updated)} of {res.rows} rows from {source} (dated {rep.date}); "
               f"{len(rep.changed)} price(s) changed; written to {res.path}")
    for name, old, new in rep.changed[:20]:
        click.echo(f"  {name}: {_price(old)} -> {_price(new)} $/h")
    if rep.missing:
        click.echo(f"no price found for {len(rep.missing)} row(s) (kept, marked not-refreshed): "
                   f"{', '.join(rep.missing[:8])}{' ...' if len(rep.missing) > 8 else ''}")


@click.command("plan")
@click.argument("workspace")
@click.option("--to", "to", required=True, help="The offer, as `sojourn offers` names it (provider:name).")
@click.option("--remaining", default=None, help="Compute time left, e.g. 2h or 90m (default: the record's "
                                                "estimate, else 1 h, said so).")
@repo_option
@json_option
def plan_cmd(workspace: str, to: str, remaining: str | None, repo: str | None, as_json: bool) -> None:
    """What carrying WORKSPACE on to the offer TO would cost, term by term. Changes nothing."""
    from sojourn.ops import offers as ops_offers

    res = ops_offers.plan(workspace, to, repo=repo, remaining=remaining)
    if as_json:
        emit_json(res.to_json())
        return
    click.echo(res.explain())


def register(cli: click.Group) -> None:
    cli.add_command(offers_cmd)
    cli.add_command(plan_cmd)
