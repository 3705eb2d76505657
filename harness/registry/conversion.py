"""Which trained `single` model a pretrained conversion starts from: the one matching rule and
the one message for a suite without it, shared by the suite's expansion
(:func:`harness.config.suite.with_pretrain`), the validator and the engine's lookup of an old
``cell.json`` in a results folder's manifest (:mod:`harness.engine.pretrain`). It lives in the
registry layer because those three sit in layers that may not import each other
(tests/test_import_graph.py) and the rule needs only a cell and its method's registration.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.contract.config import Cell
from harness.registry import METHODS


def converted_single(cell: Cell, singles: Iterable[Cell], epochs: int) -> Cell | None:
    """The first of ``singles`` (in the caller's order of preference) that ``cell`` converts
    with ``pretrain_epochs: epochs``: a `single` cell of the same dataset, backbone, backbone
    options and seed, trained for ``epochs`` epochs. The one matching rule, used when a suite
    expands (:func:`harness.config.suite.with_pretrain`) and when an old ``cell.json`` without
    the recorded decision is looked up in a results folder's manifest
    (:func:`harness.engine.pretrain.pretraining_cell`)."""
    want = (cell.dataset, cell.backbone, dict(cell.backbone_kwargs), cell.seed, epochs)
    return next(
        (
            s
            for s in singles
            if s.method == "single"
            and (s.dataset, s.backbone, dict(s.backbone_kwargs), s.seed, s.recipe.epochs) == want
        ),
        None,
    )


def missing_single(cell: Cell, epochs: int) -> str:
    """What to do when no `single` cell matches (:func:`converted_single`): one sentence,
    shared by the validator and the manifest lookup."""
    return (
        f"{epochs} converts the suite's `single` model of {epochs} epochs and the suite has "
        f"none: add `single` to the suite's methods with {epochs} epochs (same dataset "
        f"{cell.dataset}, backbone {cell.backbone}, seed {cell.seed}), or give "
        "`pretrained: PATH`"
    )


def pretrain_epochs(cell: Cell) -> int:
    """``pretrain_epochs`` of a cell that converts the suite's `single` model (0: it converts
    nothing, or converts the given ``pretrained`` weights). ``cell`` needs its typed
    hyper-parameters (:func:`harness.registry.resolved` for a cell read from JSON)."""
    if not METHODS.get(cell.method).pretrained_conversion or cell.typed_hparams.pretrained:
        return 0
    return int(cell.typed_hparams.pretrain_epochs or 0)
