"""Re-evaluating a finished cell from its saved weights (``harness evaluate``).

The same steps as the end of a run, through the same functions: under the cell's lease (a cell
another process is training or evaluating is left to it), the model built as the runner builds
it, ``final.pt`` loaded by :func:`harness.engine.build.load_trained` (no code runs from the
file; progress-dependent schedules set to the end of training), evaluation seeded as in the
run, and the record rewritten atomically.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from harness.contract import Cell, set_aside
from harness.contract.outcomes import DamagedOutcomes, record_image_count
from harness.engine.build import (
    build_model,
    load_data,
    load_trained,
    now,
    record_evaluation,
    seed_everything,
)
from harness.engine.environment import resolve_device
from harness.engine.evaluate import evaluate_all
from harness.metrics.outcomes import (
    OUTCOMES_FILE,
    OutcomeAccumulator,
    read_outcomes,
    save_outcomes,
)
from harness.storage.lease import LeaseHeld, acquire
from harness.storage.records import write_record

#: The evaluation fields of post-hoc calibration: what ``add_only`` re-evaluation sets.
CALIBRATION_FIELDS = ("calibrate", "calibration", "calibrate_members", "conformal_alpha")


def add_missing(old: Any, new: Any) -> Any:
    """``old`` with every key of ``new`` it lacks added, recursively; every value ``old`` has is
    kept as it is (lists and numbers are never merged)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for key, value in new.items():
            out[key] = add_missing(old[key], value) if key in old else value
        return out
    return old


def _alphas(value: Any) -> list[float]:
    """``conformal_alpha`` (one α or a list) as a list, to compare two blocks."""
    return [float(a) for a in value] if isinstance(value, list | tuple) else [float(value)]


def kept_calibration(
    old: dict[str, Any] | None, new: dict[str, Any], old_metrics: dict[str, Any]
) -> str | None:
    """Why ``add_only`` keeps a record's calibration group whole, or None when it may add to it.

    The group's temperatures, conformal thresholds and coverages were fitted with the old
    block's ``calibration``, ``calibrate_members`` and ``conformal_alpha``; values computed with
    other settings would sit beside them under one description, so a record that has the group
    keeps it (and its settings) unless the settings are the same. A record without the group
    gets the new one (``new``'s settings computed it)."""
    if "calibration" not in old_metrics or not new.get("calibrate"):
        return None
    old = old or {}
    changed = [
        f"{key} {old.get(key)!r} → {new.get(key)!r}"
        for key in ("calibration", "calibrate_members", "conformal_alpha")
        if (_alphas(old[key]) != _alphas(new[key]) if key == "conformal_alpha" and key in old
            else old.get(key) != new.get(key))
    ]  # fmt: skip
    if not changed:
        return None
    return (
        f"the calibration group was fitted with other settings ({'; '.join(changed)}): kept "
        "as it is (`harness evaluate` without --add-only recomputes it)"
    )


def added_evaluation(
    old: dict[str, Any] | None, new: dict[str, Any], old_metrics: dict[str, Any]
) -> dict[str, Any]:
    """The evaluation block of a record after ``add_only``: it names what the record's metrics
    now hold, never a setting the run did not compute with. The old block; ``new``'s
    calibration settings only when the record had no calibration group (they computed the one
    added) or had one fitted with the same settings; ``ood`` extended by the sets ``new`` adds
    (:func:`add_missing` adds them set by set); ``corruptions`` and ``severities`` taken from
    ``new`` only when the record had no corruption metrics (a corruption block that exists is
    kept whole, so its settings stay too)."""
    out = dict(old or new)
    if "calibration" not in old_metrics and new.get("calibrate"):
        for key in CALIBRATION_FIELDS:
            out[key] = new[key]
    out["ood"] = [
        *out.get("ood", []),
        *(s for s in new.get("ood", []) if s not in out.get("ood", [])),
    ]
    if "corruption" not in old_metrics and new.get("corruptions"):
        out["corruptions"], out["severities"] = new["corruptions"], new["severities"]
    groups = {**(out.get("ood_groups") or {}), **(new.get("ood_groups") or {})}
    if groups:  # the sets' near/far groups, as the dataset declares them
        out["ood_groups"] = groups
    return out


def with_reevaluation(
    timings: dict[str, Any] | None, wall_s: float, cpu_s: float, add_only: bool
) -> dict[str, Any]:
    """``timings`` with one more entry in ``reevaluations`` (``at``, ``wall_s``, ``cpu_s``,
    ``add_only``, ``git_commit``): what ``harness evaluate`` spent on the cell and the code that
    computed what it added, kept beside the training run's own ``train_s``/``eval_s``/``cpu_s``
    and ``environment.git_commit``, which describe the run and stay as they were."""
    from harness.engine.environment import git_commit

    out = dict(timings or {})
    entry = {"at": now(), "wall_s": wall_s, "cpu_s": cpu_s, "add_only": add_only,
             "git_commit": git_commit()}  # fmt: skip
    out["reevaluations"] = [*out.get("reevaluations", []), entry]
    return out


class NotTheRecordsWeights(ValueError):
    """``final.pt`` does not reproduce the record's clean metrics: adding metrics computed from
    it would describe another model than the one the record's numbers come from."""


#: How far a recomputed clean metric may be from the recorded one (relative) and still be the
#: same weights: summation order may differ across machines and thread counts; retrained weights
#: differ far more (a retrained Fashion-MNIST cell: accuracy 0.8436 against the recorded 0.8445).
SAME_MODEL_RTOL = 1e-6


def check_same_model(cell_dir: Path, record: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Raise :class:`NotTheRecordsWeights` unless ``metrics``' clean accuracy and NLL equal the
    record's (to :data:`SAME_MODEL_RTOL`)."""
    old, new = (record.get("metrics") or {}).get("clean") or {}, metrics["clean"]
    for key in ("acc", "nll"):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            continue
        if abs(a - b) > SAME_MODEL_RTOL * max(abs(a), abs(b), 1e-12):
            raise NotTheRecordsWeights(
                f"{cell_dir / 'final.pt'}: not the weights of this record ({key} "
                f"{a:.6g} recorded, {b:.6g} from the file): nothing added"
            )


def _outcomes_state(cell_dir: Path, record: dict[str, Any]) -> tuple[bool, bool]:
    """(usable, damaged) of the cell's ``outcomes.npz``: a file that is there but unreadable,
    of the wrong shape, or of another image count than the record's is damaged (named in one
    warning line), and ``add_only`` writes it again."""
    try:
        usable = read_outcomes(cell_dir, record_image_count(record), record) is not None
    except DamagedOutcomes as exc:
        logging.getLogger("harness").warning("%s", exc)
        return False, True
    return usable, False


def reevaluate_cell(
    cell: Cell,
    cell_dir: Path,
    record: dict[str, Any],
    data_root: Path,
    add_only: bool = False,
) -> dict[str, Any] | None:
    """Evaluate ``cell``'s ``final.pt`` with ``cell.evaluation`` and rewrite its record (and its
    per-image ``outcomes.npz``; with ``add_only``, written only when the cell had none).

    Args:
        add_only: keep every value the record holds and add only the metrics it lacks (post-hoc
            calibration, reliability bins, a new OOD set); ``finished_at`` is kept and the
            evaluation block names what was added (:func:`added_evaluation`). Otherwise
            ``metrics`` is replaced.

    Returns:
        The new record, or None when another live process holds the cell's lease.

    Raises:
        DamagedFile: ``final.pt`` is damaged (the record is left as it was).
        NotTheRecordsWeights: with ``add_only``, ``final.pt`` does not reproduce the record's
            clean metrics (the record is left as it was).
    """
    try:
        lease = acquire(cell_dir)
    except LeaseHeld:
        return None
    with lease:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        device = resolve_device(cell.recipe.device)
        spec, splits = load_data(cell, data_root)
        model, _ = build_model(cell, spec, None, device)
        load_trained(cell, cell_dir, model, device)
        seed_everything(cell.seed)  # evaluation draws (MC Dropout) as in the run
        record = dict(record)
        outcomes = OutcomeAccumulator()
        metrics = evaluate_all(
            model, splits, spec, cell.evaluation, cell.recipe, device, data_root, outcomes,
            cell=cell.label,
        )  # fmt: skip
        evaluation = record_evaluation(cell)
        had_outcomes, damaged = _outcomes_state(cell_dir, record)
        if add_only:
            check_same_model(cell_dir, record, metrics)
            if not had_outcomes:  # the same weights: the outcomes the record's metrics come from
                if damaged:  # renamed, never deleted: written again from the weights
                    set_aside(cell_dir / OUTCOMES_FILE)
                save_outcomes(cell_dir, outcomes.arrays())
            old_metrics = record.get("metrics") or {}
            if kept_calibration(record.get("evaluation"), evaluation, old_metrics):
                metrics = {**metrics, "calibration": old_metrics["calibration"]}
            record["metrics"] = add_missing(old_metrics, metrics)
            if metrics.get("declared"):  # a list add_missing keeps whole: merge it by key
                known = {d.get("key") for d in old_metrics.get("declared") or []}
                record["metrics"]["declared"] = [
                    *(old_metrics.get("declared") or []),
                    *(d for d in metrics["declared"] if d["key"] not in known),
                ]
            record["evaluation"] = added_evaluation(
                record.get("evaluation"), evaluation, old_metrics
            )
            changed = record["metrics"] != old_metrics or not had_outcomes
        else:
            record["metrics"] = metrics
            record["evaluation"] = evaluation
            record["finished_at"] = now()
            if damaged:
                set_aside(cell_dir / OUTCOMES_FILE)
            save_outcomes(cell_dir, outcomes.arrays())
            changed = True
        if changed:  # a re-evaluation's cost is part of the cell's cost; a no-op adds nothing
            record["timings"] = with_reevaluation(
                record.get("timings"), time.perf_counter() - wall0, time.process_time() - cpu0,
                add_only,
            )  # fmt: skip
        write_record(cell_dir, record)
        return record
