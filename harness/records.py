"""Result records: one JSON file per cell, versioned, validated on write, written atomically.

The schema is documented in ``docs/records.md``. A record is written with write-to-temp +
``os.replace`` so a reader (or a killed run) never sees a half-written file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RECORD_FILE = "record.json"
STATUSES = ("done", "failed")

# key → (required, allowed types). The single place the schema's top level is defined.
TOP_LEVEL: dict[str, tuple[bool, tuple[type, ...]]] = {
    "schema_version": (True, (int,)),
    "suite": (True, (str,)),
    "cell_id": (True, (str,)),
    "status": (True, (str,)),
    "config": (True, (dict,)),
    "evaluation": (True, (dict,)),
    "metrics": (True, (dict,)),
    "cost": (True, (dict,)),
    "history": (True, (list,)),
    "diagnostics": (True, (dict,)),
    "timings": (True, (dict,)),
    "environment": (True, (dict,)),
    "conventions": (True, (dict,)),
    "error": (True, (dict, type(None))),
    "started_at": (True, (str,)),
    "finished_at": (True, (str,)),
}


class RecordError(ValueError):
    """A record does not follow the schema."""


def _check_json_values(obj: Any, path: str) -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        return  # NaN/inf are legal metric values (a diverged run); JSON writes them as NaN.
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise RecordError(f"{path}: key {k!r} is not a string")
            _check_json_values(v, f"{path}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _check_json_values(v, f"{path}[{i}]")
    elif not isinstance(obj, str | int | float | bool | type(None)):
        raise RecordError(f"{path}: value of type {type(obj).__name__} is not JSON")


def validate_record(rec: dict[str, Any]) -> None:
    """Raise :class:`RecordError` if ``rec`` does not follow schema version 1."""
    missing = [k for k, (req, _) in TOP_LEVEL.items() if req and k not in rec]
    if missing:
        raise RecordError(f"record lacks keys {missing}")
    unknown = sorted(set(rec) - set(TOP_LEVEL))
    if unknown:
        raise RecordError(f"record has unknown keys {unknown}; valid: {sorted(TOP_LEVEL)}")
    for k, (_, types) in TOP_LEVEL.items():
        if not isinstance(rec[k], types):
            raise RecordError(
                f"record[{k!r}] must be {[t.__name__ for t in types]}, got {type(rec[k]).__name__}"
            )
    if rec["schema_version"] != SCHEMA_VERSION:
        raise RecordError(f"schema_version {rec['schema_version']} != {SCHEMA_VERSION}")
    if rec["status"] not in STATUSES:
        raise RecordError(f"status {rec['status']!r} not in {STATUSES}")
    if rec["status"] == "failed" and not rec["error"]:
        raise RecordError("a failed record must carry an error with its reason")
    if rec["status"] == "done" and "clean" not in rec["metrics"]:
        raise RecordError("a done record must carry metrics.clean")
    _check_json_values(rec, "record")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new file, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_record(cell_dir: Path, rec: dict[str, Any]) -> Path:
    """Validate and atomically write ``rec`` to ``cell_dir/record.json``."""
    validate_record(rec)
    path = cell_dir / RECORD_FILE
    atomic_write_text(path, json.dumps(rec, indent=1, sort_keys=True, allow_nan=True) + "\n")
    return path


def read_record(cell_dir: Path) -> dict[str, Any] | None:
    """The record in ``cell_dir``, or None if there is none (a pending or running cell)."""
    path = cell_dir / RECORD_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def iter_records(results_dir: Path) -> Iterator[dict[str, Any]]:
    """All records under a suite's results folder, in cell-id order."""
    for path in sorted(Path(results_dir).glob(f"*/{RECORD_FILE}")):
        yield json.loads(path.read_text())
