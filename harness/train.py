"""Training: optimizer, schedule and one epoch of the shared recipe, for any method.

The task loss is each member's cross-entropy on the rows the method says it trained on
(:class:`methods.base.TrainOutput`), combined over members as the method declares ("mean" or
"sum"), plus the method's own regularizer (σN-Ens's L_div) when it has one. A non-finite or
exploding loss raises :class:`DivergenceError`, which the runner records as the cell's failure
reason.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.contract import Recipe
from methods.base import EnsembleModel, TrainOutput


class DivergenceError(RuntimeError):
    """The training loss became non-finite or exceeded the recipe's ``max_loss``."""


def make_optimizer(model: EnsembleModel, recipe: Recipe) -> torch.optim.Optimizer:
    """SGD (momentum, optional Nesterov) or AdamW over the method's parameter groups."""
    groups = model.param_groups(recipe.weight_decay)
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


def autocast(device: torch.device, recipe: Recipe) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when the recipe asks for it; a no-op elsewhere."""
    if recipe.amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


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


def train_epoch(
    model: EnsembleModel,
    loader: Any,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    recipe: Recipe,
    device: torch.device,
    progress: Any = None,
) -> dict[str, float]:
    """One pass over ``loader``; returns mean loss, regularizer and training accuracy.

    Training accuracy is the fraction of (member, row) pairs whose member predicts the row's
    target, from the targets the method returned (members averaged, not the ensemble's mean
    prediction: members may see different images in one step).
    """
    model.train()
    total = reg_total = seen = 0.0
    correct = torch.zeros((), dtype=torch.long, device=device)
    steps = 0
    for x, y in loader:
        with autocast(device, recipe):
            loss, out, reg = ensemble_loss(model, x, y, recipe)
        value = loss.detach()
        if not torch.isfinite(value) or value.item() > recipe.max_loss:
            raise DivergenceError(
                f"training loss became {value.item():.4g} at step {steps} of this epoch "
                f"(limit {recipe.max_loss:g}); lower the learning rate or add warm-up"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        sched.step()
        total += value.item()
        reg_total += float(reg.detach()) if reg is not None else 0.0
        correct += out.num_correct().to(device)  # stays on the device: no sync per step
        seen += out.num_rows
        steps += 1
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{value.item():.3f}")
    return {
        "train_loss": total / max(steps, 1),
        "train_reg": reg_total / max(steps, 1),
        "train_acc": correct.item() / seen if seen else float("nan"),
        "steps": steps,
    }
