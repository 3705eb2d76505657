"""``harness evaluate``: re-evaluate finished cells from their saved final weights.

When a suite gains an OOD set or a corruption, its cells keep their ids (the evaluation block is
not part of the id), so their records can be brought up to date without retraining. This module
picks the cells and the evaluation block; each cell is re-evaluated by
:func:`harness.engine.reevaluate.reevaluate_cell`, which loads weights as the runner does.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from harness.contract import Cell, DamagedRecord, is_cell_dir, read_manifest, read_record
from harness.contract.errors import DamagedFile, UsageError
from harness.data._machinery.base import default_data_root
from harness.engine.build import record_evaluation
from harness.engine.reevaluate import NotTheRecordsWeights, kept_calibration, reevaluate_cell
from harness.storage.records import atomic_write_text


class NotEvaluable(Exception):
    """A cell ``harness evaluate`` was asked for (its record is done, or damaged) that it cannot
    evaluate; the message is the one line that says why."""


def _done_cell(cell_dir: Path) -> tuple[dict, Cell] | None:
    """(record, cell) of a done cell with weights; None for a cell evaluation does not ask for
    (pending, failed: ``harness run`` finishes those; a record of a model evaluated from outside
    the harness, whose weights the harness never had).

    Raises:
        NotEvaluable: a damaged record or ``cell.json``, or no ``final.pt``.
    """
    try:
        rec = read_record(cell_dir)
    except DamagedRecord as exc:
        raise NotEvaluable(f"warning: {exc}; skipped (`harness run` redoes it)") from None
    if rec is None or rec["status"] != "done":
        return None
    if (rec.get("diagnostics") or {}).get("external"):
        return None  # a model from outside the harness: no weights here (harness.api.evaluate)
    if not (cell_dir / "final.pt").exists():
        raise NotEvaluable(f"{cell_dir.name}: no final.pt, skipped")
    try:
        return rec, Cell.from_json(json.loads((cell_dir / "cell.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError: ValueError
        raise NotEvaluable(
            f"warning: {cell_dir / 'cell.json'}: unreadable ({exc}); skipped"
        ) from None


def unloaded_metrics(cell_dirs: list[Path]) -> dict[str, list[str]]:
    """The computed metrics the records declare (``metrics.declared``) that no loaded plugin
    registers now, each with the cells that hold it: a full re-evaluation would replace their
    metrics without them."""
    from harness.registry import computed_metrics

    loaded = {spec.key for spec in computed_metrics()}
    missing: dict[str, list[str]] = {}
    for cell_dir in cell_dirs:
        try:
            rec = read_record(cell_dir)
        except DamagedRecord:
            continue  # said, and skipped, when its turn comes
        for decl in ((rec or {}).get("metrics") or {}).get("declared") or []:
            key = decl.get("key") if isinstance(decl, dict) else None
            if key and key not in loaded:
                missing.setdefault(key, []).append(cell_dir.name)
    return missing


def suite_mismatch(suite: Any, cell: Cell, cell_dir: Path) -> str | None:
    """Why ``suite`` does not describe ``cell`` (a record's cell), or None when the cell is one
    of its cells: the suite's name, then the first of dataset, backbone, method, M, seed,
    hyper-parameters, backbone arguments and training recipe that no suite cell shares with it.
    Evaluating a record with another suite's evaluation block would add that suite's sets to a
    cell it never described."""
    if cell.suite != suite.name:
        return (f"{cell_dir.name}: a cell of suite {cell.suite!r}, not of {suite.name!r} "
                f"({suite.source})")  # fmt: skip
    mine = cell.identity_config()
    candidates = [c.identity_config() for c in suite.cells()]
    for key in ("dataset", "backbone", "method", "M", "seed", "hparams", "backbone_kwargs",
                "recipe"):  # fmt: skip
        same = [c for c in candidates if c[key] == mine[key]]
        if not same:
            if key == "recipe":
                diff = sorted(k for k in mine[key] if any(c[key].get(k) != mine[key][k]
                                                         for c in candidates))  # fmt: skip
                return (f"{cell_dir.name}: trained with another recipe than suite "
                        f"{suite.name!r}'s cells (differing: {', '.join(diff[:4])})")  # fmt: skip
            values = sorted({json.dumps(c[key], sort_keys=True) for c in candidates})
            return (f"{cell_dir.name}: {key} {json.dumps(mine[key], sort_keys=True)} is not one "
                    f"of suite {suite.name!r}'s cells' ({', '.join(values[:6])})")  # fmt: skip
        candidates = same
    return None


def _cells_to_evaluate(cell_dirs: list[Path]) -> tuple[list[tuple[Path, dict, Cell]], list[str]]:
    """The done cells to evaluate, each (folder, record, cell), and the warning lines of those
    asked for that cannot be (read before any cell is evaluated)."""
    todo, missed = [], []
    for cell_dir in cell_dirs:
        try:
            if (found := _done_cell(cell_dir)) is not None:
                todo.append((cell_dir, *found))
        except NotEvaluable as exc:
            missed.append((cell_dir.name, str(exc)))
    return todo, missed


def limit_mismatch(todo: list[tuple[Path, dict, Cell]], limit: int | None) -> str | None:
    """Why ``--add-only`` cannot add to these records: one was scored with another
    ``evaluation.limit`` than ``limit`` (metrics of two test subsets in one record), or None."""
    for cell_dir, rec, _ in todo:
        was = (rec.get("evaluation") or {}).get("limit") or None
        if was != limit:

            def shown(v: int | None) -> str:
                return f"evaluation.limit={v}" if v else "the whole test set"

            return (
                f"cannot add to {cell_dir.name}, scored on {shown(was)}, metrics of "
                f"{shown(limit)}: run harness evaluate without --add-only to re-score it whole"
            )
    return None


def reevaluate(
    results_dir: Path,
    suite_path: str | None = None,
    data_root: str | None = None,
    add_only: bool = False,
) -> int:
    """Re-evaluate every done cell of a results folder; returns a process exit status: 0 when
    every cell asked for (a done record, or a damaged one) was evaluated, or none was; 1, after
    one line naming them, when any could not be (no or damaged weights, a damaged record or
    ``cell.json``, leased by another process). Their records are left as they were.

    The suite (``--suite``, else the one the results folder was run from) must describe every
    cell evaluated (:func:`suite_mismatch`): the first that it does not is named and nothing is
    written (:class:`UsageError`).

    ``add_only``: keep every value the records hold, add only the metrics they lack
    (:func:`harness.engine.reevaluate.reevaluate_cell`)."""
    # Length: every check before the first cell (plugins, records, the suite against each
    # cell), then the loop and its summary lines; split, the order of the checks is harder to see.
    from tqdm.auto import tqdm

    suite = _suite_of(results_dir, suite_path)
    root = default_data_root(data_root)
    cell_dirs = [
        d for d in sorted(p.parent for p in Path(results_dir).glob("*/record.json"))
        if is_cell_dir(d)
    ]  # fmt: skip
    if not add_only and (missing := unloaded_metrics(cell_dirs)):
        # Checked before the first cell: re-evaluated without its plugin, a record would lose
        # the metric's values and declaration (--add-only keeps every value a record has).
        named = "; ".join(f"{key} ({len(cells)} cells, e.g. {cells[0]})"
                          for key, cells in sorted(missing.items()))  # fmt: skip
        raise UsageError(
            f"{results_dir}: the records hold metrics that no loaded plugin computes: {named}; "
            "re-evaluating would drop them. Load the plugin that registers them (--plugin "
            "MODULE or $HARNESS_PLUGINS), or pass --add-only, which keeps every value"
        )
    todo, unreadable = _cells_to_evaluate(cell_dirs)
    if suite is not None:
        for cell_dir, _, cell in todo:
            if (why := suite_mismatch(suite, cell, cell_dir)) is not None:
                flag = "--suite" if suite_path else "the suite it was run from"
                raise UsageError(f"{results_dir}: {flag} ({suite.source}) does not describe "
                                 f"these records: {why}; nothing was evaluated")  # fmt: skip
    if add_only and suite is not None and (why := limit_mismatch(todo, suite.evaluation.limit)):
        raise UsageError(f"{results_dir}: --add-only {why}; nothing was evaluated")
    done, notes = 0, 0
    missed = [name for name, _ in unreadable]
    for _, line in unreadable:
        print(line, file=sys.stderr)
    bar = tqdm(todo, desc="re-evaluating", unit="cell")
    for cell_dir, rec, cell in bar:
        if suite is not None:
            cell = dataclasses.replace(cell, evaluation=suite.evaluation)
        try:
            new = reevaluate_cell(cell, cell_dir, rec, root, add_only)
        except (DamagedFile, NotTheRecordsWeights) as exc:  # the record stays as it is
            new = None
            bar.write(f"warning: {exc}; skipped", file=sys.stderr)
        else:
            if new is None:
                bar.write(f"{cell_dir.name}: leased by another process, skipped", file=sys.stderr)
        if new is None:
            missed.append(cell_dir.name)
            continue
        if not add_only and suite is not None:  # the cell's evaluation is now the suite's
            atomic_write_text(cell_dir / "cell.json", json.dumps(cell.to_json(), indent=1) + "\n")
        old_block, old_metrics = rec.get("evaluation"), rec.get("metrics") or {}
        why = add_only and kept_calibration(old_block, record_evaluation(cell), old_metrics)
        if why:
            notes += 1
            if notes == 1:
                bar.write(f"note: {cell_dir.name}: {why}", file=sys.stderr)
        done += 1
    if notes > 1:
        print(f"note: the same in {notes - 1} more cells", file=sys.stderr)
    verb = "completed" if add_only else "re-evaluated"
    print(f"{verb} {done} cells in {results_dir}")
    if missed:
        print(
            f"error: {len(missed)} of {done + len(missed)} cells asked for could not be "
            f"evaluated (their records are unchanged): {' '.join(missed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _suite_of(results_dir: Path, suite_path: str | None) -> Any:
    """The suite whose evaluation block applies: ``--suite``, else the file the results folder
    was run from when it still exists, else None (each cell's own ``cell.json``)."""
    manifest = read_manifest(results_dir)
    path = suite_path or manifest.get("source")
    if not path:
        return None
    from harness.config.parse import load_suite

    if suite_path and not Path(suite_path).is_file():  # asked for by name: never ignored
        from harness.config.includes import SuiteError

        raise SuiteError([f"--suite {suite_path}: suite file not found"])
    return load_suite(path) if Path(path).exists() else None


def cmd_evaluate(args) -> int:
    """``harness evaluate RESULTS``: re-evaluate the done cells from their final weights."""
    from harness.config.validator import require_results

    return reevaluate(
        require_results(Path(args.results_dir)), args.suite, args.data_root, args.add_only
    )
