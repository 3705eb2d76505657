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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from harness.contract import RECORD_FILE, Cell, new_record, set_aside
from harness.contract.outcomes import OUTCOMES_FILE
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
        outputs: ``"logits"`` or ``"probs"`` (probabilities, turned into log-probabilities,
            whose softmax is the same distribution).
    """

    def __init__(
        self,
        model: nn.Module | Callable[[Tensor], Tensor],
        num_classes: int,
        outputs: str = "logits",
    ) -> None:
        super().__init__()
        if isinstance(model, nn.Module):
            self.inner = model
        else:
            self._fn = model
        self.num_classes = num_classes
        self.outputs = outputs
        self.num_members = 0  # known after the first batch (:meth:`probe`)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (B, C, H, W). Returns: logits (M, B, K).

        Raises:
            TypeError, ValueError: the output is not a tensor of the expected shape, or holds
                NaN or infinite values (one device-host synchronisation per batch: evaluation
                only).
        """
        fn = self.inner if hasattr(self, "inner") else self._fn
        out = fn(x)
        if not isinstance(out, Tensor) or not out.is_floating_point():
            what = f"a {out.dtype} tensor" if isinstance(out, Tensor) else type(out).__name__
            raise TypeError(f"the model returned {what}, not a floating-point tensor of "
                            f"{self.outputs}")  # fmt: skip
        shape = tuple(out.shape)
        if out.dim() == 2:
            out = out.unsqueeze(0)  # one model: M = 1
        if out.dim() != 3 or out.shape[1] != x.shape[0] or out.shape[2] != self.num_classes:
            raise ValueError(
                f"the model returned {self.outputs} of shape {shape} for a batch of "
                f"{x.shape[0]}; expected (M, {x.shape[0]}, {self.num_classes}) or "
                f"({x.shape[0]}, {self.num_classes})"
            )
        if not bool(torch.isfinite(out).all()):
            bad = int((~torch.isfinite(out)).sum())
            raise ValueError(
                f"the model returned {bad} NaN or infinite values among {out.numel()} "
                f"{self.outputs} of a test batch: check its weights and that it expects the "
                "dataset's normalised input"
            )
        if self.outputs == "probs":  # log p: its softmax is p again, and finite where p > 0
            return out.clamp_min(torch.finfo(out.dtype).tiny).log()
        return out

    def probe(self, batch: Tensor) -> int:
        """M, from one forward pass on ``batch`` in eval mode.

        Raises:
            ValueError: the model fails on the dataset's input shape (its error, and the shape
                it was given), or its outputs contradict ``outputs`` (probabilities declared as
                logits, or values that are not probabilities declared as such).
            TypeError: the output is not a floating-point tensor.
        """
        self.eval()
        fn = self.inner if hasattr(self, "inner") else self._fn
        with torch.no_grad():
            try:
                raw = fn(batch)
            except Exception as exc:  # the model's own failure: name the input it was given
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise ValueError(
                    f"the model failed on a test batch of shape {tuple(batch.shape)} (B, C, H, W: "
                    f"the dataset's input, normalised): {type(exc).__name__}: {first}"
                ) from exc
            self.num_members = int(self(batch).shape[0])
            if isinstance(raw, Tensor) and raw.is_floating_point():
                check_outputs_kind(raw, self.outputs)
        return self.num_members


#: How far a row may sum from 1 and still be read as probabilities.
_ROW_SUM_TOL = 1e-3


def check_outputs_kind(out: Tensor, outputs: str) -> None:
    """Refuse outputs that contradict what the caller said they are.

    Rows that all lie in [0, 1] and sum to 1 are probabilities: declared as logits, their
    softmax would be scored instead (an NLL near log K). Declared as probabilities, values
    outside [0, 1] or rows not summing to 1 are not.

    Args:
        out: the model's output on one batch, ``(M, B, K)`` or ``(B, K)``.
        outputs: ``"logits"`` or ``"probs"``.
    """
    x = out.detach().double()
    lo, hi = float(x.min()), float(x.max())
    worst = float((x.sum(-1) - 1).abs().max())
    is_probs = lo >= 0 and hi <= 1 and worst <= _ROW_SUM_TOL
    if outputs == "logits" and is_probs:
        raise ValueError(
            "outputs='logits', but the model returned probabilities (every row in [0, 1], "
            "summing to 1): pass outputs='probs', or return logits"
        )
    if outputs == "probs" and not is_probs:
        raise ValueError(
            f"outputs='probs', but the model's values are not probabilities (min {lo:.3g}, max "
            f"{hi:.3g}, max |row sum - 1| {worst:.3g}): pass outputs='logits' if they are logits"
        )


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
    outputs: str = "logits",
    replaces: Sequence[Path] = (),
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
        outputs: what the model returns, ``"logits"`` or ``"probs"``.
        replaces: folders of earlier outside-model records this one replaces: their
            ``record.json`` and ``outcomes.npz`` are renamed ``*.replaced-<time>`` (never
            deleted) once the evaluation has succeeded, before the new files are written.

    Returns:
        The record, the per-image outcomes (``harness.contract.outcomes``) and the cell's
        folder (None when not written).

    Raises:
        DataMissingError: the dataset (or an OOD set) is not on this machine.
        TypeError, ValueError: the model's output is not logits of the dataset's classes.
    """
    wall0, cpu0, started = time.perf_counter(), time.process_time(), now()
    spec, splits = load_data(cell, data_root)
    wrapped = ExternalEnsemble(model, spec.num_classes, outputs)
    batch = first_batch(splits["test"], spec, cell.recipe, device)
    cell = external_cell(cell, wrapped.probe(batch))
    rec = new_record(cell, environment(device), started)
    rec["evaluation"] = record_evaluation(cell)
    seed_everything(cell.seed)  # the evaluation's draws (a stochastic model's) are seeded
    outcomes = OutcomeAccumulator()
    t0 = time.perf_counter()
    rec["metrics"] = evaluate_all(
        wrapped, splits, spec, cell.evaluation, cell.recipe, device, data_root, outcomes,
        progress=progress, cell=cell.label,
    )  # fmt: skip
    eval_s = time.perf_counter() - t0
    rec["cost"] = {"device": device_name(device), **parameters_of(model)}
    if cell.evaluation.cost:
        # A callable the FLOP counter cannot trace simply has no FLOPs in its record.
        with contextlib.suppress(Exception):
            rec["cost"]["flops_per_image"] = flops_per_image(wrapped, batch)
    # Trained outside the harness: no history; the fingerprint names the weights evaluated.
    rec["diagnostics"] = {"external": True, "fingerprint": getattr(cell, "fingerprint", "")}
    rec["timings"] = {"eval_s": eval_s, "total_s": time.perf_counter() - wall0,
                      "cpu_s": time.process_time() - cpu0}  # fmt: skip
    rec["status"] = "done"
    rec["finished_at"] = now()
    arrays = outcomes.arrays()
    cell_dir = None if suite_dir is None else suite_dir / cell.cell_id
    if cell_dir is not None:
        for folder in replaces:  # only now: a failed evaluation leaves the old record in place
            for name in (RECORD_FILE, OUTCOMES_FILE):
                if (folder / name).exists():
                    set_aside(folder / name, why="replaced")
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
