"""Training: optimizer, schedule and one epoch of the shared recipe, for any method.

The task loss is each member's cross-entropy on the rows the method says it trained on
(:class:`methods._base.TrainOutput`), combined over members as the method declares ("mean" or
"sum"), plus the method's own regularizer (σN-Ens's L_div) when it has one. A non-finite or
exploding loss raises :class:`DivergenceError`, which the runner records as the cell's failure
reason.

The training step never waits for the device: losses, regularizer values and correct counts are
written into a device-side record of the last ``sync_every`` steps (:data:`SYNC_EVERY` by default)
and brought to the host in one read when the record is full and at the end of the epoch. On an
accelerator every host read of a tensor (``.item()``, ``float(t)``, ``bool(t)``) waits until the
queue of launched kernels has drained, so reading the loss every step would stall the launches of
the next step behind it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.contract import Recipe
from methods._base import EnsembleModel, TrainOutput

#: (loss, regularizer, correct (member, row) pairs, rows trained): the device scalars a step
#: returns. The row count is a tensor too, so that a step replayed as a CUDA graph (which runs
#: no Python) still reports it.
StepStats = tuple[Tensor, Tensor, Tensor, Tensor]

# Steps between two host reads of the training statistics. Divergence is then noticed at most 49
# steps late (the step it happened at is still named exactly), and a CIFAR epoch at B=128 (390
# steps) reads 8 times instead of four times per step as a loop reading every loss would.
SYNC_EVERY = 50


class DivergenceError(RuntimeError):
    """The training loss became non-finite or exceeded the recipe's ``max_loss``."""


def make_optimizer(model: EnsembleModel, recipe: Recipe) -> torch.optim.Optimizer:
    """SGD (momentum, optional Nesterov) or AdamW over the method's parameter groups.

    A group's ``lr_scale`` (BatchEnsemble's fast-weight multiplier) sets its learning rate to
    ``lr_scale · recipe.lr``; the schedule then scales every group's rate alike.
    """
    groups = [
        {k: v for k, v in g.items() if k != "lr_scale"}
        | ({"lr": recipe.lr * g["lr_scale"]} if "lr_scale" in g else {})
        for g in model.param_groups(recipe.weight_decay)
    ]
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(
            groups,
            lr=recipe.lr,
            momentum=recipe.momentum,
            nesterov=recipe.nesterov and recipe.momentum > 0,
        )
    return torch.optim.AdamW(groups, lr=recipe.lr)


def lr_factor(step: int, steps_per_epoch: int, recipe: Recipe) -> float:
    """Learning-rate multiplier at optimizer step ``step`` (linear warm-up, then the schedule)."""
    epoch = step / max(steps_per_epoch, 1)
    if recipe.warmup_epochs and epoch < recipe.warmup_epochs:
        return (step + 1) / (recipe.warmup_epochs * steps_per_epoch)
    if recipe.schedule == "cosine":
        span = max(recipe.epochs - recipe.warmup_epochs, 1e-9)
        return 0.5 * (1 + math.cos(math.pi * min((epoch - recipe.warmup_epochs) / span, 1.0)))
    if recipe.schedule == "multistep":
        return recipe.lr_decay ** sum(epoch >= m for m in recipe.milestones)
    return 1.0


def make_scheduler(
    opt: torch.optim.Optimizer, recipe: Recipe, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, steps_per_epoch, recipe)
    )


def autocast(
    device: torch.device, recipe: Recipe, cache: bool = True
) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when the recipe asks for it; a no-op elsewhere. ``cache=False``
    for a step captured as a CUDA graph: PyTorch's CUDA-graph notes ask for autocast's weight
    cache off during capture (a cast cached outside the graph would be replayed stale)."""
    if recipe.amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()


def set_determinism(deterministic: bool) -> None:
    """Make this process's GPU kernels deterministic (``recipe.deterministic``), or not.

    On: cuDNN deterministic algorithms without autotuning (``cudnn.deterministic = True``,
    ``cudnn.benchmark = False``), ``torch.use_deterministic_algorithms(True, warn_only=True)``
    (an op without a deterministic kernel warns instead of failing the cell) and cuBLAS's
    fixed-workspace mode (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, effective when set before the
    process's first cuBLAS call: the runner calls this before it builds the model). Then a
    resumed GPU cell is bit-identical to an uninterrupted one, as it always is on the CPU.
    Off (the default, for speed: deterministic backward kernels of convolutions and
    scatter-adds are slower): torch's defaults, so two GPU runs of a cell may differ in the
    last bits (summation order), never in what they compute. Set per cell, both ways, so one
    cell's choice does not leak into the next cell of the same worker.
    """
    import os

    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def ensemble_loss(
    model: EnsembleModel, x: Tensor, y: Tensor, recipe: Recipe
) -> tuple[Tensor, TrainOutput, Tensor | None]:
    """Task loss + regularizer.

    The task loss is each member's mean cross-entropy over its rows, combined over members with
    the reduction the method returned in its :class:`TrainOutput` (see there for why some
    methods sum and others average).

    Args:
        x: the step's inputs in the layout the method's batch feeding declares.
        y: the matching targets.

    Returns:
        total loss, the method's TrainOutput (logits (M, B', K), targets (M, B')), the
        regularizer value (or None).
    """
    out = model.training_outputs(x, y)
    if not isinstance(out, TrainOutput):
        raise TypeError(
            f"{type(model).__name__}.training_outputs must return a TrainOutput, "
            f"got {type(out).__name__}"
        )
    per_member = (
        F.cross_entropy(
            out.logits.flatten(0, 1).float(),
            out.targets.flatten(),
            label_smoothing=recipe.label_smoothing,
            reduction="none",
        )
        .view(out.targets.shape)
        .mean(1)
    )  # (M,)
    task = per_member.sum() if out.reduction == "sum" else per_member.mean()
    reg = model.regularizer()
    return (task if reg is None else task + reg), out, reg


def gradient_clip_groups(model: Any) -> list[list[Tensor]]:
    """The parameter sets whose gradient norms are clipped apart: the method's
    ``clip_groups()`` (the deep ensemble: one per member, as each member clipped alone), else one
    set. A multi-process cell trains a wrapper whose ``model`` is the method's model."""
    owner = model if hasattr(model, "clip_groups") else getattr(model, "model", None)
    if owner is not None and hasattr(owner, "clip_groups"):
        return [list(g) for g in owner.clip_groups()]
    return [list(model.parameters())]


#: One compiled ``ensemble_loss`` per compile backend: dynamo guards on the model it is called
#: with, so several models share it (each gets its own graphs).
_COMPILED_LOSS: dict[Any, Any] = {}


def step_loss(recipe: Recipe, backend: Any = "inductor") -> Any:
    """The function a training step computes its loss with: :func:`ensemble_loss`, compiled
    with ``torch.compile`` when the recipe says ``compile: true``.

    Compiling the loss, not only ``forward``, puts every method's *training* path in compiled
    graphs (the deep ensemble's per-member batches, BatchEnsemble's and Masksembles' training
    feeding, MIMO's row shuffles, σN-Ens's regulariser), and AOTAutograd compiles its backward
    too; ``model.compile()`` (the runner does it as well) covers ``forward`` for evaluation. A
    compiled row of a table thus compares compiled training steps only.

    Args:
        backend: ``torch.compile``'s backend (tests pass a counting one).
    """
    if not recipe.compile:
        return ensemble_loss
    if backend not in _COMPILED_LOSS:
        _COMPILED_LOSS[backend] = torch.compile(ensemble_loss, backend=backend)
    return _COMPILED_LOSS[backend]


class TrainStep:
    """A cell's training step: forward, task loss and regularizer, backward, gradient clipping,
    optimizer step. Built once per cell and called once per batch.

    It has no side effect in Python that a step replayed as a CUDA graph would miss: what it
    reports are device scalars (:data:`StepStats`), and everything it reads that changes during
    a cell (the learning rate, σN-Ens's τ and λ) lives in device tensors updated in place.

    Args:
        model: the method's model (or the DDP wrapper a multi-process cell trains).
        compile_backend: with ``recipe.compile``, the backend of :func:`step_loss`.
        graphed: the step will be captured as a CUDA graph: autocast's weight cache off (PyTorch's
            CUDA-graph notes: a cast cached outside the graph would be replayed stale).
    """

    def __init__(
        self,
        model: Any,
        opt: torch.optim.Optimizer,
        recipe: Recipe,
        device: torch.device,
        compile_backend: Any = "inductor",
        graphed: bool = False,
    ) -> None:
        self.model, self.opt, self.recipe, self.device = model, opt, recipe, device
        self.graphed = graphed
        self.clip_groups = gradient_clip_groups(model) if recipe.grad_clip else []
        self.loss_fn = step_loss(recipe, compile_backend)
        self.no_reg = torch.zeros((), device=device)

    def __call__(self, x: Tensor, y: Tensor) -> StepStats:
        """One step on (x, y); returns (loss, reg, correct, rows) float32 device scalars."""
        recipe, opt = self.recipe, self.opt
        with autocast(self.device, recipe, cache=not self.graphed):
            loss, out, reg = self.loss_fn(self.model, x, y, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for params in self.clip_groups:  # returns the total norm as a tensor, deliberately not read
            torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
        opt.step()
        reg_value = self.no_reg if reg is None else reg.detach().float()
        rows = torch.full((), float(out.num_rows), device=self.device)  # fixed per input shape
        return loss.detach().float(), reg_value, out.num_correct().float(), rows


def train_epoch(
    model: EnsembleModel,
    loader: Any,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    recipe: Recipe,
    device: torch.device,
    progress: Any = None,
    sync_every: int = SYNC_EVERY,
    compile_backend: Any = "inductor",
    step: Callable[[Tensor, Tensor], StepStats] | None = None,
) -> dict[str, float]:
    """One pass over ``loader``; returns mean loss, regularizer and training accuracy.

    Training accuracy is the fraction of (member, row) pairs whose member predicts the row's
    target, from the targets the method returned (members averaged, not the ensemble's mean
    prediction: members may see different images in one step).

    No step reads a tensor on the host. Each step's loss, regularizer and correct count go into
    a (3, ``sync_every``) device tensor; when it is full, and at the end of the epoch, one read
    brings it to the host, where the statistics are summed, the progress bar's postfix is set
    and divergence is checked. A loss that is non-finite or above ``recipe.max_loss`` raises
    :class:`DivergenceError` naming the first such step, at most ``sync_every - 1`` steps after
    it happened (the weights those steps changed belong to a cell that fails anyway; nothing is
    checkpointed within an epoch). Gradient clipping's returned norm is never read, and the
    learning-rate schedule is a Python function of the step count.

    Args:
        sync_every: steps between two host reads (>= 1); see :data:`SYNC_EVERY`.
        compile_backend: with ``recipe.compile``, the backend of :func:`step_loss` (when
            ``step`` is None).
        step: the cell's step, built once per cell (:func:`harness.engine.graphed.cell_step`):
            a :class:`TrainStep`, or a :class:`harness.engine.graphed.GraphedStep` (CUDA: captured
            once and replayed every epoch). None: a new eager :class:`TrainStep` of ``model``.
    """
    # Length: a third of it is the docstring; the loop keeps the device-side statistics, the
    # host read every sync_every steps and the divergence check together, since split they
    # would pass the same buffers and counters back and forth every step.
    if sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {sync_every}")
    model.train()
    if step is None:
        step = TrainStep(model, opt, recipe, device, compile_backend)
    # rows: loss, regularizer, correct (member, row) pairs, rows trained
    record = torch.zeros(4, sync_every, device=device)
    sums = [0.0, 0.0, 0.0, 0.0]  # the same four, summed over the steps read so far
    steps = pending = 0  # steps in the epoch, steps written since the last read

    def read_record() -> None:
        nonlocal pending
        losses, regs, correct, rows = record[:, :pending].tolist()  # the one read per window
        first = steps - pending
        for i, value in enumerate(losses):
            if not math.isfinite(value) or value > recipe.max_loss:
                raise DivergenceError(
                    f"training loss became {value:.4g} at step {first + i} of this epoch "
                    f"(limit {recipe.max_loss:g}); lower the learning rate or add warm-up"
                )
        for j, values in enumerate((losses, regs, correct, rows)):
            sums[j] += sum(values)
        if progress is not None:
            progress.set_postfix(loss=f"{sum(losses) / len(losses):.3f}")
        pending = 0

    for x, y in loader:
        try:
            stats = step(x, y)
            sched.step()
            with torch.no_grad():
                record[:, pending] = torch.stack(stats)
        except Exception:
            # A step that fails on a diverged model (NaN inputs to a library's own checks)
            # is reported as the divergence it follows, when the record shows one.
            if pending:
                read_record()
            raise
        steps += 1
        pending += 1
        if progress is not None:
            progress.update(1)
        if pending == sync_every:
            read_record()
    if pending:
        read_record()
    seen = sums[3]
    return {
        "train_loss": sums[0] / max(steps, 1),
        "train_reg": sums[1] / max(steps, 1),
        "train_acc": sums[2] / seen if seen else float("nan"),
        "steps": steps,
    }
