"""Per-row text of the last report, reused for the rows that did not change.

At 1,000 configurations the leaderboard's HTML rows (about 100 cells each) and the Markdown table's
lines are most of what a report writes after its statistics; when 10 of 10,000 records changed, one
configuration's row did. :class:`RowCache` keeps, in ``.report-rows.json`` in the output folder,
each row's text under a digest of everything that row shows: the values of its summary row (pandas'
hash of every column, with the column names and dtypes), the bold cells and significance marks it
carries, and what the caller passes as ``context`` (the columns shown, the interval), and the code
that writes it (a hash of the modules). A row whose digest is known is taken from there, every
other one is written as without the cache. The page's rows (the leaderboard's and the paired
table's markup, 13 MB at 1,000 configurations) are not copied into the file: it holds where each
one is in the page written beside it (``leaderboard.html``, checked by its SHA-1; a page edited or
gone since: those rows are written again), so reading and writing the cache costs a tenth of what
it did; :mod:`reports.csv_cache` keeps the CSV tables' row spans in the same file. The file is a
cache, never a source: one that cannot be read or names another format or code is ignored and
rewritten, and only the entries this report used are kept. The file sits in a folder others may be
able to write: a cached row is used only if the caller's ``valid`` accepts it (the page: nothing
but the markup :mod:`reports.row_html` writes, checked unless the file is :attr:`RowCache.private`
— owned by this user and writable by no one else, so only this user's reports wrote it: checking
1,000 rows of 12 kB each was a twentieth of a warm report; the Markdown: no raw ``<`` or ``>``), so
it can never put a script into the page.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness.contract import fastjson

CACHE_FILE = ".report-rows.json"
PAGE_FILE = "leaderboard.html"  # where the rows' markup is read back from (RowCache.save)
FORMAT = "harness-report-rows/1"
_CODE = ("page.py", "row_html.py", "columns.py", "markdown.py", "paired_view.py", "row_cache.py",
         "csv_cache.py")  # fmt: skip


def code_stamp() -> str:
    """Hash of the modules that decide a row's text: another version rewrites every row."""
    h = hashlib.sha256()
    for name in _CODE:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()


def value_digests(frame: pd.DataFrame) -> list[str] | None:
    """A digest of each row's values (None when a value cannot be hashed: no row is cached)."""
    try:
        values = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    except (TypeError, ValueError):  # a list or dict in a cell, or mixed unhashable values
        return None
    head = json.dumps([[str(c), str(frame[c].dtype)] for c in frame.columns])
    head = hashlib.sha256(head.encode("utf-8")).hexdigest()[:24]
    return [f"{head}{int(v):016x}" for v in values]


class RowCache:
    """The rows of the last report in ``out_dir`` (none when ``enabled`` is False)."""

    def __init__(self, out_dir: Path | None, enabled: bool = True) -> None:
        self.path = None if out_dir is None or not enabled else Path(out_dir) / CACHE_FILE
        self.stamp = code_stamp() if self.path is not None else ""
        self.private = False  # the file read is this user's alone (module docstring)
        self.old, self.old_csv = self._load() if self.path is not None else ({}, {})
        self.new: dict[str, Any] = {}
        self.new_csv: dict[str, Any] = {}  # per CSV file (reports.csv_cache)
        self._digests: dict[int, tuple[pd.DataFrame, list[str] | None]] = {}

    def _load(self) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())  # of the file read, not of what the name points to now
                raw = f.read()
            mine = hasattr(os, "getuid") and st.st_uid == os.getuid()
            data = fastjson.loads(raw)
            if data.get("format") != FORMAT or data.get("code") != self.stamp:
                return {}, {}
            rows, csv = data["rows"], data["csv"]
            if not isinstance(rows, dict) or not isinstance(csv, dict):
                return {}, {}
            self.private = mine and not st.st_mode & 0o022
            rows = _page_texts(rows, data.get("page"), self.path.parent / PAGE_FILE)
            return rows, {k: v for k, v in csv.items() if isinstance(v, dict)}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}, {}

    def digests(self, frame: pd.DataFrame) -> list[str] | None:
        """:func:`value_digests` of ``frame``, computed once per frame (the summary's 400
        columns are hashed for the page, the Markdown and leaderboard.csv alike); None without a
        cache file."""
        if self.path is None:
            return None  # no cache: nothing to key
        known = self._digests.get(id(frame))
        if known is None or known[0] is not frame:  # (the frame is kept: its id stays its own)
            known = self._digests[id(frame)] = (frame, value_digests(frame))
        return known[1]

    def rows(
        self,
        kind: str,
        digests: Sequence[str] | None,
        extras: Sequence[Any],
        context: Any,
        make: Callable[[list[int]], list[Any]],
        valid: Callable[[Any], bool] | None = None,
        markup: Callable[[Any], bool] | None = None,
    ) -> list[Any]:
        """One entry per row: cached where its key is known, else from ``make(positions)``.

        ``digests``: :func:`value_digests` of the rows (None: make every row); ``extras``: per
        row, what else it shows (bold columns, marks), JSON-serialisable; ``context``: what
        every row shows alike; ``make`` gets the positions of the rows to write and returns
        their entries (JSON-serialisable) in that order; ``valid``: whether a cached entry may
        be used (one that is not is made again: the file sits in a folder others may write);
        ``markup``: whether a valid entry's markup is nothing but this code's, asked only when
        the file is not :attr:`private`."""
        if self.path is None or digests is None:
            return make(list(range(len(extras))))
        base = json.dumps([kind, context], sort_keys=True, default=str)
        keys = [
            hashlib.sha256(f"{base}|{d}|{json.dumps(e, default=str)}".encode()).hexdigest()
            for d, e in zip(digests, extras, strict=True)
        ]
        checks = [valid, None if self.private else markup]
        checks = [c for c in checks if c is not None]
        ok = lambda entry: all(c(entry) for c in checks)  # noqa: E731
        missing = [i for i, k in enumerate(keys) if k not in self.old or not ok(self.old[k])]
        made = dict(zip(missing, make(missing), strict=True)) if missing else {}
        out = [made[i] if i in made else self.old[k] for i, k in enumerate(keys)]
        self.new.update(zip(keys, out, strict=True))
        return out

    def save(self, page: str | None = None) -> None:
        """Keep the entries of this report (atomically; a folder that cannot take it goes
        without); ``page``: the text of the page just written as :data:`PAGE_FILE` beside the
        cache, which then holds where each row's markup is in it instead of the markup."""
        if self.path is None:
            return
        rows, spans = self.new, None
        if page is not None:
            rows, spans = _page_spans(self.new, page)
        elif self.new == self.old and self.new_csv == self.old_csv:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            data = {"format": FORMAT, "code": self.stamp, "rows": rows, "csv": self.new_csv,
                    "page": spans}  # fmt: skip
            tmp.write_bytes(fastjson.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)


def _page_spans(rows: dict[str, Any], page: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``rows`` with each ``cells_html`` found in ``page`` replaced by its [start, end] there,
    and what identifies the page (its SHA-1). The page holds the leaderboard's rows and the
    paired table's, each kind in the order made: one scan of the page per kind."""
    out = dict(rows)
    for paired in (False, True):  # a paired-table row also has its cells as data ("cells")
        at = 0
        for key, entry in rows.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("cells_html"), str):
                continue
            if ("cells" in entry) != paired:
                continue
            start = page.find(entry["cells_html"], at)
            if start < 0:
                continue  # (kept as text)
            at = start + len(entry["cells_html"])
            out[key] = {**entry, "cells_html": [start, at]}
    return out, {"file": PAGE_FILE, "sha1": hashlib.sha1(page.encode("utf-8")).hexdigest()}


def _page_texts(rows: dict[str, Any], spans: Any, page_path: Path) -> dict[str, Any]:
    """``rows`` with each [start, end] ``cells_html`` read back from the page they were found
    in; entries of a page that is gone or changed since are left out (made again)."""
    spanned = [k for k, v in rows.items() if isinstance(v, dict)
               and isinstance(v.get("cells_html"), list)]  # fmt: skip
    if not spanned:
        return rows
    text = None
    try:
        raw = page_path.read_bytes()
        if isinstance(spans, dict) and spans.get("sha1") == hashlib.sha1(raw).hexdigest():
            text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    out = dict(rows)
    for key in spanned:
        span = rows[key]["cells_html"]
        ok = text is not None and len(span) == 2 and all(type(x) is int for x in span)
        if ok and 0 <= span[0] <= span[1] <= len(text):
            out[key] = {**rows[key], "cells_html": text[span[0] : span[1]]}
        else:
            del out[key]
    return out
