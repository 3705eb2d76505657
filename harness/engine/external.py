"""A model trained outside the harness, through the benchmark's evaluation.

The same functions as the end of a harness run (:func:`harness.engine.evaluate.evaluate_all`:
clean test set, corruptions, OOD sets, temperature scaling and conformal sets fitted on the
held-out split, per-image outcomes), on the same splits a suite's cells use, and a record of the
same schema, so that the reporter places the model beside the suite's cells. Only what training
would have produced is missing: no history, no training cost.

The model sees what a harness model sees: a float32 batch ``(B, C, H, W)`` at the dataset's
input shape, normalised with its mean and standard deviation (``DATASETS.get(name).mean/std``),
and returns logits, ``(M, B, K)`` for an ensemble of M members or ``(B, K)`` for one model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from harness.contract import Cell, new_record
from harness.data._machinery.base import DatasetSpec, LoaderOptions, Split
from harness.data._machinery.loader import make_loader
from harness.engine.build import load_data, now, record_evaluation, seed_everything
from harness.engine.cost import flops_per_image
from harness.engine.environment import device_name, environment
from harness.engine.evaluate import evaluate_all
from harness.metrics.outcomes import OutcomeAccumulator, save_outcomes
from harness.storage.records import write_record
from methods._base import EnsembleModel

#: The backbone a record of an outside model names unless the caller names one.
EXTERNAL_BACKBONE = "external"


class ExternalEnsemble(EnsembleModel):
    """A user's model or callable as the harness's ensemble interface.

    Args:
        model: an ``nn.Module`` (kept as a submodule: ``eval()`` reaches it) or any callable
            mapping a batch ``(B, C, H, W)`` to logits ``(M, B, K)`` or ``(B, K)``.
        num_classes: K of the dataset (checked on every batch).
    """

    def __init__(self, model: nn.Module | Callable[[Tensor], Tensor], num_classes: int) -> None:
        super().__init__()
        if isinstance(model, nn.Module):
            self.inner = model
        else:
            self._fn = model
        self.num_classes = num_classes
        self.num_members = 0  # known after the first batch (:meth:`probe`)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (B, C, H, W). Returns: logits (M, B, K)."""
        fn = self.inner if hasattr(self, "inner") else self._fn
        out = fn(x)
        if not isinstance(out, Tensor):
            raise TypeError(f"the model returned {type(out).__name__}, not a tensor of logits")
        if out.dim() == 2:
            out = out.unsqueeze(0)  # one model: M = 1
        if out.dim() != 3 or out.shape[1] != x.shape[0] or out.shape[2] != self.num_classes:
            raise ValueError(
                f"the model returned logits of shape {tuple(out.shape)} for a batch of "
                f"{x.shape[0]}; expected (M, {x.shape[0]}, {self.num_classes}) or "
                f"({x.shape[0]}, {self.num_classes})"
            )
        return out

    def probe(self, batch: Tensor) -> int:
        """M, from one forward pass on ``batch`` in eval mode (raises on a wrong output)."""
        self.eval()
        with torch.no_grad():
            self.num_members = int(self(batch).shape[0])
        return self.num_members


def first_batch(split: Split, spec: DatasetSpec, recipe: Any, device: torch.device) -> Tensor:
    """One evaluation batch of ``split`` as the model will see it."""
    loader = make_loader(
        split.subset(torch.arange(min(len(split), 8))),
        LoaderOptions(8, device, spec.mean, spec.std),
    )
    return next(iter(loader))[0]


def external_cell(cell: Cell, num_members: int) -> Cell:
    """``cell`` with the M the model showed (the record's configuration)."""
    return dataclasses.replace(cell, M=num_members)


def evaluate_external(
    model: nn.Module | Callable[[Tensor], Tensor],
    cell: Cell,
    data_root: Path,
    device: torch.device,
    suite_dir: Path | None = None,
    progress: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], Path | None]:
    """Evaluate ``model`` on ``cell``'s dataset, splits and evaluation.

    Args:
        model: the user's model (module or callable), already on ``device``.
        cell: its configuration: dataset, recipe (held-out splits, eval batch size,
            precision), evaluation, seed (of the evaluation's own draws), ``method`` the
            model's name, ``backbone`` what the report groups it under. ``M`` is replaced by
            what the model returns.
        suite_dir: the results folder to write the cell's ``record.json`` and
            ``outcomes.npz`` to, in ``<suite_dir>/<cell id>`` (None: nowhere).
        progress: show the evaluation's progress bar.

    Returns:
        The record, the per-image outcomes (``harness.contract.outcomes``) and the cell's
        folder (None when not written).

    Raises:
        DataMissingError: the dataset (or an OOD set) is not on this machine.
        TypeError, ValueError: the model's output is not logits of the dataset's classes.
    """
    wall0, cpu0, started = time.perf_counter(), time.process_time(), now()
    spec, splits = load_data(cell, data_root)
    wrapped = ExternalEnsemble(model, spec.num_classes)
    batch = first_batch(splits["test"], spec, cell.recipe, device)
    cell = external_cell(cell, wrapped.probe(batch))
    rec = new_record(cell, environment(device), started)
    rec["evaluation"] = record_evaluation(cell)
    seed_everything(cell.seed)  # the evaluation's draws (a stochastic model's) are seeded
    outcomes = OutcomeAccumulator()
    t0 = time.perf_counter()
    rec["metrics"] = evaluate_all(
        wrapped, splits, spec, cell.evaluation, cell.recipe, device, data_root, outcomes,
        progress=progress,
    )  # fmt: skip
    eval_s = time.perf_counter() - t0
    rec["cost"] = {"device": device_name(device), **parameters_of(model)}
    if cell.evaluation.cost:
        # A callable the FLOP counter cannot trace simply has no FLOPs in its record.
        with contextlib.suppress(Exception):
            rec["cost"]["flops_per_image"] = flops_per_image(wrapped, batch)
    rec["diagnostics"] = {"external": True}  # trained outside the harness: no history
    rec["timings"] = {"eval_s": eval_s, "total_s": time.perf_counter() - wall0,
                      "cpu_s": time.process_time() - cpu0}  # fmt: skip
    rec["status"] = "done"
    rec["finished_at"] = now()
    arrays = outcomes.arrays()
    cell_dir = None if suite_dir is None else suite_dir / cell.cell_id
    if cell_dir is not None:
        cell_dir.mkdir(parents=True, exist_ok=True)
        save_outcomes(cell_dir, arrays)  # before the record, as a run writes them
        write_record(cell_dir, rec)
    return rec, arrays, cell_dir


def parameters_of(model: Any) -> dict[str, int]:
    """``params_total`` and ``params_trainable`` of an ``nn.Module`` (nothing for a callable)."""
    if not isinstance(model, nn.Module):
        return {}
    params = list(model.parameters())
    return {
        "params_total": sum(p.numel() for p in params),
        "params_trainable": sum(p.numel() for p in params if p.requires_grad),
    }
