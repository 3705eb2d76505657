"""Device synchronisations per training step, counted below Python, for every method.

On an accelerator a step must not wait for the device: no value read (``.item()``, ``bool(t)``,
a library reading a device scalar, an op whose output size depends on values) and no blocking
host→device copy (from pageable memory, or without ``non_blocking``).
tests/harness/engine/test_host_sync.py patches Python-level reads only; this counts what reaches
the dispatcher, where library code and the loader's copies show too, with a ``TorchDispatchMode``:

* value reads: ``aten._local_scalar_dense`` (every ``.item()``/``int(t)``/``bool(t)``) and the
  ops whose output shape depends on values (``nonzero``, ``masked_select``, ``unique``, tensor
  ``repeat_interleave``);
* copies from the CPU to a device that is not the CPU, unless ``non_blocking`` from pinned
  memory.

The "not the CPU" device is ``meta``: the whole training loop
(:func:`harness.engine.train.train_epoch`
with the device loader) runs on it, shapes only. A ``TorchFunctionMode`` stands in for what a
CPU-only machine cannot do: ``pin_memory()`` (a copy marked pinned) and the host reads of meta
tensors (counted, answered with placeholder values so the loop goes on). Budget: one read per
``sync_every`` steps plus the epoch's end, and one transfer per epoch (the loader's epoch plan,
free on CUDA where it is pinned and ``non_blocking``).
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from harness.config.suite import expand_hparams
from harness.contract.config import Recipe
from harness.data._machinery.loader import DeviceLoader
from harness.engine.cost import synthetic_images
from harness.engine.train import make_optimizer, make_scheduler, train_epoch
from harness.registry import METHODS
from methods._base import BuildContext

aten = torch.ops.aten
META = torch.device("meta")
IN_SHAPE, CLASSES, BATCH = (1, 8, 8), 8, 4

#: Ops that bring a device value to the host, or whose output size depends on device values.
VALUE_READS = {
    aten._local_scalar_dense,
    aten.equal,
    aten.is_nonzero,
    aten.nonzero,
    aten.masked_select,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
}


class SyncCounter(TorchDispatchMode):
    """Counts value reads and blocking CPU→device copies (each a synchronisation on CUDA)."""

    def __init__(self, pinned: set[int]) -> None:
        super().__init__()
        self.pinned = pinned  # data pointers of host tensors marked pinned
        self.reads: list[str] = []
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in VALUE_READS or func is aten.repeat_interleave.Tensor:
            self.reads.append(str(func))
            if packet is aten._local_scalar_dense and args[0].device.type == "meta":
                return {torch.bool: False}.get(args[0].dtype, 1)  # a placeholder value
        elif packet in (aten._to_copy, aten.copy_):
            src = args[1] if packet is aten.copy_ else args[0]
            dst = args[0].device if packet is aten.copy_ else kwargs.get("device", src.device)
            blocking = not (
                (kwargs.get("non_blocking") or (len(args) > 2 and args[2]))
                and src.data_ptr() in self.pinned
            )
            if src.device.type == "cpu" and torch.device(dst).type != "cpu" and blocking:
                self.copies.append(f"{func} {tuple(src.shape)}")
        return func(*args, **kwargs)


class MetaHost(TorchFunctionMode):
    """What a CPU-only machine cannot do for a meta "device": ``pin_memory()`` returns a copy
    recorded as pinned; ``tolist()`` of a meta tensor (a device→host read) is counted and
    answered with ones (finite losses, so the loop's divergence check passes)."""

    def __init__(self) -> None:
        super().__init__()
        self.pinned: set[int] = set()
        self.host_reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "pin_memory" and isinstance(args[0], torch.Tensor):
            copy = args[0].clone()
            self.pinned.add(copy.data_ptr())
            return copy
        if name == "tolist" and args[0].device.type == "meta":
            self.host_reads += 1
            return torch.ones(args[0].shape).tolist()
        return func(*args, **kwargs)


def meta_loader(steps: int, streams: int) -> DeviceLoader:
    return DeviceLoader(
        synthetic_images(BATCH * steps, IN_SHAPE, CLASSES),
        BATCH,
        META,
        mean=(0.5,),
        std=(0.25,),
        augment="crop_flip",
        shuffle=True,
        drop_last=True,
        streams=streams,
    )


@pytest.mark.parametrize("streams", [1, 3])
def test_loader_copies_once_per_epoch(streams):
    """Before the epoch plan: 4 copies per step and stream (order slice, two offsets, flips)."""
    loader = meta_loader(6, streams)
    host = MetaHost()
    with host, SyncCounter(host.pinned) as counter:
        batches = list(loader)
    assert len(batches) == 6 and batches[0][0].device == META
    assert counter.reads == []
    assert len(counter.copies) <= 1, counter.copies  # the epoch plan, one transfer


def test_counter_sees_reads_and_blocking_copies():
    host = MetaHost()
    with host, SyncCounter(host.pinned) as counter:
        x = torch.ones(4, device=META)
        int(x.sum()), bool(x[0] > 0)  # two reads
        torch.arange(3).to(META)  # a blocking copy
        torch.arange(3).to(META, non_blocking=True)  # non_blocking from pageable: blocking
        torch.arange(3).pin_memory().to(META, non_blocking=True)  # free
        x.tolist()
    assert len(counter.reads) == 2, counter.reads
    assert len(counter.copies) == 2, counter.copies
    assert host.host_reads == 1


def meta_method(name: str):
    spec = METHODS.get(name)
    m = max(spec.min_members, min(2, spec.max_members or 2))
    torch.manual_seed(0)
    hp = spec.hparams(**expand_hparams(spec, {})[0])
    model = spec.build(BuildContext("digits_cnn", IN_SHAPE, CLASSES, m), hp)
    return model.to(META), spec.feeding_for({}).streams(m)


@pytest.mark.parametrize("name", METHODS.names())
@pytest.mark.parametrize(("steps", "sync_every"), [(7, 3)])
def test_training_step_does_not_synchronise(name, steps, sync_every):
    model, streams = meta_method(name)
    recipe = Recipe(epochs=1, batch_size=BATCH, grad_clip=1.0, label_smoothing=0.1)
    loader = meta_loader(steps, streams)
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(loader))
    host = MetaHost()
    with host, SyncCounter(host.pinned) as counter:
        stats = train_epoch(model, loader, opt, sched, recipe, META, sync_every=sync_every)
    assert stats["steps"] == steps
    # The loop's own window reads: one per sync_every steps plus the epoch's end.
    assert host.host_reads == -(-steps // sync_every)
    assert counter.reads == [], f"{name}: {len(counter.reads)} value reads: {counter.reads}"
    assert len(counter.copies) <= 1, f"{name}: blocking copies {counter.copies}"


def per_step_reference(loader: DeviceLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The loader as it drew before the epoch plan: per step, from the same generator, the
    order slice, then row offsets, column offsets and flips of the step's rows."""
    from harness.data._machinery.loader import PAD, crop_flip

    n, b = len(loader.labels), loader.batch_size
    g = loader.generator(0)
    order = torch.randperm(n, generator=g)
    out = []
    for i in range(len(loader)):
        idx = order[i * b : (i + 1) * b]
        oy = torch.randint(0, 2 * PAD + 1, (len(idx),), generator=g)
        ox = torch.randint(0, 2 * PAD + 1, (len(idx),), generator=g)
        flip = torch.rand(len(idx), generator=g) < 0.5
        out.append(
            (loader.normalize(crop_flip(loader.images[idx], oy, ox, flip)), loader.labels[idx])
        )
    return out


@pytest.mark.parametrize("drop_last", [True, False])
def test_epoch_plan_draws_what_per_step_drawing_drew(drop_last):
    loader = DeviceLoader(
        synthetic_images(4 * BATCH + 3, IN_SHAPE, CLASSES),
        BATCH,
        torch.device("cpu"),
        mean=(0.5,),
        std=(0.25,),
        augment="crop_flip",
        shuffle=True,
        seed=3,
        drop_last=drop_last,
    )
    loader.set_epoch(2)
    got, want = list(loader), per_step_reference(loader)
    assert len(got) == len(want) == (4 if drop_last else 5)
    for (x, y), (rx, ry) in zip(got, want):
        assert torch.equal(x, rx) and torch.equal(y, ry)
