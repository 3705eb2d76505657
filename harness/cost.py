"""Cost of a method: parameters, FLOPs, throughput and peak memory.

Throughput counts *input images* seen by the whole ensemble per second (DESIGN.md §6), measured
after warm-up with device synchronisation before every clock read (as timm's benchmark.py).
FLOPs per image come from ``torch.utils.flop_counter`` on an eval forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.suite import Recipe
from harness.train import autocast, ensemble_loss
from methods.base import BuildContext, EnsembleModel, count_parameters


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parameter_counts(model: EnsembleModel, ctx: BuildContext) -> dict[str, int]:
    """Total, trainable, one plain member, and the overhead of the ensemble over one member."""
    single = count_parameters(ctx.build_backbone())
    total = count_parameters(model)
    return {
        "params_total": total,
        "params_trainable": count_parameters(model, True),
        "params_single": single,
        "params_overhead": total - single,
    }


def flops_per_image(model: EnsembleModel, x: torch.Tensor) -> int:
    """Eval-mode FLOPs of the whole ensemble per input image."""
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops() // x.shape[0])


def timed(fn: Callable[[], Any], device: torch.device, warmup: int, steps: int) -> float:
    """Seconds per call of ``fn`` after ``warmup`` calls, synchronising around the clock."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return (time.perf_counter() - start) / steps


def peak_memory(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak accelerator memory (MiB) of one call of ``fn``; None on CPU."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def throughput(
    model: EnsembleModel,
    x: torch.Tensor,
    y: torch.Tensor,
    recipe: Recipe,
    device: torch.device,
    steps: int = 5,
    warmup: int = 2,
) -> dict[str, Any]:
    """Train-step and eval throughput (images/s) and peak memory on batch ``x``.

    The train step is forward + loss + backward + SGD step on a throw-away optimizer state, so
    the model's weights are restored afterwards.
    """
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-6, momentum=0.9)

    def train_step() -> None:
        model.train()
        with autocast(device, recipe):
            loss, _, _ = ensemble_loss(model, x, y, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    @torch.no_grad()
    def eval_step() -> None:
        model.eval()
        with autocast(device, recipe):
            model(x)

    train_s = timed(train_step, device, warmup, steps)
    peak_train = peak_memory(train_step, device)
    opt.zero_grad(set_to_none=True)  # free the gradients before timing evaluation
    eval_s = timed(eval_step, device, warmup, steps)
    peak_eval = peak_memory(eval_step, device)
    model.load_state_dict(state)
    b = x.shape[0]
    return {
        "train_images_per_s": b / train_s,
        "eval_images_per_s": b / eval_s,
        "peak_train_mem_mib": peak_train,
        "peak_eval_mem_mib": peak_eval,
        "batch_size": b,
    }
