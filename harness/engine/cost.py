"""Cost of a method: parameters, FLOPs, throughput and peak memory.

Throughput counts *input images* seen by the whole ensemble per second, measured after warm-up
with device synchronisation before every clock read (as timm's benchmark.py). FLOPs per image come
from ``torch.utils.flop_counter`` on an eval forward.

Two training measurements exist: :func:`throughput` times a bare step (forward, loss, backward,
SGD step on one fixed batch), the ceiling; :func:`real_loop_throughput` times the training loop
users run (:func:`harness.engine.train.train_epoch` with the recipe's optimizer and schedule, fed
by the
device loader with augmentation). Their ratio says how much the loop itself costs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.contract import Recipe
from harness.data._machinery.base import ImageSet
from harness.data._machinery.loader import DeviceLoader
from harness.engine.graphed import WARMUP_STEPS, GraphedStep, cell_step, step_mode
from harness.engine.train import autocast, make_optimizer, make_scheduler, step_loss, train_epoch
from methods._base import BuildContext, EnsembleModel, count_parameters


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


class MemoryReader(Protocol):
    """Reads the device memory a measurement holds: ``reset`` starts a window, ``peak_bytes``
    ends it with the most bytes allocated at any moment in it (everything live counts, the
    model's weights included, as ``torch.cuda.max_memory_allocated``)."""

    def reset(self) -> None: ...

    def peak_bytes(self) -> int: ...


class CudaMemory:
    """:class:`MemoryReader` of a CUDA device (its caching allocator's statistics)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        sync(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        sync(self.device)
        return torch.cuda.max_memory_allocated(self.device)


def memory_reader(device: torch.device) -> MemoryReader | None:
    """The device's memory reader; None on the CPU (peaks are recorded as None there)."""
    return CudaMemory(device) if device.type == "cuda" else None


def peak_memory(fn: Callable[[], Any], memory: MemoryReader | None) -> float | None:
    """Peak device memory (MiB) during one call of ``fn``; None without a reader (CPU)."""
    if memory is None:
        return None
    memory.reset()
    fn()
    return memory.peak_bytes() / 2**20


def host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict copied to host memory, to restore it after a measurement: a copy
    on the device would be charged to the method's peak memory (a parameter-heavy method, the
    deep ensemble or Packed, twice over)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def bare_steps(
    model: EnsembleModel, x: torch.Tensor, y: torch.Tensor, recipe: Recipe, device: torch.device
) -> tuple[Callable[[], None], Callable[[], None], torch.optim.Optimizer]:
    """The bare training step (forward + loss + backward + SGD step with momentum 0.9 on a
    throw-away optimizer, which changes the weights: restore them after) and the evaluation
    forward on batch ``x``, as closures; and that optimizer."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-6, momentum=0.9)
    loss_fn = step_loss(recipe)  # compiled as the training loop's, under `compile: true`

    def train_step() -> None:
        model.train()
        with autocast(device, recipe):
            loss, _, _ = loss_fn(model, x, y, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    @torch.no_grad()
    def eval_step() -> None:
        model.eval()
        with autocast(device, recipe):
            model(x)

    return train_step, eval_step, opt


def throughput(
    model: EnsembleModel,
    x: torch.Tensor,
    y: torch.Tensor,
    recipe: Recipe,
    device: torch.device,
    steps: int = 5,
    warmup: int = 2,
    memory: MemoryReader | str | None = "device",
) -> dict[str, Any]:
    """Train-step and eval throughput (images/s) and peak memory on batch ``x``.

    The train step is forward + loss + backward + SGD step (momentum 0.9) on a throw-away
    optimizer, so the model's weights are restored afterwards, from a host copy
    (:func:`host_copy`). Peak memory is what the method needs: the training peak holds the
    weights, activations, gradients and momentum; the evaluation peak the weights and the
    eval forward's activations only (gradients and momentum are freed before it).

    Args:
        memory: the reader of peak memory; ``"device"``: :func:`memory_reader` of ``device``.
    """
    reader = memory_reader(device) if memory == "device" else memory
    state = host_copy(model)
    train_step, eval_step, opt = bare_steps(model, x, y, recipe, device)
    train_s = timed(train_step, device, warmup, steps)
    peak_train = peak_memory(train_step, reader)
    opt.zero_grad(set_to_none=True)  # evaluation needs neither the gradients ...
    opt.state.clear()  # ... nor the momentum: freed before it is measured
    eval_s = timed(eval_step, device, warmup, steps)
    peak_eval = peak_memory(eval_step, reader)
    model.load_state_dict(state)
    b = x.shape[0]
    return {
        "train_images_per_s": b / train_s,
        "eval_images_per_s": b / eval_s,
        "peak_train_mem_mib": peak_train,
        "peak_eval_mem_mib": peak_eval,
        "batch_size": b,
    }


class FirstBatches:
    """The first ``n`` batches of a loader, as a loader of its own (``len`` included).

    :func:`~harness.engine.train.train_epoch` runs one pass over its loader; this lets the benchmark
    run a warm-up pass and a timed pass of chosen lengths over the same device loader.
    """

    def __init__(self, loader: DeviceLoader, n: int) -> None:
        if n > len(loader):
            raise ValueError(f"asked for {n} batches of a loader that has {len(loader)}")
        self.loader, self.n = loader, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return itertools.islice(iter(self.loader), self.n)


def synthetic_images(n: int, in_shape: tuple[int, ...], classes: int, seed: int = 0) -> ImageSet:
    """``n`` random uint8 images (N, C, H, W) with random labels in [0, classes)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, *in_shape), dtype=torch.uint8, generator=g)
    return ImageSet(images, torch.randint(0, classes, (n,), generator=g))


def real_loop_throughput(
    model: EnsembleModel,
    recipe: Recipe,
    device: torch.device,
    batch: int,
    in_shape: tuple[int, ...],
    classes: int,
    steps: int = 5,
    warmup: int = 2,
    streams: int = 1,
    val_images: int = 1000,
    augment: str = "crop_flip",
    phases: bool = True,
) -> dict[str, Any]:
    """Training images/s through the real loop, on device-resident synthetic data, and what
    the rest of a cell's epoch costs (:func:`epoch_phases`).

    The data are ``batch · max(steps, warmup)`` random uint8 images of ``in_shape`` kept on the
    device and served by :class:`~harness.data._machinery.loader.DeviceLoader` with its random
    crop and flip, exactly as a cell's training data (``streams`` batches per step for methods whose
    members train on independent data, as the runner's loader draws them); the loop is
    :func:`~harness.engine.train.train_epoch` with :func:`~harness.engine.train.make_optimizer` and
    :func:`~harness.engine.train.make_scheduler` of ``recipe``. A warm-up pass of ``warmup`` steps
    comes first; the timed pass of ``steps`` steps is bracketed by device synchronisation and
    includes the loop's own end-of-epoch read of its statistics. The model's weights are
    restored afterwards.

    Returns:
        ``real_train_images_per_s`` (input images per second: ``batch`` per step whatever the
        streams, like the synthetic step, so the two compare), ``real_step_ms`` (one step of
        the timed pass), ``real_regulariser_ms`` (its part spent on the method's regulariser,
        σN-Ens's L_div, forward and backward: the timed pass again with the regulariser off;
        None without one or outside eager steps), ``real_diagnostics_s`` and
        ``real_eval_ms_per_1k`` (:func:`epoch_phases`), ``real_peak_train_mem_mib``
        (None on CPU), ``real_train_loss`` (the timed pass's mean loss, a sanity value) and
        ``real_streams``, ``real_step_mode`` (eager, graphed or compiled: the recipe's
        ``cuda_graph`` and ``compile``, harness.engine.graphed) and why.
    """
    # Length: half of it is the docstring; the warm-up, timed and ablation passes share one
    # loader, optimizer and schedule, which a split would only pass back and forth.
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    state = host_copy(model)
    mode, why = step_mode(recipe, device)
    if mode == "graphed":  # warm-up steps, then the capture, all before the clock starts
        warmup = max(warmup, WARMUP_STEPS + 2)  # the loader below must hold that many batches
    c = in_shape[0]
    loader = DeviceLoader(
        synthetic_images(batch * max(steps, warmup), in_shape, classes),
        batch,
        device,
        mean=(0.5,) * c,
        std=(0.25,) * c,
        augment=augment,  # the suite's: "none" (Fashion-MNIST) or "crop_flip" (CIFAR)
        shuffle=True,
        drop_last=True,
        channels_last=recipe.channels_last and device.type == "cuda",
        streams=streams,
    )
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(loader))
    step = cell_step(model, opt, recipe, device, mode)  # one step, as a cell has
    if warmup:
        train_epoch(model, FirstBatches(loader, warmup), opt, sched, recipe, device, step=step)
    # the timed pass replays the graph captured above, as a cell's later epochs do
    loader.set_epoch(1)  # a fresh order and fresh augmentation draws, as in the next epoch
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    stats = train_epoch(model, FirstBatches(loader, steps), opt, sched, recipe, device, step=step)
    sync(device)
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    timed = {"diagnostics_s": None, "eval_ms_per_1k": None}
    if phases:  # off: the steps alone (benchmarks/op_count.py counts their operators)
        timed = epoch_phases(model, recipe, device, in_shape, classes, val_images)
    if phases and mode == "eager" and model.regularizer() is not None:
        # L_div's share of a step: the same timed pass with the regulariser off (eager steps
        # only: a graph or a compiled step replays what it was built with)
        model.regularizer = lambda: None  # an instance attribute shadows the method, for now
        try:
            without = _timed_pass(model, FirstBatches(loader, steps), opt, sched, recipe, device)
        finally:
            del model.regularizer
        timed["regulariser_ms"] = (elapsed - without) / steps * 1e3
    del opt, sched, loader
    model.load_state_dict(state)
    return {
        "real_train_images_per_s": batch * steps / elapsed,
        "real_step_ms": elapsed / steps * 1e3,
        "real_regulariser_ms": timed.get("regulariser_ms"),
        "real_diagnostics_s": timed["diagnostics_s"],
        "real_eval_ms_per_1k": timed["eval_ms_per_1k"],
        "real_peak_train_mem_mib": peak,
        "real_train_loss": stats["train_loss"],
        "real_streams": streams,
        "real_step_mode": step.mode if isinstance(step, GraphedStep) else mode,
        "real_step_mode_why": getattr(step, "failed", None) or why,
    }


def _timed_pass(model, loader, opt, sched, recipe: Recipe, device: torch.device) -> float:
    """Seconds of one eager :func:`train_epoch` pass over ``loader``, synchronised."""
    step = cell_step(model, opt, recipe, device, "eager")
    sync(device)
    t = time.perf_counter()
    train_epoch(model, loader, opt, sched, recipe, device, step=step)
    sync(device)
    return time.perf_counter() - t


def epoch_phases(
    model: EnsembleModel,
    recipe: Recipe,
    device: torch.device,
    in_shape: tuple[int, ...],
    classes: int,
    val_images: int = 1000,
) -> dict[str, float]:
    """What a cell's epoch pays besides its steps, measured as the runner pays it: the method's
    per-epoch diagnostics (``model.diagnostics()``, after a training pass: σN-Ens's gradient
    ratio runs a forward and backward of its own) and the clean evaluation of a split
    (:func:`harness.engine.evaluate.evaluate_split`: eval forward and every clean metric), on
    ``val_images`` synthetic images. Returns ``diagnostics_s`` (seconds per epoch) and
    ``eval_ms_per_1k`` (milliseconds per 1,000 evaluated images: validation each epoch, the
    final evaluation once per cell and per corrupted or OOD set)."""
    from harness.data._machinery.base import DatasetSpec
    from harness.engine.evaluate import evaluate_split

    model.diagnostics()  # warm-up: a compiled model compiles its diagnostics' pass here
    sync(device)
    t = time.perf_counter()
    model.diagnostics()
    sync(device)
    diagnostics_s = time.perf_counter() - t
    c = in_shape[0]
    spec = DatasetSpec("synthetic", in_shape, classes, (0.5,) * c, (0.25,) * c,
                       load=lambda root: {}, location=lambda root: root)  # fmt: skip
    split = synthetic_images(val_images, in_shape, classes, seed=1)
    evaluate_split(model, split, spec, recipe, device)  # warm-up: the first pass allocates
    sync(device)
    t = time.perf_counter()
    evaluate_split(model, split, spec, recipe, device)
    sync(device)
    eval_s = time.perf_counter() - t
    model.train()
    return {"diagnostics_s": diagnostics_s, "eval_ms_per_1k": eval_s / val_images * 1e6}
