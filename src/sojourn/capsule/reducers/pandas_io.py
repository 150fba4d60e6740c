"""pandas' chunked readers: ``pd.read_csv(path, chunksize=)`` / ``iterator=True``.

A ``TextFileReader`` holds a C parser (which cannot be pickled) over a file pandas opened
itself. What it has read is a row count (``_currow``); its options are the keyword
arguments it was made with. It travels as (the file's path in the workspace, options, engine,
rows read) and is made again on restore, reading the rows already read (and dropping them:
linear in what was read) so that the next chunk is the one the program would have got.

A reader over a file object the program opened itself cannot be rebuilt (where that file
stood when pandas started reading is not known), nor one over the pyarrow engine (which
reads the whole file at once): both are refused with what to do.

``pd.read_json(..., lines=True, chunksize=)`` needs nothing here: its ``JsonReader`` reads
lines from an ordinary file object, which the files reducer carries at its position.
"""

from __future__ import annotations

import io
from typing import Any

from sojourn.capsule.registry import register


def _raw(handle: Any) -> Any:
    for attr in ("buffer", "raw"):
        handle = getattr(handle, attr, handle)
    return handle if isinstance(handle, io.FileIO) else None


def _text_file_reader(rel: str, options: dict[str, Any], engine: str | None, rows: int) -> Any:
    from pandas.io.parsers.readers import TextFileReader

    from sojourn.capsule.context import current
    from sojourn.capsule.workspace_files import inside

    reader = TextFileReader(str(inside(current().files_to, rel)), engine=engine, **options)
    if rows:
        reader.read(rows)
    return reader


@register("pandas.io.parsers.readers.TextFileReader")
def _text_file_reader_reduce(reader: Any, pickler: Any) -> Any:
    from sojourn.capsule.reducers.files import _locate

    pickler.note_module("pandas")
    advice = "pass the file's path to pd.read_csv (pandas then opens the file, and its reader travels)"
    if reader.engine == "pyarrow":
        return pickler.problem(reader, "a chunked reader on the pyarrow engine cannot be positioned again; "
                                       "use the default engine")
    handles = reader.handles
    created = list(getattr(handles, "created_handles", None) or ())
    raw = _raw(created[0]) if created else None
    if raw is None:
        return pickler.problem(reader, "a chunked read_csv reader over a file object the program opened "
                                       f"cannot be positioned again; {advice}")
    if raw.closed:
        return pickler.problem(reader, "a closed read_csv reader; drop it (del) before the pause")
    where = _locate(raw, pickler)
    if isinstance(where, str):
        return pickler.problem(reader, where)
    if where is None:
        return pickler.problem(reader, "a read_csv reader over os.devnull; drop it before the pause")
    engine = reader.engine if reader._engine_specified else None
    return (_text_file_reader, (where.as_posix(), dict(reader.orig_options), engine, reader._currow))
