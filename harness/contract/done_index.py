"""Which cells are done, without parsing 10,000 records each time a suite is planned.

``DoneIndex(results_dir)`` remembers, in ``<results>/.done-index.json``, the size and modification
time (ns) of every ``record.json`` that :func:`harness.contract.read_record` accepted as a done
record. ``is_done(cell_id)`` is then one ``stat``: a record whose size and mtime still match is
done; any other (new, rewritten, truncated, replaced by a symbolic link, gone) is read and checked
in full, so a damaged, foreign or newer-schema record is never done — the verdict of
:func:`harness.contract.check_record_file`, as without the index. Only done verdicts are kept;
records modified within two seconds of the index write are re-checked next time (a same-size
rewrite within the timestamp granularity would otherwise go unseen).

The file is a cache, never a source: one that cannot be read or names another format is ignored
and rewritten; it is written atomically, and a folder that cannot take it goes without.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.contract.record import RECORD_FILE, DamagedRecord, read_record

INDEX_FILE = ".done-index.json"
FORMAT = "harness-done-index/1"
_RACY_NS = 2_000_000_000


def file_key(path: Path | str) -> tuple[int, int] | None:
    """(size, mtime in ns) of ``path`` itself (a symlink is not followed), or None if absent:
    what says a file changed, for this index and the report's record index."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class DoneIndex:
    """Done verdicts of one results folder, checked by size and mtime (see the module doc)."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = Path(results_dir)
        self.path = self.results_dir / INDEX_FILE
        self.entries: dict[str, list[int]] = self._load()
        self.changed = False

    def _load(self) -> dict[str, list[int]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                return {}
            racy = int(data["written_ns"]) - _RACY_NS
            return {
                str(k): [int(v[0]), int(v[1])] for k, v in data["done"].items() if int(v[1]) < racy
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError):
            return {}  # absent, damaged or foreign: start afresh

    def record(self, cell_id: str) -> dict[str, Any] | None:
        """The cell's record, read and checked in full (None if there is none); a done one is
        remembered. Raises :class:`DamagedRecord` as :func:`read_record` does."""
        st = file_key(self.results_dir / cell_id / RECORD_FILE)
        rec = read_record(self.results_dir / cell_id)
        if rec is not None and rec.get("status") == "done" and st is not None:
            self.entries[cell_id] = list(st)
            self.changed = True
        elif self.entries.pop(cell_id, None) is not None:
            self.changed = True
        return rec

    def is_done(self, cell_id: str) -> bool:
        """Whether the cell has a usable done record (damaged ones raise, as in :meth:`record`)."""
        known = self.entries.get(cell_id)
        if (
            known is not None
            and list(file_key(self.results_dir / cell_id / RECORD_FILE) or ()) == known
        ):
            return True
        rec = self.record(cell_id)
        return bool(rec) and rec.get("status") == "done"

    def save(self) -> None:
        """Write the verdicts if any changed (atomically; silently skipped where it cannot)."""
        if not self.changed or not self.results_dir.is_dir():
            return
        data = {"format": FORMAT, "written_ns": time.time_ns(), "done": self.entries}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
            self.changed = False
        except OSError:
            tmp.unlink(missing_ok=True)


__all__ = ["INDEX_FILE", "DamagedRecord", "DoneIndex"]
