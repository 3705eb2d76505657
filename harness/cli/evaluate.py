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

from harness.contract import Cell, DamagedRecord, is_cell_dir, read_manifest, read_record
from harness.contract.errors import DamagedFile, UsageError
from harness.data._machinery.base import default_data_root
from harness.engine.reevaluate import NotTheRecordsWeights, reevaluate_cell
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

    ``add_only``: keep every value the records hold, add only the metrics they lack
    (:func:`harness.engine.reevaluate.reevaluate_cell`)."""
    from tqdm.auto import tqdm

    manifest = read_manifest(results_dir)
    evaluation = None
    if suite_path or manifest.get("source"):
        from harness.config.parse import load_suite

        path = suite_path or manifest["source"]
        if suite_path and not Path(suite_path).is_file():  # asked for by name: never ignored
            from harness.config.includes import SuiteError

            raise SuiteError([f"--suite {suite_path}: suite file not found"])
        if Path(path).exists():
            evaluation = load_suite(path).evaluation
    root = default_data_root(data_root)
    done = 0
    missed: list[str] = []  # cells asked for that could not be evaluated
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
    bar = tqdm(cell_dirs, desc="re-evaluating", unit="cell")
    for cell_dir in bar:
        try:
            if (found := _done_cell(cell_dir)) is None:
                continue
            rec, cell = found
            if evaluation is not None:
                cell = dataclasses.replace(cell, evaluation=evaluation)
                text = json.dumps(cell.to_json(), indent=1) + "\n"
                atomic_write_text(cell_dir / "cell.json", text)
            try:
                if reevaluate_cell(cell, cell_dir, rec, root, add_only) is None:
                    raise NotEvaluable(f"{cell_dir.name}: leased by another process, skipped")
            except (DamagedFile, NotTheRecordsWeights) as exc:  # the record stays as it is
                raise NotEvaluable(f"warning: {exc}; skipped") from None
        except NotEvaluable as exc:
            bar.write(str(exc), file=sys.stderr)  # a line of its own, not after the bar
            missed.append(cell_dir.name)
            continue
        done += 1
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


def cmd_evaluate(args) -> int:
    """``harness evaluate RESULTS``: re-evaluate the done cells from their final weights."""
    from harness.config.validator import require_results

    return reevaluate(
        require_results(Path(args.results_dir)), args.suite, args.data_root, args.add_only
    )
