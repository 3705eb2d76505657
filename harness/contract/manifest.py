"""The results folder's manifest, ``<results>/suite.json``: which cells a suite expects.

Written by ``harness run`` before any cell starts (merged with the cells of earlier versions of
the suite) and read by ``harness status``, ``harness evaluate`` and ``harness report``, which
lists expected cells that never produced a record as missing. Standard library only.

Format::

    {"name": suite name, "source": suite file, "current": [cell ids of the latest run],
     "overrides": [command-line KEY=VALUE overrides of the latest run],
     "only": [its --only filters],
     "cells": {cell_id: {"label": str, "cell": Cell.to_json()}}}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.contract import fastjson
from harness.contract.config import Cell

SUITE_FILE = "suite.json"
_NOT_CONFIG = ("suite", "evaluation", "hparam_defaults")  # Cell.to_json keys beyond config()


def build_manifest(
    name: str,
    source: str,
    cells: Iterable[Cell],
    old: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    only: Iterable[str] = (),
) -> dict[str, Any]:
    """The manifest for ``cells``, keeping the entries of ``old`` (earlier suite versions);
    ``overrides`` and ``only`` are the command line's, so the results say how they were made."""
    cells = list(cells)
    entries = dict((old or {}).get("cells") or {})
    for c in cells:
        entries[c.cell_id] = {"label": c.label, "cell": c.to_json()}
    return {
        "name": name,
        "source": source,
        "current": [c.cell_id for c in cells],
        "overrides": list(overrides),
        "only": list(only),
        "cells": entries,
    }


def read_manifest(results_dir: Path) -> dict[str, Any]:
    """The manifest of a suite's results folder.

    Raises:
        FileNotFoundError: the folder holds no ``suite.json`` (not written by ``harness run``).
    """
    path = Path(results_dir) / SUITE_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{results_dir} holds no {SUITE_FILE}: is it a suite's results "
            "folder written by `harness run`?"
        )
    return read_manifest_file(path)


def read_manifest_file(path: Path) -> dict[str, Any]:
    """The manifest in the file ``path``; a one-line ``DamagedFile`` when it is not one."""
    from harness.contract.errors import DamagedFile

    try:
        data = fastjson.loads(Path(path).read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFile(path, f"unreadable suite manifest ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells", {}), dict):
        raise DamagedFile(path, "not a suite manifest written by `harness run`")
    return data


def expected_cells(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cells of the latest run as ``{"cell_id", "label", "config"}`` (config: the training
    configuration, the same mapping as a record's ``config``)."""
    out = []
    cells = manifest.get("cells") or {}
    for cell_id in manifest.get("current") or []:
        entry = cells.get(cell_id) or {}
        cell = dict(entry.get("cell") or {})
        config = {k: v for k, v in cell.items() if k not in _NOT_CONFIG}
        out.append({"cell_id": cell_id, "label": str(entry.get("label", "")), "config": config})
    return out
