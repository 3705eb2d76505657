"""Result records: one JSON file per cell, versioned, validated on write, written atomically.

The schema is documented in ``docs/records.md``. A record is written with write-to-temp +
``os.replace`` so a reader (or a killed run) never sees a half-written file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.contract.record import (
    RECORD_FILE,
    SCHEMA_VERSION,
    STATUSES,
    TOP_LEVEL,
    RecordError,
    iter_records,
    read_record,
    validate_record,
)
from harness.safe_files import atomic_write

# The schema (keys, versions, validation) and reading are defined once, in the contract layer,
# so the reporter reads records without importing the engine; re-exported for the engine.
__all__ = [
    "RECORD_FILE",
    "SCHEMA_VERSION",
    "STATUSES",
    "TOP_LEVEL",
    "RecordError",
    "atomic_write_text",
    "iter_records",
    "read_record",
    "validate_record",
    "write_record",
]


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
