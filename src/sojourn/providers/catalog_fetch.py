"""``sojourn offers refresh``: new prices for the catalog's rows, from public sources.

Sources (each one a fetcher plus a parser for its documented public format):

- ``skypilot`` (default, every provider): the SkyPilot catalog's ``vms.csv`` per cloud
  (``InstanceType, vCPUs, MemoryGiB, AcceleratorName, AcceleratorCount, GpuInfo, Price,
  SpotPrice, Region, AvailabilityZone``; column order varies per cloud). The curation rules of
  the shipped snapshot apply: AWS spot is the minimum over the region's zones; a GCP GPU
  machine is its host row plus its accelerator row; GCP's 700.0 placeholder and empty prices
  are ignored.
- ``aws``: the AWS Price List bulk API's regional EC2 offer file (CSV: five metadata lines,
  then a header; on-demand, shared tenancy, Linux, no pre-installed software, ``Used``
  capacity) for on-demand prices, and the public spot price feed (``spot.json``, the data
  behind the EC2 spot pricing page) for spot prices. The offer file is large (hundreds of MB
  per region); it is read as a stream.
- ``azure``: the Azure Retail Prices API (JSON pages of ``Items`` with ``NextPageLink``;
  ``Consumption`` meters of Virtual Machines, Linux; ``… Spot`` meters are spot prices).

GCP's own price source (the Cloud Billing Catalog API) needs an API key and prices cores,
memory and GPUs separately; GCP rows are refreshed from the ``skypilot`` source.

A refresh only re-prices the rows the catalog already has (the curated selection stays);
rows a source has no price for keep their old price and get the ``not-refreshed`` note.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import IO, Any

from sojourn.providers.catalog import Catalog, CatalogError, CatalogRow

Opener = Callable[[str], IO[bytes]]
Prices = dict[tuple[str, str], tuple[float | None, float | None]]  # (region, type) -> (on-demand, spot)

SKYPILOT_URL = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs/v7/{cloud}/vms.csv"
AWS_OFFER_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.csv"
AWS_SPOT_URL = "https://website.spot.ec2.aws.a2z.com/spot.json"
AZURE_URL = "https://prices.azure.com/api/retail/prices"
SOURCES = {"skypilot": ("aws", "gcp", "azure", "lambda", "runpod"), "aws": ("aws",), "azure": ("azure",)}
PLACEHOLDER = 700.0  # GCP's catalog writes 700.0 where it has no price

LEGEND = [
    "# notice: preempt_notice_s is a per-provider constant (aws 120, gcp 30, azure 30), not catalog data",
    "# notes column: gpu-price-unverified, spot-price-doubtful, memory-unknown, gpu-count-corrected,",
    "#   old-price, spot-single-az, not-refreshed (see sojourn.providers.catalog.NOTE_TEXT)",
]


def urlopen(url: str) -> IO[bytes]:
    req = urllib.request.Request(url, headers={"User-Agent": "sojourn-offers-refresh"})
    try:
        return urllib.request.urlopen(req, timeout=60)  # type: ignore[no-any-return]
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CatalogError(f"cannot fetch {url} ({reason}). `sojourn offers refresh` needs to reach the "
                           "public price sources; the catalog in use is unchanged") from e


def _text(stream: IO[bytes]) -> Iterator[str]:
    return codecs.iterdecode(stream, "utf-8-sig")


def _num(v: Any) -> float | None:
    try:
        x = float(str(v).strip())
    except (TypeError, ValueError):
        return None
    return x if x == x and x > 0 else None


# -- SkyPilot catalog ----------------------------------------------------------------------


@dataclass
class SkyRows:
    """One cloud's SkyPilot ``vms.csv``, folded per (region, type) and per (region, accelerator, count)."""

    machines: Prices = field(default_factory=dict)
    accelerators: dict[tuple[str, str, int], tuple[float | None, float | None]] = field(default_factory=dict)


def parse_skypilot(lines: Iterable[str], cloud: str) -> SkyRows:
    out = SkyRows()
    spot_min: dict[tuple[str, str], float] = {}
    for r in csv.DictReader(lines):
        itype = (r.get("InstanceType") or "").strip()
        region = (r.get("Region") or "").strip()
        price, spot = _num(r.get("Price")), _num(r.get("SpotPrice"))
        if cloud == "gcp":
            # Exactly 700.0 is the placeholder; TPU pods legitimately cost more.
            price = None if price == PLACEHOLDER else price
            spot = None if spot == PLACEHOLDER else spot
        if not region:
            continue
        if not itype:  # a GCP accelerator row: priced apart from its host
            acc = (r.get("AcceleratorName") or "").strip()
            count = int(_num(r.get("AcceleratorCount")) or 0)
            if acc and count:
                out.accelerators.setdefault((region, acc, count), (price, spot))
            continue
        key = (region, itype)
        old_price, _ = out.machines.get(key, (None, None))
        if spot is not None:
            spot_min[key] = min(spot, spot_min.get(key, spot))
        out.machines[key] = (old_price if old_price is not None else price, spot_min.get(key))
    return out


def skypilot_prices(row: CatalogRow, sky: SkyRows) -> tuple[float | None, float | None] | None:
    """The row's (on-demand, spot) prices in ``sky``; GCP GPU machines composed host + GPUs."""
    host = sky.machines.get((row.region, row.instance_type))
    if host is None:
        return None
    if row.provider != "gcp" or not row.gpu_model or not row.gpu_count:
        return host
    acc = sky.accelerators.get((row.region, row.gpu_model, row.gpu_count))
    scale = 1
    if acc is None:  # priced per GPU only: scale the one-GPU row
        acc, scale = sky.accelerators.get((row.region, row.gpu_model, 1)), row.gpu_count
    if acc is None:
        return None

    def add(h: float | None, g: float | None) -> float | None:
        return None if h is None or g is None else round(h + g * scale, 5)

    return add(host[0], acc[0]), add(host[1], acc[1])


# -- AWS -----------------------------------------------------------------------------------


def parse_aws_offer_csv(lines: Iterable[str], wanted: set[str] | None = None) -> tuple[Prices, str | None]:
    """On-demand Linux prices from an AWS EC2 regional offer file; also its publication date."""
    it = iter(lines)
    published = None
    preamble = []
    for line in it:
        cells = next(csv.reader([line]), [])
        if cells and cells[0] == "Publication Date" and len(cells) > 1:
            published = cells[1]
        if cells and cells[0] == "SKU":
            header = cells
            break
        preamble.append(line)
        if len(preamble) > 10:
            raise CatalogError("not an AWS offer file: no header row within the first lines")
    else:
        raise CatalogError("not an AWS offer file: no header row")
    prices: Prices = {}
    for r in csv.DictReader(it, fieldnames=header):
        itype = r.get("Instance Type") or ""
        if wanted is not None and itype not in wanted:
            continue
        if (r.get("TermType") != "OnDemand" or r.get("Unit") != "Hrs" or r.get("Tenancy") != "Shared"
                or r.get("Operating System") != "Linux" or r.get("Pre Installed S/W", "NA") != "NA"
                or r.get("CapacityStatus", "Used") != "Used" or r.get("operation", "RunInstances") != "RunInstances"):
            continue
        price = _num(r.get("PricePerUnit"))
        region = r.get("Region Code") or ""
        if price is not None and region:
            prices[(region, itype)] = (price, None)
    return prices, published


# The feed names a few regions the way the old pricing pages did.
_AWS_SPOT_REGIONS = {"us-east": "us-east-1", "us-west": "us-west-1", "eu-ireland": "eu-west-1",
                     "apac-sin": "ap-southeast-1", "apac-syd": "ap-southeast-2", "apac-tokyo": "ap-northeast-1"}


def parse_aws_spot(text: str) -> Prices:
    """Linux spot prices from the public feed (``spot.json``, or ``spot.js`` in a ``callback(...)``)."""
    body = text.strip()
    if not body.startswith("{"):
        body = body[body.index("(") + 1: body.rindex(")")]
    try:
        doc = json.loads(body)
        regions = doc["config"]["regions"]
    except (ValueError, KeyError, TypeError) as e:
        raise CatalogError(f"not an AWS spot price feed: {e}") from e
    out: Prices = {}
    for reg in regions:
        region = _AWS_SPOT_REGIONS.get(reg.get("region", ""), reg.get("region", ""))
        for family in reg.get("instanceTypes", []):
            for sz in family.get("sizes", []):
                for col in sz.get("valueColumns", []):
                    if col.get("name") == "linux":
                        spot = _num((col.get("prices") or {}).get("USD"))
                        if spot is not None:
                            out[(region, sz["size"])] = (None, spot)
    return out


# -- Azure ---------------------------------------------------------------------------------


def parse_azure_page(doc: dict[str, Any]) -> tuple[Prices, str | None]:
    """(on-demand, spot) Linux prices from one Azure Retail Prices page, and the next page's URL."""
    out: Prices = {}
    for item in doc.get("Items", []):
        if (item.get("serviceName") != "Virtual Machines" or item.get("type") != "Consumption"
                or item.get("unitOfMeasure") != "1 Hour" or item.get("currencyCode", "USD") != "USD"
                or str(item.get("productName", "")).endswith("Windows")):
            continue
        meter = str(item.get("meterName", ""))
        if "Low Priority" in meter:
            continue
        key = (str(item.get("armRegionName", "")), str(item.get("armSkuName", "")))
        price = _num(item.get("retailPrice"))
        if not key[1] or price is None:
            continue
        od, spot = out.get(key, (None, None))
        if meter.endswith(" Spot"):
            spot = price
        else:
            od = price
        out[key] = (od, spot)
    return out, doc.get("NextPageLink") or None


def azure_url(region: str) -> str:
    flt = f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'"
    return f"{AZURE_URL}?{urllib.parse.urlencode({'$filter': flt})}"


# -- refresh -------------------------------------------------------------------------------


@dataclass
class RefreshReport:
    source: str
    date: str
    updated: list[str] = field(default_factory=list)  # provider:name
    changed: list[tuple[str, float | None, float | None]] = field(default_factory=list)  # name, old, new
    missing: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "date": self.date, "updated": len(self.updated),
                "changed": [{"offer": n, "old": o, "new": w} for n, o, w in self.changed],
                "missing": self.missing, "urls": self.urls}


def refresh(cat: Catalog, source: str, today: str, *, providers: Iterable[str] | None = None,
            opener: Opener = urlopen, max_pages: int = 200) -> tuple[Catalog, RefreshReport]:
    """New prices for ``cat``'s rows from ``source``; ``today`` (YYYY-MM-DD) dates the result."""
    if source not in SOURCES:
        raise CatalogError(f"unknown price source {source!r}; known: {', '.join(SOURCES)}")
    wanted = set(providers or SOURCES[source]) & set(SOURCES[source]) & {r.provider for r in cat.rows}
    if not wanted:
        raise CatalogError(f"source {source} prices none of the requested providers "
                           f"(it covers {', '.join(SOURCES[source])})")
    rep = RefreshReport(source, today)
    lookup = _fetch(cat, source, wanted, opener, rep, max_pages)
    rows = []
    for row in cat.rows:
        if row.provider not in wanted:
            rows.append(row)
            continue
        got = lookup(row)
        ref = f"{row.provider}:{row.name}"
        notes = [n for n in row.notes if n != "not-refreshed"]
        if got is None or got[0] is None:
            rep.missing.append(ref)
            rows.append(replace(row, notes=(*notes, "not-refreshed")))
            continue
        price, spot = got
        if spot is not None and price is not None and spot >= price and "spot-price-doubtful" not in notes:
            notes.append("spot-price-doubtful")
        if (price, spot) != (row.price, row.spot_price):
            rep.changed.append((ref, row.price, price))
        rep.updated.append(ref)
        rows.append(replace(row, price=price, spot_price=spot, notes=tuple(notes), source=f"{source}@{today}"))
    header = [
        "# sojourn offer catalog: curated list prices of cloud machines (USD per hour). Not quotes.",
        f"# source: {source} refresh ({', '.join(sorted(wanted))}); other rows as before: {cat.source}",
        f"# date: {today} (fetched by `sojourn offers refresh`; the prices of rows not refreshed are older)",
        *[line for line in cat.header if line.startswith("# curated:")],
        *[f"#   {u}" for u in rep.urls[:20]],
        *LEGEND,
    ]
    return Catalog(rows, {"source": f"{source} refresh", "date": today,
                          **({"curated": cat.meta["curated"]} if "curated" in cat.meta else {})}, header, ""), rep


def _fetch(cat: Catalog, source: str, wanted: set[str], opener: Opener, rep: RefreshReport,
           max_pages: int) -> Callable[[CatalogRow], tuple[float | None, float | None] | None]:
    rows = [r for r in cat.rows if r.provider in wanted]
    if source == "skypilot":
        sky: dict[str, SkyRows] = {}
        for cloud in sorted(wanted):
            sky_url = SKYPILOT_URL.format(cloud=cloud)
            rep.urls.append(sky_url)
            with opener(sky_url) as f:
                sky[cloud] = parse_skypilot(_text(f), cloud)
        return lambda row: skypilot_prices(row, sky[row.provider])
    if source == "aws":
        types = {r.instance_type for r in rows}
        prices: Prices = {}
        for region in sorted({r.region for r in rows}):
            offer_url = AWS_OFFER_URL.format(region=region)
            rep.urls.append(offer_url)
            with opener(offer_url) as f:
                got, _published = parse_aws_offer_csv(_text(f), types)
            prices.update(got)
        rep.urls.append(AWS_SPOT_URL)
        with opener(AWS_SPOT_URL) as f:
            spots = parse_aws_spot(f.read().decode("utf-8"))

        def aws(row: CatalogRow) -> tuple[float | None, float | None] | None:
            od = prices.get((row.region, row.instance_type))
            sp = spots.get((row.region, row.instance_type))
            return None if od is None else (od[0], sp[1] if sp else None)

        return aws
    azure: Prices = {}
    for region in sorted({r.region for r in rows}):
        url: str | None = azure_url(region)
        pages = 0
        while url and pages < max_pages:
            if pages == 0:
                rep.urls.append(url)
            with opener(url) as f:
                page, url = parse_azure_page(json.load(io.TextIOWrapper(f, encoding="utf-8")))
            for k, (od, sp) in page.items():
                old = azure.get(k, (None, None))
                azure[k] = (od if od is not None else old[0], sp if sp is not None else old[1])
            pages += 1
    return lambda row: azure.get((row.region, row.instance_type))
