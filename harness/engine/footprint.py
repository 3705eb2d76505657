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
    from harness.registry import DATASETS

    spec = DATASETS.get(cell.dataset)
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            model, _ = build_model(cell, spec)
        return _state_sizes(model)
    except Exception:  # e.g. a conversion that copies data: its backbone is a lower bound
        pass
    return _backbone_sizes(cell)


def _backbone_sizes(cell: Cell) -> tuple[int, int, int] | None:
    """:func:`_state_sizes` of the cell's plain backbone on the ``meta`` device (None when its
    builder needs real tensors)."""
    from harness.registry import BACKBONES, DATASETS

    spec = DATASETS.get(cell.dataset)
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


#: Distinct models :func:`largest_footprint` sizes at most (~20–70 ms each): a sweep of a
#: thousand τ values is one model size, and the pre-flight check must stay cheap for it.
MAX_SIZED = 64


#: :func:`surely_fits`' margin over M plain backbones with AdamW's two moments: wide enough
#: for every built-in method (Packed-Ensembles at α = 2 holds about M backbones' parameters).
MARGIN = 4


def surely_fits(cells: list[Cell], free: int) -> bool:
    """Whether ``free`` bytes hold any cell's checkpoint and record by a wide margin, judged
    from the plain backbones alone (:data:`MARGIN` × M backbones × weights and two moments).
    Building the methods imports them (torch-uncertainty: seconds), which a run whose results
    folder has gigabytes free should not pay before its first cell."""
    bound = 0
    seen: set[str] = set()
    for cell in cells:
        key = repr((cell.backbone, sorted(cell.backbone_kwargs.items()), cell.dataset))
        if key in seen:
            continue
        seen.add(key)
        size = _backbone_sizes(cell)
        if size is None:
            return False
        bound = max(bound, MARGIN * max(c.M for c in cells) * 3 * size[0] + RECORD_BYTES)
    return bound <= free


def largest_footprint(cells: list[Cell], limit: int = MAX_SIZED) -> Footprint | None:
    """The largest :func:`footprint` among ``cells``: each distinct model (method, backbone
    and its options, dataset, M, hyper-parameters, optimizer) sized once, the first ``limit``
    of them in the grid's order."""
    best: Footprint | None = None
    seen: set[str] = set()
    for cell in cells:
        if len(seen) >= limit:
            break
        model = (cell.method, cell.backbone, sorted(cell.backbone_kwargs.items()), cell.dataset)
        key = repr((*model, cell.M, sorted(cell.hparams.items()), cell.recipe.optimizer))
        if key in seen:
            continue
        seen.add(key)
        fp = footprint(cell)
        if fp is not None and (best is None or fp.total > best.total):
            best = fp
    return best
