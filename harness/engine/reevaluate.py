"""Re-evaluating a finished cell from its saved weights (``harness evaluate``).

The same steps as the end of a run, through the same functions: under the cell's lease (a cell
another process is training or evaluating is left to it), the model built as the runner builds
it, ``final.pt`` loaded by :func:`harness.engine.build.load_trained` (no code runs from the
file; progress-dependent schedules set to the end of training), evaluation seeded as in the
run, and the record rewritten atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.contract import Cell
from harness.engine.build import (
    build_model,
    load_data,
    load_trained,
    now,
    seed_everything,
)
from harness.engine.environment import resolve_device
from harness.engine.evaluate import evaluate_all
from harness.storage.lease import LeaseHeld, acquire
from harness.storage.records import write_record


def reevaluate_cell(
    cell: Cell, cell_dir: Path, record: dict[str, Any], data_root: Path
) -> dict[str, Any] | None:
    """Evaluate ``cell``'s ``final.pt`` with ``cell.evaluation`` and rewrite its record.

    Returns:
        The new record, or None when another live process holds the cell's lease.

    Raises:
        DamagedFile: ``final.pt`` is damaged (the record is left as it was).
    """
    try:
        lease = acquire(cell_dir)
    except LeaseHeld:
        return None
    with lease:
        device = resolve_device(cell.recipe.device)
        spec, splits = load_data(cell, data_root)
        model, _ = build_model(cell, spec, None, device)
        load_trained(cell, cell_dir, model, device)
        seed_everything(cell.seed)  # evaluation draws (MC Dropout) as in the run
        record = dict(record)
        record["metrics"] = evaluate_all(
            model, splits, spec, cell.evaluation, cell.recipe, device, data_root
        )
        record["evaluation"] = cell.to_json()["evaluation"]
        record["finished_at"] = now()
        write_record(cell_dir, record)
        return record
