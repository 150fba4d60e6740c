"""``sojourn offers refresh``: the parsers against saved payloads in each source's real
format (tests/providers/test_catalog_samples/), the refresh on a fake network, and the
message when the network cannot be reached."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from sojourn.ops import offers as ops_offers
from sojourn.providers import catalog as C
from sojourn.providers import catalog_fetch as F
from tests.conftest import SRC

SAMPLES = Path(__file__).parent / "test_catalog_samples"


def lines(name: str) -> list[str]:
    return (SAMPLES / name).read_text().splitlines(keepends=True)


def test_skypilot_aws_min_spot_over_zones_and_empty_prices() -> None:
    sky = F.parse_skypilot(lines("skypilot_aws_vms.csv"), "aws")
    assert sky.machines[("us-east-1", "g5.xlarge")] == (1.006, 0.399)  # the cheapest zone; an empty one ignored
    assert sky.machines[("us-east-1", "m7i.large")] == (0.1008, 0.0316)
    assert sky.machines[("eu-west-1", "m7i.large")] == (0.11235, 0.0492)
    assert sky.machines[("us-east-1", "mac1.metal")] == (None, None)


def test_skypilot_gcp_composes_host_and_gpus() -> None:
    sky = F.parse_skypilot(lines("skypilot_gcp_vms.csv"), "gcp")
    assert ("us-central2", "tpu-v6e-1") not in sky.machines
    assert sky.accelerators.get(("us-central2", "tpu-v6e-1", 1)) == (None, None)  # 700.0 placeholder dropped
    row = C.CatalogRow("gcp", "us-central1", "a2-highgpu-1g", 12, 85, "A100", 1, 40, "x86_64", 1.0, 1.0, 30)
    assert F.skypilot_prices(row, sky) == (pytest.approx(0.73948 + 2.93391), pytest.approx(0.29576 + 1.1472))
    row8 = C.CatalogRow("gcp", "us-central1", "a2-highgpu-8g", 96, 680, "A100", 8, 40, "x86_64", 1.0, 1.0, 30)
    assert F.skypilot_prices(row8, sky)[0] == pytest.approx(5.91582 + 23.47128)  # type: ignore[index]
    # no 4-GPU row: the one-GPU price times the count
    t4 = C.CatalogRow("gcp", "us-central1", "n1-standard-4", 4, 15, "T4", 1, 16, "x86_64", 1.0, 1.0, 30)
    assert F.skypilot_prices(t4, sky)[0] == pytest.approx(0.19 + 0.35)  # type: ignore[index]
    t4x4 = C.CatalogRow("gcp", "us-central1", "n1-standard-4", 4, 15, "T4", 4, 16, "x86_64", 1.0, 1.0, 30)
    assert F.skypilot_prices(t4x4, sky)[0] == pytest.approx(0.19 + 4 * 0.35)  # type: ignore[index]


def test_skypilot_runpod_spot_column_first() -> None:
    sky = F.parse_skypilot(lines("skypilot_runpod_vms.csv"), "runpod")
    assert sky.machines[("US", "1x_A100-80GB_SECURE")] == (1.64, 1.19)
    assert sky.machines[("US", "1x_H100_SECURE")] == (2.39, None)


def test_aws_offer_file_keeps_only_linux_shared_on_demand() -> None:
    prices, published = F.parse_aws_offer_csv(lines("aws_offer_us-east-1.csv"))
    assert published == "2026-11-20T18:13:31Z"
    assert prices == {("us-east-1", "g5.xlarge"): (1.006, None), ("us-east-1", "m7i.large"): (0.098, None)}
    only, _ = F.parse_aws_offer_csv(lines("aws_offer_us-east-1.csv"), {"m7i.large"})
    assert list(only) == [("us-east-1", "m7i.large")]
    with pytest.raises(C.CatalogError, match="not an AWS offer file"):
        F.parse_aws_offer_csv(["<html>nope</html>\n"] * 20)


def test_aws_spot_feed_js_and_json() -> None:
    text = (SAMPLES / "aws_spot.js").read_text()
    spot = F.parse_aws_spot(text)
    assert spot[("us-east-1", "m7i.large")] == (None, 0.0297)  # the feed's old name for us-east-1
    assert spot[("us-east-1", "g5.xlarge")] == (None, 0.4012)
    assert spot[("eu-west-1", "m7i.large")] == (None, 0.0501)
    as_json = text[text.index("(") + 1: text.rindex(")")]
    assert F.parse_aws_spot(as_json) == spot
    with pytest.raises(C.CatalogError, match="spot price feed"):
        F.parse_aws_spot('{"nothing": 1}')


def test_azure_pages() -> None:
    page1, nxt = F.parse_azure_page(json.loads((SAMPLES / "azure_page1.json").read_text()))
    assert page1 == {("eastus", "Standard_D2s_v5"): (0.096, 0.0111)}  # Windows, Low Priority, DevTest left out
    assert nxt and "$skip=100" in nxt
    page2, nxt2 = F.parse_azure_page(json.loads((SAMPLES / "azure_page2.json").read_text()))
    assert page2 == {("eastus", "Standard_NC4as_T4_v3"): (0.526, 0.0631)} and nxt2 is None
    url = F.azure_url("eastus")
    assert url.startswith(F.AZURE_URL) and "armRegionName eq 'eastus'" in urllib.parse.unquote_plus(url)


class FakeNet:
    """Serves the saved payloads by URL, as the public sources would."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, url: str) -> io.BytesIO:
        self.asked.append(url)
        if url.startswith("https://raw.githubusercontent.com/skypilot-org/"):
            cloud = url.split("/catalogs/v7/")[1].split("/")[0]
            name = SAMPLES / f"skypilot_{cloud}_vms.csv"
            return io.BytesIO(name.read_bytes() if name.exists() else b"InstanceType,Price,SpotPrice,Region\n")
        if url.startswith("https://pricing.us-east-1.amazonaws.com/"):
            region = url.split("/current/")[1].split("/")[0]
            name = SAMPLES / f"aws_offer_{region}.csv"
            if not name.exists():
                raise C.CatalogError(f"cannot fetch {url} (HTTP Error 404)")
            return io.BytesIO(name.read_bytes())
        if url == F.AWS_SPOT_URL:
            return io.BytesIO((SAMPLES / "aws_spot.js").read_bytes())
        if url.startswith("https://prices.azure.com") and "$skip=100" in urllib.parse.unquote(url):
            return io.BytesIO((SAMPLES / "azure_page2.json").read_bytes())
        if url.startswith(F.AZURE_URL):
            return io.BytesIO((SAMPLES / "azure_page1.json").read_bytes())
        raise AssertionError(f"unexpected URL {url}")


def small_catalog() -> C.Catalog:
    cat = C.load(C.shipped_path())
    keep = {("aws", "g5.xlarge@us-east-1"), ("aws", "m7i.large@us-east-1"), ("aws", "m7i.large@eu-west-1"),
            ("gcp", "a2-highgpu-1g@us-central1"), ("azure", "Standard_D2s_v5@eastus"),
            ("azure", "Standard_NC4as_T4_v3@eastus"), ("azure", "Standard_D4s_v5@eastus"),
            ("runpod", "1x_H100_SECURE@US"), ("lambda", "gpu_1x_a100@us-east-1")}
    return C.Catalog([r for r in cat.rows if (r.provider, r.name) in keep], dict(cat.meta), list(cat.header), "x")


def test_refresh_skypilot_reprices_rows_and_dates_the_catalog() -> None:
    net = FakeNet()
    new, rep = F.refresh(small_catalog(), "skypilot", "2026-11-30", opener=net)
    rows = {(r.provider, r.name): r for r in new.rows}
    assert rows[("aws", "g5.xlarge@us-east-1")].spot_price == 0.399
    assert rows[("gcp", "a2-highgpu-1g@us-central1")].price == pytest.approx(3.67339)
    assert "gpu-price-unverified" in rows[("gcp", "a2-highgpu-1g@us-central1")].notes  # curated notes stay
    assert rows[("runpod", "1x_H100_SECURE@US")].price == 2.39
    # no azure/lambda sample rows: kept, marked
    assert "not-refreshed" in rows[("lambda", "gpu_1x_a100@us-east-1")].notes
    assert "lambda:gpu_1x_a100@us-east-1" in rep.missing
    assert new.date == "2026-11-30" and new.meta["curated"].startswith("2026-11-30")
    assert any("aws/vms.csv" in u for u in rep.urls)
    reparsed = C.parse(C.dump(new))
    assert reparsed.date == "2026-11-30" and reparsed.rows == new.rows


def test_refresh_aws_native() -> None:
    cat = small_catalog()
    us = C.Catalog([r for r in cat.rows if r.region != "eu-west-1"], cat.meta, cat.header, "x")
    new, rep = F.refresh(us, "aws", "2026-11-30", opener=FakeNet())
    rows = {(r.provider, r.name): r for r in new.rows}
    g5 = rows[("aws", "g5.xlarge@us-east-1")]
    assert (g5.price, g5.spot_price, g5.source) == (1.006, 0.4012, "aws@2026-11-30")
    m7 = rows[("aws", "m7i.large@us-east-1")]
    assert (m7.price, m7.spot_price) == (0.098, 0.0297)
    assert "aws:m7i.large@us-east-1" in [c[0] for c in rep.changed]
    assert rows[("azure", "Standard_D2s_v5@eastus")] == next(r for r in us.rows if r.name == "Standard_D2s_v5@eastus")
    # a region whose offer file cannot be fetched fails the refresh as a whole: nothing half-priced
    with pytest.raises(C.CatalogError, match="eu-west-1"):
        F.refresh(cat, "aws", "2026-11-30", opener=FakeNet())


def test_refresh_azure_follows_pages() -> None:
    net = FakeNet()
    new, rep = F.refresh(small_catalog(), "azure", "2026-11-30", opener=net)
    rows = {(r.provider, r.name): r for r in new.rows}
    assert (rows[("azure", "Standard_D2s_v5@eastus")].price, rows[("azure", "Standard_D2s_v5@eastus")].spot_price) \
        == (0.096, 0.0111)
    assert rows[("azure", "Standard_NC4as_T4_v3@eastus")].spot_price == 0.0631  # from page 2
    assert rep.missing == ["azure:Standard_D4s_v5@eastus"]
    assert len([u for u in net.asked if u.startswith("https://prices.azure.com")]) == 2


def test_refresh_unknown_source_and_provider() -> None:
    with pytest.raises(C.CatalogError, match="unknown price source"):
        F.refresh(small_catalog(), "oracle", "2026-11-30", opener=FakeNet())
    with pytest.raises(C.CatalogError, match="prices none"):
        F.refresh(small_catalog(), "azure", "2026-11-30", providers=["aws"], opener=FakeNet())


def test_ops_refresh_writes_the_user_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "cache" / "offers.csv"
    monkeypatch.setenv("SOJOURN_CATALOG", str(target))
    res = ops_offers.refresh("skypilot", providers=["gcp"], opener=FakeNet(), today="2026-11-30")
    assert Path(res.path) == target and res.rows == 134
    t = ops_offers.offers(include_local=False)
    assert t.catalog_date == "2026-11-30" and "2026-11-30" in t.caption and str(target) in t.caption


def test_offline_refresh_says_so(tmp_path: Path) -> None:
    """The real fetcher against an address that cannot answer: a clear error, exit code 2,
    and the catalog in use untouched."""
    env = dict(os.environ, PYTHONPATH=str(SRC), SOJOURN_CATALOG=str(tmp_path / "offers.csv"),
               HTTPS_PROXY="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, "-m", "sojourn.cli.main", "offers", "refresh", "--provider", "lambda"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "cannot fetch https://raw.githubusercontent.com/" in proc.stderr
    assert "catalog in use is unchanged" in proc.stderr
    assert not (tmp_path / "offers.csv").exists()
