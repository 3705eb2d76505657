"""Reading a cell's per-image outcomes (``outcomes.npz``, :mod:`harness.contract.outcomes`) for
the bootstrap over test images (:mod:`reports.stats.bootstrap`)."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.contract.outcomes import OUTCOMES_FILE


def load_outcomes(cell_dir: Path) -> dict[str, np.ndarray] | None:
    """The cell's per-image outcomes, or None when it has none (a record from before they were
    kept, or a damaged file). Loaded without unpickling (``allow_pickle=False``)."""
    path = Path(cell_dir) / OUTCOMES_FILE
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None


#: The id suffix of a derived ``single+TS`` row (:func:`reports.records.flatten.with_posthoc_rows`).
TS_SUFFIX = "+ts"


def calibrated_view(outcomes: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """A cell's outcomes as its temperature-scaled prediction's: ``ts/<field>`` as the raw
    field (and as itself), ``correct`` unchanged; None when the cell was not calibrated."""
    if not any(k.startswith("ts/") for k in outcomes):
        return None
    out = {k: v for k, v in outcomes.items() if k.startswith("ts/") or k == "correct"}
    out.update({k.removeprefix("ts/"): v for k, v in outcomes.items() if k.startswith("ts/")})
    return out


def cell_folder(results_dir: Path, suite: str, cell_id: str) -> Path:
    """A cell's folder in a suite's results folder, or in a root of suite folders."""
    direct = Path(results_dir) / cell_id
    return direct if direct.is_dir() else Path(results_dir) / suite / cell_id


def outcomes_finder(
    results_dir: Path, cells: pd.DataFrame, reference_method: str
) -> Callable[[Mapping[str, Any], bool], list[dict[str, np.ndarray] | None]]:
    """For :func:`reports.stats.bootstrap.bootstrap_rows`: ``(paired-table row, reference
    side?)`` → the outcomes of that side's done cells at the row's paired seeds, in seed order
    (None for a seed whose cell has none). Of two cells of one configuration and seed (the same
    configuration in two suites) the first with outcomes is used."""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    cache: dict[tuple[str, str], dict[str, np.ndarray] | None] = {}

    def load(suite: str, cell_id: str) -> dict[str, np.ndarray] | None:
        if (suite, cell_id) not in cache:
            if cell_id.endswith(TS_SUFFIX):  # single+TS: its cell's calibrated outcomes
                base = load(suite, cell_id.removesuffix(TS_SUFFIX))
                cache[suite, cell_id] = None if base is None else calibrated_view(base)
            else:
                cache[suite, cell_id] = load_outcomes(cell_folder(results_dir, suite, cell_id))
        return cache[suite, cell_id]

    def find(row: Mapping[str, Any], reference: bool) -> list[dict[str, np.ndarray] | None]:
        method = reference_method if reference else row["method"]
        m = row["reference_M"] if reference else row["M"]
        hparams = row["reference_hparams"] if reference else row["hparams"]
        mask = (
            (done["dataset"] == row["dataset"])
            & (done["backbone"] == row["backbone"])
            & (done["variant"].fillna("") == (row["variant"] or ""))
            & (done["method"] == method)
            & (done["M"].astype(str) == str(m))
            & (done["hparams"].fillna("") == (hparams or ""))
        )
        mine = done[mask]
        out = []
        for seed in (int(s) for s in str(row["seeds"]).split(",")):
            found = None
            for suite, cell_id in zip(
                *(mine.loc[mine["seed"] == seed, k] for k in ("suite", "cell_id"))
            ):
                found = load(str(suite), str(cell_id))
                if found is not None:
                    break
            out.append(found)
        return out

    return find


def with_image_bootstrap(
    path: Path,
    cells: pd.DataFrame,
    reference: str,
    table: pd.DataFrame,
    level: float = 0.95,
    replicates: int = 2000,
) -> pd.DataFrame:
    """``table`` (a paired table of the results in ``path``, :func:`paired_differences
    <reports.stats.paired.paired_differences>` of ``cells`` against ``reference``) with the seeds
    × images bootstrap's columns: ``boot_se``, ``boot_lo``, ``boot_hi``, ``boot_p``, ``n_images``
    and ``boot_note`` (:func:`reports.stats.bootstrap.bootstrap_rows`)."""
    from reports.stats.bootstrap import bootstrap_rows
    from reports.stats.paired import parse_reference

    find = outcomes_finder(path, cells, parse_reference(reference)[0])
    extra = bootstrap_rows(table.to_dict("records"), find, level=level, replicates=replicates)
    return pd.concat([table, pd.DataFrame(extra, index=table.index)], axis=1)
