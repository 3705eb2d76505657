"""Training: optimizer, schedule and one epoch of the shared recipe, for any method.

The loss is the mean over members of the cross-entropy of each member's logits (every member is
trained on its own prediction, as in deep ensembles), plus the method's own regularizer (σN-Ens's
L_div) when it has one. A non-finite or exploding loss raises :class:`DivergenceError`, which the
runner records as the cell's failure reason.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.suite import Recipe
from methods.base import EnsembleModel


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
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Task loss + regularizer.

    The task loss is each member's mean cross-entropy, combined over members as the method
    declares (``EnsembleModel.member_loss``): ``"mean"`` for ensembles whose members share
    weights (the shared weights then get a single model's gradient scale), ``"sum"`` for
    members with separate weights trained as if alone (deep ensembles, MIMO's subnetworks), so
    that each member follows the recipe's learning rate instead of 1/M of it.

    Returns:
        total loss, member logits (M, B', K), the regularizer value (or None).
    """
    logits, targets = model.training_outputs(x, y)  # (M, B', K), (M, B')
    per_member = (
        F.cross_entropy(
            logits.flatten(0, 1).float(),
            targets.flatten(),
            label_smoothing=recipe.label_smoothing,
            reduction="none",
        )
        .view(targets.shape)
        .mean(1)
    )  # (M,)
    task = per_member.sum() if model.member_loss == "sum" else per_member.mean()
    reg = model.regularizer()
    return (task if reg is None else task + reg), logits, reg


def train_epoch(
    model: EnsembleModel,
    loader: Any,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    recipe: Recipe,
    device: torch.device,
    progress: Any = None,
) -> dict[str, float]:
    """One pass over ``loader``; returns mean loss, regularizer and training accuracy."""
    model.train()
    total = reg_total = correct = seen = 0.0
    steps = 0
    for x, y in loader:
        with autocast(device, recipe):
            loss, logits, reg = ensemble_loss(model, x, y, recipe)
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
        with torch.no_grad():
            pred = logits.float().softmax(-1).mean(0).argmax(-1)  # (B',) when members share x
            if pred.shape[0] == y.shape[0]:
                correct += (pred == y).sum().item()
                seen += y.shape[0]
        steps += 1
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{value.item():.3f}")
    return {
        "train_loss": total / max(steps, 1),
        "train_reg": reg_total / max(steps, 1),
        "train_acc": correct / seen if seen else float("nan"),
        "steps": steps,
    }
