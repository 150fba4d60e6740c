"""Standard-library objects that loops hold: ``csv.reader`` travels, hash objects are refused.

(Modules, locks, dict views and the standard streams: stdlib.py.)
"""

from __future__ import annotations

from typing import Any

from sojourn.capsule.registry import register

# -- csv.reader: its source, dialect and line number ---------------------------------------
#
# A reader holds its source iterator (an open file: the files reducer carries it at its
# offset), its dialect and the number of lines it read; between two rows it is at a record
# boundary, so nothing else is in flight. It is rebuilt over its source with ``line_num``
# blank lines put in front and read away, which sets ``line_num`` back (it is read-only).

_DIALECT = ("delimiter", "quotechar", "escapechar", "doublequote", "skipinitialspace",
            "lineterminator", "quoting", "strict")


def _csv_reader(source: Any, dialect: dict[str, Any], line_num: int) -> Any:
    import csv

    from sojourn.capsule.reducers.iterators import _make_prefix, _remember

    reader = csv.reader(_make_prefix([""] * line_num, source) if line_num else source, **dialect)
    for _ in range(line_num):
        next(reader)
    # What the fingerprint check must see is the captured description, not the wrapper.
    return _remember(reader, (_csv_reader, (source, dialect, line_num)))


@register("_csv.reader")
def _csv_reader_reduce(obj: Any, pickler: Any) -> Any:
    import gc

    from sojourn.capsule.context import current_or_none
    from sojourn.capsule.reducers.iterators import _unwrap

    ctx = current_or_none()
    if ctx is not None and id(obj) in ctx.canonical:
        return ctx.canonical[id(obj)]
    refs = [r for r in gc.get_referents(obj) if not isinstance(r, type) and r is not obj.dialect]
    if len(refs) != 1:
        return pickler.problem(obj, "the csv reader's source could not be found")
    dialect = {a: getattr(obj.dialect, a) for a in _DIALECT}
    return (_csv_reader, (_unwrap(refs[0]), dialect, obj.line_num))


# -- hash objects: refused, with what to do ---------------------------------------------------


@register("_hashlib.HASH", "_hashlib.HASHXOF", "_hashlib.HMAC", "_blake2.blake2b", "_blake2.blake2s",
          "_md5.md5", "_sha1.sha1", "_sha256.sha256", "_sha256.sha224", "_sha512.sha512", "_sha512.sha384",
          "_sha2.SHA224Type", "_sha2.SHA256Type", "_sha2.SHA384Type", "_sha2.SHA512Type",
          "_sha3.sha3_224", "_sha3.sha3_256", "_sha3.sha3_384", "_sha3.sha3_512", "_sha3.shake_128",
          "_sha3.shake_256")
def _hash_reduce(obj: Any, pickler: Any) -> Any:
    from sojourn.capsule.pickler import _refusal

    said = _refusal(obj)  # the pickler's own list of what never travels, where it names the type
    if said is not None:
        return pickler.problem(obj, said)
    name = getattr(obj, "name", type(obj).__name__)
    return pickler.problem(obj, (
        f"a {name} hash object's running state lives inside the hash library (OpenSSL), which "
        "gives no way to read it out or set it again; keep its digest() before the pause, or "
        "hash the data again after resume"))
