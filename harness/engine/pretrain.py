"""Which trained `single` model a pretrained conversion (``pretrain_epochs: N``) starts from.

It is the suite's own `single` cell of the same dataset, backbone (and backbone options) and seed,
trained for N epochs with the suite's base recipe: the converting cell's recipe holds the method's
fine-tuning delta (e.g. a short schedule at a low learning rate), which must not leak into the
pre-training. The decision is made once, when the suite expands, and travels on the cell
(``Cell.pretrain``, :func:`harness.config.suite.with_pretrain`); :func:`single_to_train` reads it.
Only a cell rebuilt from a ``cell.json`` written before the decision was recorded has to look the
cell up in the results folder's manifest (``suite.json``, :func:`pretraining_cell`). The runner
trains that cell under its lease before it converts (an executor may train it earlier, before it
starts the ranks of a multi-process cell).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness.contract import Cell, usable_record
from harness.contract.manifest import SUITE_FILE, read_manifest

WAIT_POLL_S = 5.0


def pretraining_cell(cell: Cell, results_dir: Path, epochs: int) -> Cell:
    """The suite's `single` cell whose trained model ``cell`` converts, looked up in the
    results folder's manifest: for a cell whose ``cell.json`` predates ``Cell.pretrain``. The
    match is the suite expansion's (:func:`harness.registry.conversion.converted_single`); among
    several, a cell of the manifest's latest run (``current``) first, then the lowest id.

    Args:
        cell: The converting cell (its hparams hold ``pretrain_epochs``).
        results_dir: The suite's results folder (holds ``suite.json``).
        epochs: ``pretrain_epochs``.

    Raises:
        ValueError: the suite has no such `single` cell (one line saying what to add).
    """
    from harness.registry.conversion import converted_single, missing_single

    try:
        manifest = read_manifest(results_dir)
    except FileNotFoundError as err:
        raise ValueError(
            f"pretrain_epochs needs the suite's results folder manifest: {err}"
        ) from None
    singles = [
        Cell.from_json(data)
        for entry in (manifest.get("cells") or {}).values()
        if (data := entry.get("cell") or {}).get("method") == "single"
    ]
    current = set(manifest.get("current") or [])
    singles.sort(key=lambda c: (c.cell_id not in current, c.cell_id))  # the latest run first
    found = converted_single(cell, singles, epochs)
    if found is None:
        raise ValueError(
            f"pretrain_epochs: {missing_single(cell, epochs)} "
            f"(no such cell in {results_dir / SUITE_FILE})"
        )
    return found


def single_to_train(cell: Cell, results_dir: Path) -> Cell | None:
    """The suite's `single` cell that ``cell`` converts and that must be trained first, or None
    when ``cell`` converts nothing or starts from given weights: the decision the suite's
    expansion recorded on the cell (``Cell.pretrain``).

    Only methods whose spec declares ``pretrained_conversion`` convert; the hyper-parameter
    names alone never trigger a conversion. ``pretrained: PATH`` (or ``timm:NAME`` /
    ``torchvision:NAME``) needs no training; ``pretrain_epochs: N`` names the suite's `single`
    cell of the same dataset, backbone and seed trained for N epochs.

    Raises:
        ValueError: a cell without the recorded decision (an old ``cell.json``) whose results
            folder has no such `single` cell.
    """
    from harness.registry import resolved
    from harness.registry.conversion import pretrain_epochs

    if cell.pretrain is not None:
        return cell.pretrain
    epochs = pretrain_epochs(resolved(cell))
    return pretraining_cell(cell, results_dir, epochs) if epochs else None


def wait_for_record(
    single: Cell, results_dir: Path, poll_s: float = WAIT_POLL_S
) -> dict[str, Any] | None:
    """``single``'s record once the live process that leases it has written one (polling every
    ``poll_s``), or None when the lease disappears without a record (that process was killed:
    the caller may now take the lease and train it)."""
    from harness.storage.lease import is_stale, read_owner

    cell_dir = Path(results_dir) / single.cell_id
    while True:
        time.sleep(poll_s)
        done = usable_record(cell_dir)  # damaged: not done (its trainer sets it aside)
        if done is not None and done["status"] == "done":
            return done
        owner = read_owner(cell_dir)
        if owner is None or is_stale(owner):
            return None  # no live trainer


def pretrained_state(cell: Cell, results_dir: Path, spec: Any) -> dict[str, Any] | None:
    """Weights to convert for methods that start from a trained single model, once the
    `single` cell :func:`single_to_train` names is done (the caller trains it first and
    :func:`check_trained` its record).

    ``pretrained: PATH`` (or ``timm:NAME`` / ``torchvision:NAME``) loads them, fitted to the
    backbone. ``pretrain_epochs: N`` loads the ``final.pt`` of the suite's own `single` cell of
    the same dataset, backbone and seed trained for N epochs with the suite's base recipe (the
    method's fine-tuning recipe delta does not apply to it). So the pre-trained model of a seed
    is that suite's `single` model of the seed, and the conversion comparison is paired.
    """
    from harness.engine.build import load_backbone_state
    from harness.registry import METHODS, resolved

    if not METHODS.get(cell.method).pretrained_conversion:
        return None
    if given := resolved(cell).typed_hparams.pretrained:
        from harness.backbones._weights import backbone_state

        # Named weights and files alike are fitted to the backbone: a tensor of another shape
        # keeps the seeded initialisation; another architecture fails in one line.
        return backbone_state(given, cell, spec)
    single = single_to_train(cell, results_dir)
    if single is None:
        return None
    return load_backbone_state(results_dir / single.cell_id / "final.pt")


def check_trained(single: Cell, rec: dict[str, Any]) -> None:
    """Raise when ``rec``, the record of the `single` cell to convert, is not ``done``.

    Raises:
        RuntimeError: naming the cell and its failure.
    """
    if rec["status"] != "done":
        raise RuntimeError(
            f"the single cell to convert ({single.label}) failed: "
            f"{(rec.get('error') or {}).get('message', rec['status'])}"
        )
