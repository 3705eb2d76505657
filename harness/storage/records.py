"""Result records: one JSON file per cell, versioned, validated on write, written atomically.

The schema is documented in ``docs/records.md``. A record is written with write-to-temp +
``os.replace`` so a reader (or a killed run) never sees a half-written file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from harness.contract.record import (
    RECORD_FILE,
    DamagedRecord,
    read_record,
    set_aside,
    validate_record,
)
from harness.storage.safe_files import atomic_write


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new file, whole.

    The file gets the same mode as one made by a plain ``open(path, "w")`` (umask honoured).
    """
    atomic_write(path, lambda f: f.write(text))


def write_record(cell_dir: Path, rec: dict[str, Any]) -> Path:
    """Validate and atomically write ``rec`` to ``cell_dir/record.json``."""
    validate_record(rec)
    path = cell_dir / RECORD_FILE
    atomic_write_text(path, json.dumps(rec, indent=1, sort_keys=True, allow_nan=True) + "\n")
    return path


def record_or_set_aside(cell_dir: Path) -> dict[str, Any] | None:
    """The cell's record for the process that holds its lease: a damaged one is renamed aside
    (never deleted), named in one warning line and in ``events.jsonl``, and the cell then runs
    as if it had none."""
    from harness.storage.checkpoint import log_event  # torch: only the engine gets here

    try:
        return read_record(cell_dir)
    except DamagedRecord as exc:
        moved = set_aside(exc.path)
        logging.getLogger("harness").warning("%s; moved to %s, the cell is redone", exc, moved.name)
        log_event(cell_dir, "record_damaged", moved_to=moved.name, reason=exc.reason)
        return None
