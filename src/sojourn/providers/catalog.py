"""The price catalog: cloud machine offers as data, shipped with the package.

The catalog is a small CSV (``providers/data/offers.csv``) whose ``#`` header says where the
prices came from and when. ``sojourn offers refresh`` (``catalog_fetch.py``) writes a fresh
copy to the user's cache; the newest copy wins. Every row gives two offers: on-demand and,
when the row has a spot price, spot. Nothing here is imported by ``import sojourn``: the CSV
is read on first use and kept for the life of the process.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sojourn.providers.base import Offer, ProviderError, Requirements, cheapest_first

GIB = 1024**3

COLUMNS = ["provider", "region", "instance_type", "vcpus", "memory_gib", "gpu_model", "gpu_count",
           "gpu_memory_gib", "arch", "price_on_demand_usd_h", "price_spot_usd_h", "preempt_notice_s",
           "notes", "source"]

# Notes that make a price too doubtful to spend money on without a person looking at it:
# automatic choices skip them (they are still listed, marked).
DOUBTFUL_PRICE = "gpu-price-unverified"
DOUBTFUL_SPOT = "spot-price-doubtful"

NOTE_TEXT = {
    "gpu-price-unverified": "GPU price composed from inconsistent accelerator rows; unverified",
    "spot-price-doubtful": "spot price equals on-demand; probably not a real spot price",
    "memory-unknown": "host memory unknown (the source gives GPU memory only)",
    "gpu-count-corrected": "GPU count corrected from the source to the vendor's specification",
    "old-price": "the source's prices for this provider look old",
    "spot-single-az": "spot price from a single availability zone",
    "not-refreshed": "the last refresh found no price for this row; the price is older",
}


class CatalogError(ProviderError):
    """The catalog file cannot be read; the message says which file and line."""


@dataclass(frozen=True)
class CatalogRow:
    """One machine type in one region, with both of its prices."""

    provider: str
    region: str
    instance_type: str
    vcpus: int | None
    memory_gib: float | None
    gpu_model: str | None
    gpu_count: int
    gpu_memory_gib: float | None
    arch: str
    price: float | None  # on-demand USD/h
    spot_price: float | None
    notice_s: float | None
    notes: tuple[str, ...] = ()
    source: str = ""

    @property
    def name(self) -> str:
        return f"{self.instance_type}@{self.region}"

    def offers(self) -> list[Offer]:
        """The on-demand offer and, when priced, the spot one."""
        base = Offer(
            provider=self.provider,
            name=self.name,
            cpus=self.vcpus,
            memory=int(self.memory_gib * GIB) if self.memory_gib is not None else None,
            gpus=self.gpu_count,
            gpu=self.gpu_model,
            gpu_memory=int(self.gpu_memory_gib * GIB) if self.gpu_memory_gib is not None else None,
            arch=self.arch,
            region=self.region,
            price_per_hour=self.price if self.price is not None else float("nan"),
            spot_price_per_hour=self.spot_price,
            spot=False,
            notice_s=None,
            extra={"catalog": True, "instance_type": self.instance_type, "notes": list(self.notes),
                   "source": self.source, "spot_notice_s": self.notice_s},
        )
        out = [base] if self.price is not None else []
        if self.spot_price is not None:
            out.append(replace(base, name=f"{self.name}:spot", spot=True, notice_s=self.notice_s,
                               extra=dict(base.extra)))
        return out

    def to_csv(self) -> list[str]:
        def num(x: float | int | None) -> str:
            if x is None:
                return ""
            return (str(int(x)) if x.is_integer() else repr(x)) if isinstance(x, float) else str(x)

        return [self.provider, self.region, self.instance_type, num(self.vcpus), num(self.memory_gib),
                self.gpu_model or "", str(self.gpu_count), num(self.gpu_memory_gib), self.arch,
                num(self.price), num(self.spot_price), num(self.notice_s), ";".join(self.notes), self.source]


@dataclass
class Catalog:
    rows: list[CatalogRow]
    meta: dict[str, str] = field(default_factory=dict)  # from the ``# key: value`` header
    header: list[str] = field(default_factory=list)  # the header lines, verbatim
    path: str = ""

    @property
    def date(self) -> str:
        """When the prices were published or fetched ("unknown" when the source does not say)."""
        return self.meta.get("date", "unknown").split(" ")[0]

    @property
    def source(self) -> str:
        return self.meta.get("source", "unknown").split(" (")[0]

    def caption(self) -> str:
        curated = f"; curated {self.meta['curated'].split(' ')[0]}" if self.meta.get("curated") else ""
        return (f"catalog: {self.source}, prices dated {self.date}{curated} ({self.path}); "
                "list prices, not quotes")

    def offers(self, req: Requirements | None = None) -> list[Offer]:
        """Every offer of the catalog that fits ``req``, cheapest first."""
        req = req or Requirements()
        return cheapest_first([o for r in self.rows for o in r.offers() if o.fits(req)])

    def find(self, provider: str, name: str) -> Offer | None:
        for r in self.rows:
            if r.provider == provider:
                for o in r.offers():
                    if o.name == name:
                        return o
        return None

    def providers(self) -> list[str]:
        return sorted({r.provider for r in self.rows})


def doubtful(offer: Offer) -> str | None:
    """Why ``offer``'s price should not be trusted by an automatic choice, or None."""
    notes = offer.extra.get("notes") or []
    if DOUBTFUL_PRICE in notes:
        return NOTE_TEXT[DOUBTFUL_PRICE]
    if offer.spot and DOUBTFUL_SPOT in notes:
        return NOTE_TEXT[DOUBTFUL_SPOT]
    return None


# -- reading and writing -------------------------------------------------------------------


def shipped_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "offers.csv"


def user_path() -> Path:
    """Where ``sojourn offers refresh`` writes: ``$SOJOURN_CATALOG``, else the cache."""
    if os.environ.get("SOJOURN_CATALOG"):
        return Path(os.environ["SOJOURN_CATALOG"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sojourn" / "offers.csv"


_CACHE: dict[tuple[str, float], Catalog] = {}


def load(path: str | os.PathLike[str] | None = None) -> Catalog:
    """The catalog at ``path``; by default the refreshed copy if there is one, else the shipped one."""
    if path is None:
        user = user_path()
        path = user if user.is_file() else shipped_path()
    p = Path(path)
    try:
        key = (str(p), p.stat().st_mtime)
    except OSError as e:
        raise CatalogError(f"cannot read the offer catalog {p}: {e}") from e
    if key not in _CACHE:
        _CACHE[key] = parse(p.read_text(encoding="utf-8"), str(p))
    return _CACHE[key]


def parse(text: str, where: str = "<catalog>") -> Catalog:
    header = [line for line in text.splitlines() if line.startswith("#")]
    meta: dict[str, str] = {}
    for line in header:
        body = line[1:].strip()
        key, sep, value = body.partition(":")
        if sep and key and " " not in key and not line.startswith("#  "):
            meta.setdefault(key, value.strip())
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    reader = csv.DictReader(io.StringIO(body))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"{where}: the catalog lacks the column(s) {', '.join(missing)}; "
                           "run `sojourn offers refresh` or remove the file to use the shipped catalog")
    rows = []
    for n, r in enumerate(reader, start=2 + len(header)):
        try:
            rows.append(_row(r))
        except (ValueError, TypeError) as e:
            raise CatalogError(f"{where}, line {n}: {e}") from e
    return Catalog(rows, meta, header, where)


def _row(r: dict[str, Any]) -> CatalogRow:
    def f(k: str) -> float | None:
        v = (r.get(k) or "").strip()
        return float(v) if v else None

    def i(k: str) -> int | None:
        v = f(k)
        return int(v) if v is not None else None

    return CatalogRow(
        provider=r["provider"].strip(), region=r["region"].strip(), instance_type=r["instance_type"].strip(),
        vcpus=i("vcpus"), memory_gib=f("memory_gib"), gpu_model=(r.get("gpu_model") or "").strip() or None,
        gpu_count=i("gpu_count") or 0, gpu_memory_gib=f("gpu_memory_gib"), arch=(r.get("arch") or "x86_64").strip(),
        price=f("price_on_demand_usd_h"), spot_price=f("price_spot_usd_h"), notice_s=f("preempt_notice_s"),
        notes=tuple(n for n in (r.get("notes") or "").split(";") if n), source=(r.get("source") or "").strip(),
    )


def dump(cat: Catalog) -> str:
    out = io.StringIO()
    for line in cat.header:
        out.write(line + "\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in cat.rows:
        w.writerow(r.to_csv())
    return out.getvalue()


def save(cat: Catalog, path: str | os.PathLike[str]) -> Path:
    """Write ``cat`` atomically (a reader never sees half a catalog)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    tmp.write_text(dump(cat), encoding="utf-8")
    os.replace(tmp, p)
    return p
