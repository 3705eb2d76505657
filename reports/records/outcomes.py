"""Reading a cell's per-image outcomes (``outcomes.npz``, :mod:`harness.contract.outcomes`) for
the bootstrap over test images (:mod:`reports.stats.bootstrap`), each file checked against its
record's test-set size and against the other cells of its comparison before any resampling."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.contract import usable_record
from harness.contract.errors import UsageError
from harness.contract.outcomes import OUTCOMES_FILE, check_outcomes, record_image_count


def read_outcomes(
    cell_dir: Path, n_images: int | None = None, record: dict[str, Any] | None = None
) -> dict[str, np.ndarray] | None:
    """The cell's per-image outcomes (``{"correct": (N,), "nll": (N,), …}``), or None when it
    has no ``outcomes.npz``. Decoded without unpickling (``allow_pickle=False``).

    Args:
        cell_dir: the cell's folder.
        n_images: the N the file must hold (the record's test-set size,
            :func:`harness.contract.outcomes.record_image_count`; None: any).

        record: the cell's record, to check the values against (finite, in range, each
            field's mean the record's metric); None: the form only.

    Raises:
        DamagedOutcomes: the file is there but damaged, its values untrue to ``record``, or
            holds another number of images than ``n_images``
            (:func:`harness.contract.outcomes.check_outcomes`).
    """
    checked = check_outcomes(cell_dir, n_images, record)
    if checked is None:
        return None
    # The bytes the check read (not the file again: a rewrite in between would go unchecked).
    with np.load(io.BytesIO(checked.data), allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def load_outcomes(cell_dir: Path) -> dict[str, np.ndarray] | None:
    """The cell's per-image outcomes, or None when it has none or they cannot be read, without
    the checks of :func:`read_outcomes` (fields, dtypes, lengths): for a caller that treats a
    damaged file as absent. The comparison reads through :func:`read_outcomes`, which names
    the damage instead."""
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


Outcomes = dict[str, np.ndarray]
#: A cell of the loaded frame: (suite, cell id).
CellKey = tuple[str, str]


class OutcomesFinder:
    """The outcomes of the done cells of ``cells`` (the reporter's frame of the results in
    ``results_dir``) that each paired-table row compares, each file read once and checked
    against its record's test-set size (:func:`read_outcomes`).

    Of two cells of one configuration and seed (the same configuration in two suites) the
    first with outcomes is used. A damaged file raises
    :class:`~harness.contract.outcomes.DamagedOutcomes` when it is first needed."""

    def __init__(self, results_dir: Path, cells: pd.DataFrame, reference_method: str) -> None:
        self.results_dir, self.reference_method = Path(results_dir), reference_method
        self.done = cells[cells["status"] == "done"] if "status" in cells else cells
        self._cache: dict[CellKey, Outcomes | None] = {}

    def folder(self, key: CellKey) -> Path:
        """The cell's folder (a derived ``single+TS`` row's: its cell's)."""
        return cell_folder(self.results_dir, key[0], key[1].removesuffix(TS_SUFFIX))

    def load(self, key: CellKey) -> Outcomes | None:
        """The outcomes of one cell (a ``single+TS`` row's: its cell's calibrated view)."""
        if key not in self._cache:
            suite, cell_id = key
            if cell_id.endswith(TS_SUFFIX):
                base = self.load((suite, cell_id.removesuffix(TS_SUFFIX)))
                self._cache[key] = None if base is None else calibrated_view(base)
            else:
                folder = self.folder(key)
                record = usable_record(folder)
                count = record_image_count(record) if record is not None else None
                self._cache[key] = read_outcomes(folder, count, record)
        return self._cache[key]

    def found(
        self, row: Mapping[str, Any], reference: bool
    ) -> list[tuple[CellKey, Outcomes] | None]:
        """Per paired seed of ``row`` (in seed order), the cell of that side used and its
        outcomes, or None for a seed whose cells have none."""
        done = self.done
        method = self.reference_method if reference else row["method"]
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
        out: list[tuple[CellKey, Outcomes] | None] = []
        for seed in (int(s) for s in str(row["seeds"]).split(",")):
            found = None
            for suite, cell_id in zip(
                *(mine.loc[mine["seed"] == seed, k] for k in ("suite", "cell_id"))
            ):
                key = (str(suite), str(cell_id))
                outcomes = self.load(key)
                if outcomes is not None:
                    found = (key, outcomes)
                    break
            out.append(found)
        return out

    def find(self, row: Mapping[str, Any], reference: bool) -> list[Outcomes | None]:
        """For :func:`reports.stats.bootstrap.bootstrap_rows`: ``(paired-table row, reference
        side?)`` → the outcomes of that side's cells at the row's paired seeds, in seed order
        (None for a seed whose cell has none)."""
        return [None if f is None else f[1] for f in self.found(row, reference)]

    def check_counts(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Read every outcomes file ``rows`` compare and check that the cells of each row were
        scored on one test set, before any resampling.

        Raises:
            DamagedOutcomes: a file is damaged or disagrees with its record.
            UsageError: two cells of one comparison hold different numbers of images (one
                line naming both folders and both counts).
        """
        from reports.stats.bootstrap import supports

        for row in rows:
            if not supports(str(row["metric"])):
                continue
            present = [f for side in (False, True) for f in self.found(row, side) if f]
            if not present:
                continue
            key, first = present[0]
            n = len(first["correct"])
            for other, outcomes in present[1:]:
                if len(outcomes["correct"]) != n:
                    raise UsageError(
                        f"{self.folder(other) / OUTCOMES_FILE}: holds "
                        f"{len(outcomes['correct'])} images, but {self.folder(key)} in the "
                        f"same comparison ({row['method']} against {self.reference_method}, "
                        f"{row['dataset']}) holds {n}: compare only cells scored on one test set"
                    )


def outcomes_finder(
    results_dir: Path, cells: pd.DataFrame, reference_method: str
) -> Callable[[Mapping[str, Any], bool], list[Outcomes | None]]:
    """:meth:`OutcomesFinder.find` of a new :class:`OutcomesFinder`."""
    return OutcomesFinder(results_dir, cells, reference_method).find


def with_image_bootstrap(
    path: Path,
    cells: pd.DataFrame,
    reference: str,
    table: pd.DataFrame,
    level: float = 0.95,
    replicates: int = 2000,
    *,
    holm: bool | None = None,
    alpha: float = 0.05,
) -> pd.DataFrame:
    """``table`` (a paired table of the results in ``path``, :func:`paired_differences
    <reports.stats.paired.paired_differences>` of ``cells`` against ``reference``) with the seeds
    × images columns (:func:`reports.stats.bootstrap.bootstrap_rows`: the variance-components
    interval, issue 59): ``boot_se``, ``boot_lo``, ``boot_hi``, ``boot_p``, ``df``,
    ``n_images`` and ``boot_note``, and the marks resting on ``boot_p``: ``boot_p_adjusted`` and
    ``boot_significant`` (:func:`reports.stats.bootstrap.image_marks`).

    Args:
        replicates: accepted and checked for existing callers; nothing is drawn.
        holm: Holm-adjust ``boot_p`` over the table; None: as the table's t-marks were
            (its ``p_adjusted`` differs from ``p_value``, or would not change under Holm).
        alpha: the marks' level (the paired table's default).

    Raises:
        DamagedOutcomes: a compared cell's ``outcomes.npz`` is damaged or holds another number
            of images than its record was scored on.
        UsageError: two cells of one comparison hold different numbers of images.
        ValueError: a level or replicates the bootstrap cannot use
            (:func:`reports.stats.bootstrap.argument_problems`).
    """
    from reports.stats.bootstrap import COLUMNS, argument_problems, bootstrap_rows, image_marks
    from reports.stats.paired import parse_reference

    if problems := argument_problems(level, replicates):  # before any file is read
        raise ValueError("; ".join(problems))
    finder = OutcomesFinder(path, cells, parse_reference(reference)[0])
    rows = table.to_dict("records")
    finder.check_counts(rows)  # every file read and checked before the first interval
    extra = pd.DataFrame(bootstrap_rows(rows, finder.find, level=level, replicates=replicates),
                         index=table.index, columns=list(COLUMNS))  # fmt: skip
    out = pd.concat([table, extra], axis=1)
    if holm is None:
        holm = _holm_applied(table)
    out["boot_p_adjusted"], out["boot_significant"] = image_marks(out, holm, alpha)
    return out


def _holm_applied(table: pd.DataFrame) -> bool:
    """Whether the paired table's ``p_adjusted`` is Holm's adjustment of its ``p_value`` (for a
    caller that did not say): True unless it equals the raw p-values where Holm would have
    changed them. Where Holm changes none of them (one row, or every p 0 or 1) either reading
    fits, and the adjusted one is taken: it can only raise the image p-values."""
    from reports.stats.significance import holm

    if "p_adjusted" not in table or "p_value" not in table or table.empty:
        return False
    raw = table["p_value"].to_numpy(dtype=float)
    given = table["p_adjusted"].to_numpy(dtype=float)
    return not (np.allclose(given, raw, equal_nan=True)
                and not np.allclose(holm(raw), raw, equal_nan=True))  # fmt: skip
