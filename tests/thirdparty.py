"""Code nobody here wrote, for the tests that run it: fetched from PyPI at a pinned version,
checked against its sha256, unpacked into a cache outside the checkout.

Nothing of it is committed: the workplace's rule is that others' code is read and run, never
copied into this repository. Each source keeps its own licence file in its unpacked tree,
and the test that uses it says which file that is.

``SOJOURN_THIRD_PARTY_CACHE`` moves the cache (default ``~/.cache/sojourn/third-party``).
Without network a test that needs a source skips, naming it; with
``SOJOURN_REQUIRE_THIRD_PARTY=1`` (CI) it fails instead, so CI never passes by skipping.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Source:
    name: str  # the folder it unpacks to, e.g. "cloudpickle-2.2.1"
    url: str
    sha256: str
    license: str  # the licence file, relative to the unpacked folder


SOURCES: dict[str, Source] = {}


def pin(name: str, url: str, sha256: str, license: str) -> Source:
    src = SOURCES[name] = Source(name, url, sha256, license)
    return src


# cloudpickle's own test suite: the last sdist on PyPI that ships its tests/ folder.
pin("cloudpickle-2.2.1",
    "https://files.pythonhosted.org/packages/5f/51/913ecca3970a2227cf4d5e8937df52cc28f465ac442216110b8e3323262d/"
    "cloudpickle-2.2.1.tar.gz",
    "d89684b8de9e34a2a43b3460fbca07d09d6e25ce858df4d5a44240403b6178f5",
    "LICENSE")


# Real programs for the corpus (tests/corpus): pyperformance's benchmark programs (pure Python).
pin("pyperformance-1.14.0",
    "https://files.pythonhosted.org/packages/9e/bc/ebc48f2af24abe0d13681ac7ccb21c3f0ed0128361522f5904d4f21953e9/"
    "pyperformance-1.14.0.tar.gz",
    "91f74393997b604375ad5b79bf569a24076d70181c076a53abad5383a238a8aa",
    "COPYING")

# numpy's benchmarks (asv classes), scikit-learn's examples, and the book code of "Build a
# Large Language Model From Scratch" with its tests (torch): corpus programs too.
pin("numpy-2.5.5",
    "https://files.pythonhosted.org/packages/4e/3a/8770c288c47f0b5c2a786d3c20e79f66fd245f2d42cd232d7cd5e00e83e5/"
    "numpy-2.5.5.tar.gz",
    "5cddc243c75114ba845f01b1f87aca1572dbf7b6c2d88636ed3e1d2bccd7f1bf",
    "LICENSE.txt")
pin("scikit-learn-1.9.1",
    "https://files.pythonhosted.org/packages/d2/eb/eaf5e07fcc0da7149b0e084f24e54edd7441b9a89ce7e034032ae97fe3a0/"
    "scikit_learn-1.9.1.tar.gz",
    "629cada3e33e2b9bf376cdc7614a47a4140b8aedc1d836579e359736fbd82977",
    "COPYING")
pin("llms-from-scratch-1.0.19",
    "https://files.pythonhosted.org/packages/4d/85/faa3358e35679c4446bb8969e6b2d05661dbe6906da5a401974f7de57953/"
    "llms_from_scratch-1.0.19.tar.gz",
    "ad1e5ff0e58791eb2472017b7185746616b56cec76308bcb40d1d2a11778c35a",
    "LICENSE.txt")


def cache_dir() -> Path:
    return Path(os.environ.get("SOJOURN_THIRD_PARTY_CACHE") or Path.home() / ".cache" / "sojourn" / "third-party")


def _unavailable(why: str) -> None:
    if os.environ.get("SOJOURN_REQUIRE_THIRD_PARTY") == "1":
        pytest.fail(why)
    pytest.skip(why)


def fetch(name: str) -> Path:
    """The unpacked folder of a pinned source (downloaded and checked on first use)."""
    src = SOURCES[name]
    root = cache_dir()
    dest = root / src.name
    if (dest / ".sojourn-ok").exists():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    archive = root / Path(src.url).name
    if not archive.exists() or _sha256(archive) != src.sha256:
        try:
            with urllib.request.urlopen(src.url, timeout=60) as r, tempfile.NamedTemporaryFile(dir=root, delete=False) as f:
                shutil.copyfileobj(r, f)
            os.replace(f.name, archive)
        except OSError as e:
            _unavailable(f"{src.name} could not be downloaded from {src.url}: {e}")
    digest = _sha256(archive)
    if digest != src.sha256:
        archive.unlink(missing_ok=True)
        pytest.fail(f"{src.name}: sha256 {digest} is not the pinned {src.sha256}; refusing to run it")
    tmp = Path(tempfile.mkdtemp(dir=root))
    if archive.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    else:
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    entries = list(tmp.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(top, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    if not (dest / src.license).exists():
        pytest.fail(f"{src.name}: its licence file {src.license} is missing from the archive")
    (dest / ".sojourn-ok").write_text(src.sha256)
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
