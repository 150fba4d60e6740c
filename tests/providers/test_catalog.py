"""The shipped price catalog: what it holds, the caveats applied to it, filtering and sorting
of offers (catalog and local machines together), and the launch checks."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sojourn.ops import offers as ops_offers
from sojourn.providers import catalog as C
from sojourn.providers.base import Handle, LaunchFailed, LaunchSpec, Offer, Requirements
from sojourn.providers.checks import CHECKS, launch_checked
from tests.conftest import SRC


def test_shipped_catalog_rows_providers_date() -> None:
    cat = C.load(C.shipped_path())
    assert len(cat.rows) == 134
    assert cat.providers() == ["aws", "azure", "gcp", "lambda", "runpod"]
    assert sum(1 for r in cat.rows if r.gpu_count) == 80
    assert cat.date == "unknown"  # the source commits carry no date; the catalog says so
    assert cat.meta["curated"].startswith("2026-11-30")
    caption = cat.caption()
    assert "prices dated unknown" in caption and "not quotes" in caption
    names = [(r.provider, r.name) for r in cat.rows]
    assert len(names) == len(set(names))


def test_shipped_catalog_caveats_applied() -> None:
    cat = C.load(C.shipped_path())
    rows = {(r.provider, r.instance_type, r.region): r for r in cat.rows}
    # RunPod's MemoryGiB is GPU memory: dropped, so a --memory requirement never picks it.
    assert all(r.memory_gib is None and "memory-unknown" in r.notes for r in cat.rows if r.provider == "runpod")
    assert rows[("azure", "Standard_ND96isr_H100_v5", "eastus")].gpu_count == 8
    assert all("gpu-price-unverified" in r.notes for r in cat.rows if r.provider == "gcp" and r.gpu_count)
    assert "spot-price-doubtful" in rows[("azure", "Standard_NC40ads_H100_v5", "eastus")].notes
    assert all(r.spot_price is None for r in cat.rows if r.provider == "lambda")
    assert all(r.price is not None and r.price < 700 for r in cat.rows)  # no placeholder, no empty price
    notice = {r.provider: r.notice_s for r in cat.rows}
    assert notice["aws"] == 120 and notice["gcp"] == 30 and notice["azure"] == 30
    assert notice["lambda"] is None and notice["runpod"] is None
    # the GCP GPU composition: host + accelerator
    assert rows[("gcp", "a2-highgpu-1g", "us-central1")].price == pytest.approx(0.73948 + 2.93391)


def test_rows_give_on_demand_and_spot_offers() -> None:
    cat = C.load(C.shipped_path())
    od = cat.find("aws", "p4d.24xlarge@us-east-1")
    sp = cat.find("aws", "p4d.24xlarge@us-east-1:spot")
    assert od is not None and sp is not None
    assert (od.spot, od.price, od.notice_s) == (False, 32.7726, None)
    assert (sp.spot, sp.price, sp.notice_s) == (True, 5.0933, 120)
    assert od.gpus == 8 and od.gpu == "A100" and od.gpu_memory == 40 * C.GIB and od.memory == 1152 * C.GIB
    assert cat.find("lambda", "gpu_1x_a100@us-east-1:spot") is None  # no spot price, no spot offer


def test_filtering() -> None:
    cat = C.load(C.shipped_path())
    a100 = cat.offers(Requirements(gpu="a100", gpus=8))
    assert a100 and all(o.gpu and o.gpu.upper().startswith("A100") and o.gpus >= 8 for o in a100)
    arm = cat.offers(Requirements(arch="aarch64", memory=64 * C.GIB, spot=False))
    assert arm and all(o.arch == "arm64" and (o.memory or 0) >= 64 * C.GIB and not o.spot for o in arm)
    spot = cat.offers(Requirements(spot=True, provider="gcp"))
    assert spot and all(o.spot and o.provider == "gcp" for o in spot)
    assert not cat.offers(Requirements(provider="runpod", memory=1))  # memory unknown never fits
    assert not cat.offers(Requirements(gpu="H100", gpus=16))


def test_offers_table_sorting_and_filters() -> None:
    t = ops_offers.offers(Requirements(gpu="A100"), include_local=False)
    prices = [r.sort_price for r in t.rows]
    assert prices == sorted(prices) and len(prices) > 5
    for r in t.rows:  # the default sorts by the cheaper of the two prices
        assert r.sort_price == min(x.price for x in (r.on_demand, r.spot) if x is not None)
    spot = ops_offers.offers(Requirements(gpu="A100", spot=True), include_local=False)
    assert spot.rows and all(r.spot is not None and r.sort_price == r.spot.price for r in spot.rows)
    assert [r.sort_price for r in spot.rows] == sorted(r.sort_price for r in spot.rows)
    od = ops_offers.offers(Requirements(gpu="A100", spot=False), include_local=False)
    assert all(r.on_demand is not None and r.sort_price == r.on_demand.price for r in od.rows)
    # lambda has no spot: listed on-demand, left out of --spot
    assert any(r.offer.provider == "lambda" for r in od.rows)
    assert not any(r.offer.provider == "lambda" for r in spot.rows)
    assert "prices dated unknown" in t.caption and t.catalog_date == "unknown"


def test_local_machines_are_offers(repo: str, tmp_path: Path) -> None:
    from sojourn.providers.machines import parse_config, save_machines
    from sojourn.repository.repo import open_repository

    r = open_repository(repo, create=True)
    try:
        save_machines(r, parse_config('[machines.tiny]\nmemory = "1GiB"\nprice_per_hour = 0.001\n'))
    finally:
        r.close()
    t = ops_offers.offers(Requirements(memory=512 * 1024**2), repo=repo)
    local = [row for row in t.rows if row.offer.provider == "local"]
    assert [row.offer.name for row in local] == ["tiny"]
    assert t.rows[0].offer.name == "tiny"  # the cheapest of all
    assert "machines config" in t.caption
    assert ops_offers.choose(Requirements(memory=512 * 1024**2), repo=repo).name == "tiny"
    # more memory than the machine has: the catalog answers
    assert ops_offers.choose(Requirements(memory=2 * C.GIB), repo=repo).provider != "local"


def test_parse_errors_and_roundtrip(tmp_path: Path) -> None:
    with pytest.raises(C.CatalogError, match="lacks the column"):
        C.parse("# x\nprovider,region\naws,us-east-1\n", "bad.csv")
    with pytest.raises(C.CatalogError, match=r"bad\.csv, line"):
        C.parse(",".join(C.COLUMNS) + "\naws,r,t,two,,,0,,x86_64,1,,,,\n", "bad.csv")
    cat = C.load(C.shipped_path())
    p = C.save(cat, tmp_path / "copy.csv")
    again = C.load(p)
    assert again.rows == cat.rows and again.meta == cat.meta


def test_refreshed_copy_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cat = C.load(C.shipped_path())
    mine = C.Catalog(cat.rows[:3], {"source": "test", "date": "2030-01-01"}, ["# source: test", "# date: 2030-01-01"])
    target = tmp_path / "offers.csv"
    monkeypatch.setenv("SOJOURN_CATALOG", str(target))
    assert C.load().path == str(C.shipped_path())  # nothing refreshed yet
    C.save(mine, target)
    got = C.load()
    assert got.path == str(target) and len(got.rows) == 3 and got.date == "2030-01-01"


def test_doubtful_prices_are_not_chosen_automatically() -> None:
    cat = C.load(C.shipped_path())
    gcp_gpu = cat.find("gcp", "a2-ultragpu-1g@us-central1")
    assert gcp_gpu is not None and C.doubtful(gcp_gpu)
    best = ops_offers.choose(Requirements(gpu="A100-80GB"), include_local=False)
    assert best.provider != "gcp" and not best.spot
    allowed = ops_offers.choose(Requirements(gpu="A100-80GB"), include_local=False, allow_doubtful=True)
    assert allowed.price <= best.price
    with pytest.raises(ops_offers.NoOffer, match="no offer fits"):
        ops_offers.choose(Requirements(gpu="B200"), include_local=False)


def test_import_sojourn_does_not_load_the_catalog() -> None:
    code = ("import sys, sojourn, sojourn.cli.main\n"
            "print([m for m in ('sojourn.providers.catalog', 'sojourn.router.cost', 'csv') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    loaded = json.loads(out.stdout.strip().replace("'", '"'))
    assert "sojourn.providers.catalog" not in loaded and "sojourn.router.cost" not in loaded


# -- launch checks -------------------------------------------------------------------------


class FakeProvider:
    name = "fake"

    def __init__(self, fail: str | None = None, status: str = "running"):
        self.fail, self.st = fail, status
        self.launched: list[str] = []
        self.terminated: list[str] = []
        self.offer = Offer("fake", "m1", cpus=2, memory=GIB2, price_per_hour=0.5)

    def offers(self, req: Requirements) -> list[Offer]:
        return [self.offer]

    def check_permission(self, offer: Offer) -> str:
        if self.fail == "permission":
            raise LaunchFailed("no credentials for fake (set FAKE_TOKEN)", "permission")
        return "token ok"

    def check_capacity(self, offer: Offer) -> str:
        if self.fail == "capacity":
            raise LaunchFailed("no m1 free in this region", "capacity")
        return "3 free"

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        if self.fail == "launch-capacity":
            raise LaunchFailed("InsufficientInstanceCapacity", "capacity")
        self.launched.append(spec.allocation)
        return Handle("fake", offer.name, spec.allocation, {"pid": 1})

    def status(self, handle: Handle) -> str:
        return self.st

    def terminate(self, handle: Handle) -> None:
        self.terminated.append(handle.allocation)


GIB2 = 2 * 1024**3
SPEC = LaunchSpec("ws_1", "al_1", ["true"])


def test_launch_checks_all_pass() -> None:
    p = FakeProvider()
    out = launch_checked(p, p.offer, SPEC)
    assert out.ok and out.handle is not None and [r.check for r in out.results] == list(CHECKS)
    assert all(r.outcome == "passed" for r in out.results)
    evs = out.events("ws_1", "al_1")
    assert [e["type"] for e in evs] == ["launch-check"] * 4
    assert evs[1]["detail"] == "token ok" and evs[0]["offer"] == "m1" and evs[0]["workspace"] == "ws_1"


@pytest.mark.parametrize("fail,check", [("permission", "permission"), ("capacity", "capacity"),
                                        ("launch-capacity", "capacity")])
def test_launch_checks_stop_at_the_failing_one(fail: str, check: str) -> None:
    p = FakeProvider(fail)
    out = launch_checked(p, p.offer, SPEC)
    assert not out.ok and out.failed is not None and out.failed.check == check
    outcomes = [r.outcome for r in out.results]
    assert outcomes[-1] in ("failed", "not-run") and "failed" in outcomes
    assert outcomes.index("failed") == len([r for r in out.results if r.outcome == "passed"])
    with pytest.raises(LaunchFailed) as e:
        out.raise_for_failure()
    assert e.value.check == check
    assert not p.launched or fail == "launch-capacity"


def test_launch_check_catalog_and_unreachable() -> None:
    p = FakeProvider()
    other = Offer("fake", "m9", price_per_hour=1.0)
    out = launch_checked(p, other, SPEC)
    assert out.failed is not None and out.failed.check == "catalog"
    assert [r.outcome for r in out.results] == ["failed", "not-run", "not-run", "not-run"]
    dead = FakeProvider(status="ended")
    out = launch_checked(dead, dead.offer, SPEC)
    assert out.failed is not None and out.failed.check == "launch" and out.handle is None
    assert dead.terminated == ["al_1"]  # a launch that does not answer is released


def test_provider_without_separate_checks_records_skipped() -> None:
    class Bare:
        name = "bare"
        offer = Offer("bare", "x", price_per_hour=0.1)

        def offers(self, req: Requirements) -> list[Offer]:
            return [self.offer]

        def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
            return Handle("bare", "x", spec.allocation)

        def status(self, handle: Handle) -> str:
            return "pending"

        def terminate(self, handle: Handle) -> None:
            pass

    out = launch_checked(Bare(), Bare.offer, SPEC)  # type: ignore[arg-type]
    assert out.ok and [r.outcome for r in out.results] == ["passed", "skipped", "skipped", "passed"]
    assert math.isfinite(sum(r.seconds for r in out.results))
