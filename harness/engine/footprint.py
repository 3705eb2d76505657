"""How much a cell writes into its results folder: its epoch checkpoint and its record, estimated
from the model's size before anything trains (``harness validate`` compares the largest cell's
with the free space of the results folder's file system).

The checkpoint holds the model's state (parameters and buffers) and the optimizer's per-parameter
state (SGD's momentum: one tensor per parameter; AdamW's two moments: two), so it is estimated
as ``state bytes + slots × parameter bytes``. The model is built on PyTorch's ``meta`` device
(shapes only: no memory, no initialisation cost); a method that cannot be built there (one that
copies tensor data while it converts its backbone) is estimated from its plain backbone, one
member's worth, which is below what it writes: a check against it refuses only cells that surely
do not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.contract import Cell

#: What a record, ``cell.json``, ``trained.json`` and the progress files take together, at least
#: (a digits record with corruption and OOD metrics is ~40 KiB; an ImageNet one a few hundred).
RECORD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Footprint:
    """One cell's files: bytes of its checkpoint and record, and the parameters counted."""

    cell: Cell
    checkpoint_bytes: int
    record_bytes: int
    parameters: int

    @property
    def total(self) -> int:
        return self.checkpoint_bytes + self.record_bytes


def _state_sizes(module: torch.nn.Module) -> tuple[int, int, int]:
    """(state-dict bytes, parameter bytes, parameters) of ``module``."""
    state = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    params = [p for p in module.parameters() if p.requires_grad]
    return state, sum(p.numel() * p.element_size() for p in params), sum(p.numel() for p in params)


def _meta_sizes(cell: Cell) -> tuple[int, int, int] | None:
    """:func:`_state_sizes` of the cell's model built on the ``meta`` device (its backbone's
    when the method cannot be built there); None when neither can."""
    from harness.engine.build import build_model
    from harness.registry import BACKBONES, DATASETS

    spec = DATASETS.get(cell.dataset)
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            model, _ = build_model(cell, spec)
        return _state_sizes(model)
    except Exception:  # e.g. a conversion that copies data: its backbone is a lower bound
        pass
    try:
        with torch.device("meta"):
            net = BACKBONES.get(cell.backbone).build(
                spec.in_shape, spec.num_classes or 2, **dict(cell.backbone_kwargs)
            )
        return _state_sizes(net)
    except Exception:  # a builder that needs real tensors: no estimate
        return None


def footprint(cell: Cell) -> Footprint | None:
    """The estimated bytes ``cell`` writes at its peak (None when its model cannot be sized)."""
    sizes = _meta_sizes(cell)
    if sizes is None:
        return None
    state, param_bytes, n = sizes
    slots = 2 if cell.recipe.optimizer == "adamw" else int(cell.recipe.momentum > 0)
    return Footprint(cell, state + slots * param_bytes, RECORD_BYTES, n)


def largest_footprint(cells: list[Cell]) -> Footprint | None:
    """The largest :func:`footprint` among ``cells`` (each distinct model sized once)."""
    best: Footprint | None = None
    seen: set[str] = set()
    for cell in cells:
        model = (cell.method, cell.backbone, sorted(cell.backbone_kwargs.items()), cell.dataset)
        key = repr((*model, cell.M, sorted(cell.hparams.items()), cell.recipe.optimizer))
        if key in seen:
            continue
        seen.add(key)
        fp = footprint(cell)
        if fp is not None and (best is None or fp.total > best.total):
            best = fp
    return best
