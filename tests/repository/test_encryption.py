"""Encryption at rest: what an encrypted repository stores, what it refuses, and that plain
repositories (old ones included) read as before. The conformance suites run through the
sealed layer too (``SealedConformance`` in every backend's test module)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import blake3
import pytest

from sojourn.errors import IntegrityError, RepositoryError
from sojourn.repository.chunks import WriteStats, chunk_hash
from sojourn.repository.local import LocalBackend
from sojourn.repository.repo import open_repository
from tests.conftest import last_json, run_py

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_KEY = "6465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f80818283"
SECRET = "correct horse battery staple"

CAPTURE = f"""
import json, sys
import numpy as np
import sojourn
rng = np.random.default_rng(3)
weights = rng.random(1_200_000)           # 9.6 MB of noise: three 4 MiB chunks, stored raw
zeros = np.zeros(600_000)                 # compresses: a zstd chunk
notes = {SECRET!r} * 1000
ref = sojourn.capture(globals(), sys.argv[1], files=sys.argv[2])
weights[700_000] = -1.0                   # one element: one chunk
ref2 = sojourn.capture(globals(), sys.argv[1], parent=ref.id, files=sys.argv[2])
print(json.dumps({{"id": ref.id, "id2": ref2.id, "written": ref.bytes_written, "written2": ref2.bytes_written}}))
"""

RESTORE = """
import json, sys
import sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1], files_to=sys.argv[3])
w = ns["weights"]
print(json.dumps({"n": int(w.size), "changed": float(w[700_000]), "zeros": float(ns["zeros"].sum()),
                  "notes": ns["notes"][:28]}))
"""


def _files(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    (d / "model.cfg").write_text(f"password = {SECRET}\n")
    return d


def _every_object(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_an_encrypted_repository_round_trips_dedups_and_stores_nothing_readable(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    open_repository(str(repo), create=True, encrypt=True).close()
    out = last_json(run_py(CAPTURE, str(repo), str(_files(tmp_path)), cwd=tmp_path))
    assert isinstance(out, dict)
    assert out["written"] > 9_000_000
    assert out["written2"] < (4 << 20) + 300_000, "a one-element change rewrote more than its chunk"
    got = last_json(run_py(RESTORE, str(repo), out["id2"], str(tmp_path / "back"), cwd=tmp_path))
    assert got == {"n": 1_200_000, "changed": -1.0, "zeros": 0.0, "notes": SECRET}
    assert (tmp_path / "back" / "model.cfg").read_text() == f"password = {SECRET}\n"

    # Nothing stored says what it holds: not the text, not the manifests' JSON, not a name.
    plain_names = set()
    with open_repository(str(repo)) as r:
        from sojourn.capsule import format as fmt

        for cap in (out["id"], out["id2"]):
            m = fmt.load_manifest(r, cap)
            for rec in [m.stream, *(b.record for b in m.buffers)]:
                plain_names.update(rec.chunks)
    for path in _every_object(repo):
        blob = path.read_bytes()
        if path.parent.name == "config":
            continue
        assert blob.startswith(b"SJE\x01"), path
        assert SECRET.encode() not in blob and b'"variables"' not in blob, path
        assert path.name not in plain_names, f"{path.name} is a plain content hash"
        assert path.name.removesuffix("-z") == path.name  # the codec is not in the name either


def test_keyed_chunk_names_are_deterministic_per_repository_and_differ_between_them(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    names = []
    for i in range(2):
        with open_repository(str(tmp_path / f"r{i}"), create=True, encrypt=True) as r:
            rec = r.chunks.put(data, WriteStats())
            again = r.chunks.put(data, stats := WriteStats())
            assert again.chunks == rec.chunks == [chunk_hash(data)]  # records keep the plain hash
            assert (stats.chunks_new, stats.chunks_reused) == (0, 1)  # dedup within the repository
            names.append(r.chunks.names(rec)[0])
    assert names[0] != names[1] and chunk_hash(data) not in names


def _two_captures(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    open_repository(str(repo), create=True, encrypt=True).close()
    code = """
import json, sys, numpy as np, sojourn
a = sojourn.capture({"x": np.arange(100_000.0) * 1.5}, sys.argv[1])
b = sojourn.capture({"x": np.arange(100_000.0) * 2.5}, sys.argv[1])
print(json.dumps([a.id, b.id]))
"""
    ids = last_json(run_py(code, str(repo), cwd=tmp_path))
    assert isinstance(ids, list)
    return repo, str(ids[0]), str(ids[1])


def _restore(repo: Path, cap: str, tmp_path: Path) -> str:
    proc = run_py("import sys, sojourn; sojourn.restore(sys.argv[2], sys.argv[1])", str(repo), cap, cwd=tmp_path,
                  check=False)
    assert proc.returncode != 0, "a swapped object was accepted"
    return proc.stderr


def test_a_chunk_swapped_for_another_is_refused(tmp_path: Path) -> None:
    repo, first, second = _two_captures(tmp_path)
    with open_repository(str(repo)) as r:
        from sojourn.capsule import format as fmt

        mine = set(fmt.load_manifest(r, first).all_chunk_names(r.chunks))
        theirs = set(fmt.load_manifest(r, second).all_chunk_names(r.chunks)) - mine
    raw = LocalBackend(repo)
    victim, other = sorted(mine - theirs)[0], sorted(theirs)[0]
    raw.save("chunks", victim, raw.load("chunks", other))
    err = _restore(repo, first, tmp_path)
    assert "IntegrityError" in err and f"chunk {victim[:16]}… is corrupt" in err and "fails its authentication tag" in err


def test_a_manifest_swapped_for_another_or_planted_in_plain_is_refused(tmp_path: Path) -> None:
    repo, first, second = _two_captures(tmp_path)
    raw = LocalBackend(repo)
    raw.save("capsules", first + ".json", raw.load("capsules", second + ".json"))
    err = _restore(repo, first, tmp_path)
    assert "IntegrityError" in err and "fails its authentication tag" in err and "Nothing" not in err
    # A plain manifest, even one signed with the key, is not how an encrypted repository stores one.
    with open_repository(str(repo)) as r:
        plain = r.backend.load("capsules", second + ".json")
    raw.save("capsules", second + ".json", plain)
    err = _restore(repo, second, tmp_path)
    assert "is not an encrypted object although the repository is encrypted" in err


def test_records_are_sealed_and_bound_to_their_names(repo: str) -> None:
    with open_repository(repo, create=True, encrypt=True) as r:
        for seq in (1, 2):
            r.backend.save("workspaces", f"event.ws_a.{seq:08d}", json.dumps({"seq": seq, "type": "note"}).encode(),
                           exclusive=True)
        raw = r.raw
        assert b"note" not in raw.load("workspaces", "event.ws_a.00000001")
        # an older event copied over a newer one (a replay) fails its tag
        raw.save("workspaces", "event.ws_a.00000002", raw.load("workspaces", "event.ws_a.00000001"))
        with pytest.raises(IntegrityError, match=r"event\.ws_a\.00000002 fails its authentication tag"):
            r.backend.load("workspaces", "event.ws_a.00000002")
        # and one written by someone without the key is not an encrypted object at all
        raw.save("workspaces", "event.ws_a.00000003", b'{"seq": 3, "type": "allocation", "python": "/tmp/x"}')
        with pytest.raises(IntegrityError, match="is not an encrypted object"):
            r.backend.load("workspaces", "event.ws_a.00000003")
        # nor the shared machine config, which names interpreters
        raw.save("config", "machines.toml", b"[machines.gpu]\npython = '/tmp/evil'\n")
        with pytest.raises(IntegrityError, match=r"config/machines\.toml is not an encrypted object"):
            r.backend.load("config", "machines.toml")


def test_the_wrong_key_is_named_at_open(repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOJOURN_KEY", "11" * 32)
    open_repository(repo, create=True, encrypt=True).close()
    monkeypatch.setenv("SOJOURN_KEY", "22" * 32)
    with pytest.raises(RepositoryError, match=r"the key for repo_\w+ \(\$SOJOURN_KEY\) does not open"):
        open_repository(repo)


def test_encryption_is_chosen_at_creation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, sealed = str(tmp_path / "plain"), str(tmp_path / "sealed")
    with open_repository(plain, create=True) as r:
        assert not r.encrypted and r.config["version"] == 1  # local: plain unless asked
    with pytest.raises(RepositoryError, match="is a plain repository; whether a repository is encrypted is chosen"):
        open_repository(plain, encrypt=True)
    monkeypatch.setenv("SOJOURN_ENCRYPT", "1")
    with open_repository(sealed, create=True) as r:
        assert r.encrypted and r.config["version"] == 2
    monkeypatch.delenv("SOJOURN_ENCRYPT")
    with open_repository(sealed) as r:  # read from the config, not from the environment
        assert r.encrypted


def test_sojourn_init_chooses_it_from_the_command_line(tmp_path: Path) -> None:
    def init(*args: str) -> dict[str, object]:
        proc = run_py("from sojourn.cli.main import main; main()", "init", "--repo", str(tmp_path / "r"), *args,
                      cwd=tmp_path)
        out = json.loads(proc.stdout)
        assert isinstance(out, dict)
        return out

    info = init("--encrypt", "--json")
    assert info["encrypted"] is True and info["created"] is True
    again = init("--json")
    assert again["id"] == info["id"] and again["created"] is False and again["encrypted"] is True


def test_restored_arrays_are_read_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw chunk of an encrypted repository goes from the file into the array: no whole-object
    load (one copy of the bytes more) on the way."""
    import numpy as np

    import sojourn

    repo = str(tmp_path / "repo")
    sojourn.init_repository(repo, encrypt=True)
    ref = sojourn.capture({"w": np.random.default_rng(1).random(3_000_000)}, repo)
    with open_repository(repo) as r:
        from sojourn.capsule import format as fmt

        buf = max(fmt.load_manifest(r, ref.id).buffers, key=lambda b: b.record.size)
        array_chunks = set(r.chunks.names(buf.record))
    assert buf.record.codec == "raw" and len(array_chunks) == 6
    loaded: list[str] = []
    real = LocalBackend.load

    def load(self: LocalBackend, kind: str, name: str) -> bytes:
        loaded.append(name)
        return real(self, kind, name)

    monkeypatch.setattr(LocalBackend, "load", load)
    ns = sojourn.restore(ref.id, repo)
    assert float(ns["w"][12345]) == float(np.random.default_rng(1).random(3_000_000)[12345])
    assert loaded and not array_chunks & set(loaded), "an array chunk was loaded whole, then copied"


@pytest.mark.parametrize("name", ["v1-plain", "v2-encrypted"])
def test_golden_repositories_stay_readable(tmp_path: Path, name: str) -> None:
    repo = tmp_path / name
    shutil.copytree(GOLDEN / name, repo)
    (cap,) = [p.stem for p in (repo / "capsules").iterdir()]
    proc = run_py(
        """
import json, sys
import numpy as np
import sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1], files_to=sys.argv[3])
want = np.random.default_rng(12).random(2000)
print(json.dumps({"noise": bool((ns["noise"] == want).all()), "grid": ns["grid"].tolist(), "text": ns["text"],
                  "k": ns["nested"]["k"], "alias": ns["nested"]["grid"] is ns["grid"],
                  "view": ns["nested"]["view"].base is ns["noise"]}))
""",
        str(repo), cap, str(tmp_path / "files"), cwd=tmp_path, env={"SOJOURN_KEY": GOLDEN_KEY},
    )
    assert last_json(proc) == {"noise": True, "grid": [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0],
                                                       [8.0, 9.0, 10.0, 11.0]],
                               "text": "héllo, capsule", "k": [1, 2, 3], "alias": True, "view": True}
    assert (tmp_path / "files" / "notes.txt").read_text() == "golden files\n"
    encrypted = json.loads((repo / "config" / "config.json").read_text()).get("encryption") is not None
    assert encrypted == (name == "v2-encrypted")
    for path in _every_object(repo):
        if path.parent.name != "config":
            sealed = path.read_bytes().startswith(b"SJE\x01")
            assert sealed == encrypted, path
            if not encrypted and path.parent.parent.name == "chunks" and not path.name.endswith("-z"):
                assert path.name == blake3.blake3(path.read_bytes()).hexdigest()  # plain names: content hashes
