"""CSV tables written again only where their rows changed.

``cells.csv`` of 10,000 records is 12 MB of formatted floats, and pandas formats every value on
every report. :func:`write_csv` writes exactly ``frame.to_csv(path, index=False)``, but takes the
text of each row whose values are unchanged (:func:`reports.row_cache.value_digests`) from the
previous file: the :class:`~reports.row_cache.RowCache` remembers, per file, its size and
modification time and SHA-1, its header, and the byte span of each row's text. A file that changed
since (another size, mtime or content), another header, or a frame whose rows pandas would not
format value by value (datetime, timedelta or categorical columns: their format depends on the
whole column) is written in full. A row with a line break inside a value is formatted on its own,
so spans never split a quoted field. ``tests/test_report_scale.py`` compares the bytes with pandas'
own.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pandas as pd

from harness.contract.done_index import file_key
from reports.row_cache import RowCache


def _row_wise(frame: pd.DataFrame) -> bool:
    """Whether pandas formats each value of ``frame`` on its own (so a row's text is the same
    in any subset of the rows)."""
    return not any(
        isinstance(dtype, pd.CategoricalDtype)
        or pd.api.types.is_datetime64_any_dtype(dtype)
        or pd.api.types.is_timedelta64_dtype(dtype)
        for dtype in frame.dtypes
    )


def _texts(frame: pd.DataFrame, positions: list[int]) -> list[bytes]:
    """The CSV text of each row at ``positions`` (no header), one bulk format for the rows
    without a line break in a value, each other row alone."""
    if not positions:
        return []
    sub = frame.iloc[positions]
    text_cols = [
        c for c in sub.columns if sub[c].dtype == object or pd.api.types.is_string_dtype(sub[c])
    ]
    broken = pd.Series(False, index=range(len(sub)))
    for c in text_cols:
        broken |= sub[c].astype(str).str.contains("\n", regex=False).to_numpy()
    out: list[bytes | None] = [None] * len(positions)
    simple = [i for i in range(len(sub)) if not broken.iat[i]]
    if simple:
        lines = sub.iloc[simple].to_csv(index=False, header=False).split(os.linesep)
        for i, line in zip(simple, lines, strict=False):  # the last split is the empty tail
            out[i] = (line + os.linesep).encode("utf-8")
    for i in range(len(sub)):
        if out[i] is None:
            out[i] = sub.iloc[[i]].to_csv(index=False, header=False).encode("utf-8")
    return out  # type: ignore[return-value]


def write_csv(frame: pd.DataFrame, path: Path, cache: RowCache | None) -> None:
    """``frame.to_csv(path, index=False)``, reusing the unchanged rows' text (module doc)."""
    digests = cache.digests(frame) if cache is not None and cache.path is not None else None
    if digests is None or not _row_wise(frame):
        frame.to_csv(path, index=False)
        return
    header = frame.iloc[:0].to_csv(index=False).encode("utf-8")
    prev: dict[str, Any] = cache.old_csv.get(path.name) or {}
    spans: dict[str, list[int]] = {}
    old = b""
    same_file = list(file_key(path) or ()) == prev.get("key")
    if prev.get("header") == header.decode("utf-8") and same_file:
        try:
            old = path.read_bytes()
            if hashlib.sha1(old).hexdigest() == prev.get("sha1"):  # not edited since
                spans = prev.get("rows") or {}
        except OSError:
            spans = {}
    missing = [i for i, d in enumerate(digests) if d not in spans]
    fresh = dict(zip(missing, _texts(frame, missing), strict=True))
    parts, rows, at = [header], {}, len(header)
    for i, d in enumerate(digests):
        text = fresh[i] if i in fresh else old[spans[d][0] : spans[d][1]]
        rows[d] = [at, at + len(text)]
        parts.append(text)
        at += len(text)
    text = b"".join(parts)
    path.write_bytes(text)
    cache.new_csv[path.name] = {
        "key": list(file_key(path) or ()),
        "sha1": hashlib.sha1(text).hexdigest(),
        "header": header.decode("utf-8"),
        "rows": rows,
    }
