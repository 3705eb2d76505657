"""Result records → pandas tables: one row per cell, and mean ± std (n) across seeds.

``load_results(results_dir)`` reads every cell folder, keeps what validates, and lists every cell
that did not produce a usable record (failed, invalid, missing) with its reason, so a folder with
failed or unfinished cells still reports. ``records_to_frame`` flattens records to one row per cell;
``aggregate`` (:mod:`reports.summary`) gives mean, std and n per configuration. ``variant`` names
config fields (recipe, backbone_kwargs, ...) that differ between cells of one group, so cells
that are not seeds of one configuration are never averaged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

# Records are read through the contract layer only: no engine, methods or torch import here.
from harness.contract import (
    RECORD_FILE,
)
from reports.flatten import _as_record
from reports.results import Problem, Results


def variant_keys(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Dotted config keys (besides the identity and seed) that differ inside one group."""
    from reports.rows import record_row, rows_frame, variant_of

    return variant_of(rows_frame([record_row(_as_record(r)) for r in records]))


def records_to_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per cell (done and failed), identity columns first."""
    from reports.rows import _with_variant, record_row, rows_frame

    rows = _with_variant(rows_frame([record_row(r) for r in records]))
    return rows[[c for c in rows.columns if not c.startswith("_")]]


def from_records(
    records: Iterable[Mapping[str, Any]],
    expected: Iterable[Any] | None = None,
    problems: Iterable[Problem] = (),
    source: str = "",
) -> Results:
    """:class:`Results` from records already read (each must validate); the same path as a
    results folder's rows (:func:`reports.rows.results_from_rows`)."""
    from reports.rows import record_row, results_from_rows, rows_frame

    rows = rows_frame([record_row(r) for r in records])
    return results_from_rows(rows, expected=expected, problems=problems, source=source)


def _cell_dirs(results_dir: Path, ignore: Iterable[Path]) -> list[str]:
    """The cell folders of a suite's results folder (or of each suite folder of a results root),
    each folder's in name order, as paths in text (10,000 Path objects were a twentieth of a
    warm report)."""
    ignore = {p.resolve() for p in ignore}

    names = {p.name for p in ignore}  # resolve only what could be ignored: one stat a folder

    def subdirs(d: Path | str) -> list[str]:
        with os.scandir(d) as entries:
            found = [
                (e.name, e.path)
                for e in entries
                if e.is_dir() and not e.name.startswith((".", "_"))
                and (e.name not in names or Path(e.path).resolve() not in ignore)
            ]  # fmt: skip
        return [path for _, path in sorted(found)]  # one folder: by name, as Paths compare

    if any(results_dir.glob(f"*/{RECORD_FILE}")) or not any(results_dir.glob(f"*/*/{RECORD_FILE}")):
        return subdirs(results_dir)
    return [cell for suite in subdirs(results_dir) for cell in subdirs(suite)]  # results root


def load_results(
    results_dir: Path | str,
    expected: Iterable[Any] | None = None,
    ignore: Iterable[Path] = (),
    *,
    index: bool = False,
    parallel: bool = False,
) -> Results:
    """Read a suite's results folder (or a folder of suite folders) into :class:`Results`.

    A cell folder without ``record.json`` is listed as missing (pending, running or killed), an
    unreadable or invalid record as invalid; ``expected`` adds cells that have no folder at all.
    With ``index``, the flattened rows are kept in ``.report-index.npz`` beside the results and
    only records whose path, size or mtime changed are read again (:mod:`reports.record_index`);
    with ``parallel``, many records are read by forked workers too (:mod:`reports.forked`).
    """
    from reports.record_index import load_rows
    from reports.rows import results_from_rows

    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results folder {results_dir} does not exist")
    cell_dirs = _cell_dirs(results_dir, ignore)
    rows, problems = load_rows(results_dir, cell_dirs, index=index, parallel=parallel)
    return results_from_rows(rows, expected=expected, problems=problems, source=str(results_dir))


def load_frame(results_dir: Path | str) -> pd.DataFrame:
    """The per-cell frame (done and failed cells) of a results folder; see :func:`load_results`."""
    return load_results(results_dir).cells
