"""What a cell measures besides its metrics, and the loader it trains with.

The training loader (data order by seed, augmentation, one stream per member for methods that
train on independent data) and the cost block of a record: how it was measured (device,
precision, contention), parameters, FLOPs, model and loader throughput. Split out of the cell
runner so that the runner holds only the control flow (lease, train, evaluate, record).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from harness.contract import Cell, Recipe
from harness.data._machinery.base import BatchLoader, DatasetSpec, LoaderOptions, Split
from harness.data._machinery.loader import make_loader
from harness.engine.cost import flops_per_image, parameter_counts, throughput
from harness.engine.environment import device_name
from harness.registry import METHODS, resolved
from methods._base import BuildContext, EnsembleModel


def train_loader(
    cell: Cell,
    spec: DatasetSpec,
    train: Split,
    device: torch.device,
    shard: tuple[int, int] = (0, 1),
) -> BatchLoader:
    """The training loader: shuffled by (seed, epoch), the dataset's (or recipe's) augmentation,
    on the device; the same data order for every method of a seed. ``shard=(rank, world)``
    gives a process of a multi-process cell its block of every global batch."""
    # M batches per step for methods whose members train on independent data.
    streams = METHODS.get(cell.method).batch_feeding(resolved(cell).typed_hparams).streams(cell.M)
    options = training_options(cell.recipe, spec, len(train), device, cell.seed, streams, shard)
    return make_loader(train, options)


def training_options(
    recipe: Recipe,
    spec: DatasetSpec,
    images: int,
    device: torch.device,
    seed: int,
    streams: int = 1,
    shard: tuple[int, int] = (0, 1),
    batch_size: int | None = None,
) -> LoaderOptions:
    """How a cell's training split of ``images`` images is batched (:func:`train_loader`'s, and
    ``harness.api.data``'s ``loader(train=True)``): the recipe's batch (or ``batch_size``),
    shuffled by (seed, epoch), the dataset's augmentation unless the recipe names one, the last
    incomplete batch dropped when there are two full ones, ``streams`` batches per step."""
    batch = recipe.batch_size if batch_size is None else batch_size
    return LoaderOptions(
        batch,
        device,
        spec.mean,
        spec.std,
        augment=spec.augment if recipe.augment == "default" else recipe.augment,
        train=True,
        shuffle=True,
        seed=seed,
        drop_last=images >= 2 * batch,
        channels_last=recipe.channels_last and device.type == "cuda",
        streams=streams,
        shard=shard,
    )


def run_conditions(cell: Cell, device: torch.device, shared_device: bool) -> dict[str, Any]:
    """How the cost numbers were measured: device name, precision, and whether the device was
    shared with other cells running at the same time (their throughput is then contended)."""
    return {
        "device": device_name(device),
        "precision": "bf16" if cell.recipe.amp and device.type == "cuda" else "fp32",
        "shared_device": bool(shared_device),
    }


def measure_cost(
    model: EnsembleModel,
    ctx: BuildContext,
    cell: Cell,
    spec: DatasetSpec,
    splits: dict[str, Split],
    device: torch.device,
) -> dict[str, Any]:
    """Parameters always; FLOPs, throughput and memory when the suite asks for cost."""
    cost: dict[str, Any] = parameter_counts(model, ctx)
    if not cell.evaluation.cost:
        return cost
    b = min(cell.recipe.batch_size, len(splits["train"]))
    loader = make_loader(
        splits["train"].subset(torch.arange(b)),
        LoaderOptions(
            b,
            device,
            spec.mean,
            spec.std,
            channels_last=cell.recipe.channels_last and device.type == "cuda",
        ),
    )
    x, y = next(iter(loader))
    cost["loader_images_per_s"] = loader_throughput(cell, spec, splits, device)
    cost["flops_per_image"] = flops_per_image(model, x)
    cost.update(throughput(model, x, y, cell.recipe, device, steps=cell.evaluation.cost_steps))
    return cost


def loader_throughput(
    cell: Cell,
    spec: DatasetSpec,
    splits: dict[str, Split],
    device: torch.device,
    batches: int = 20,
    warmup: int = 5,
) -> float:
    """Images/s the training loader delivers (in-memory sets: device-resident uint8,
    augmentation on the device; file-backed sets: their own pipeline),
    to compare with the model's training throughput: a loader slower than the model starves it.

    The clock starts after ``warmup`` batches (fewer on a short loader: at most half of it),
    so the start-up (decoder worker processes, the first epoch plan) is not counted: the
    figure is the steady rate a training epoch sees.
    """
    loader = train_loader(cell, spec, splits["train"], device)
    it = iter(loader)
    for _ in range(min(warmup, len(loader) // 2)):
        next(it)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seen, start = 0, time.perf_counter()
    for i, (_, y) in enumerate(it):
        seen += y.numel()  # (B,) or, one batch per member, (M, B)
        if i + 1 == batches:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return seen / (time.perf_counter() - start)
