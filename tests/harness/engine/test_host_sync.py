"""The training loop reads tensors on the host at most once per ``sync_every`` steps.

On an accelerator every host read of a tensor (``.item()``, ``float(t)``, ``bool(t)``,
``.tolist()``, ...) waits for the launch queue to drain, so a loop that reads the loss every
step runs slower than the benchmark's step. On the CPU a read costs nothing, but it can be
counted: the tests patch the read methods of ``torch.Tensor`` with a counter that is active only
while :func:`harness.engine.train.train_epoch` runs, for every registered method.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest
import torch

from harness.config.suite import expand_hparams
from harness.contract.config import Recipe
from harness.data._machinery.loader import DeviceLoader
from harness.engine.cost import synthetic_images
from harness.engine.train import (
    SYNC_EVERY,
    DivergenceError,
    ensemble_loss,
    make_optimizer,
    make_scheduler,
    train_epoch,
)
from harness.registry import METHODS
from methods._base import BuildContext

# Every Python-level way to bring a tensor's value to the host. ``f"{t:.3f}"`` goes through
# ``item`` and ``np.asarray(t)`` through ``numpy``, so both are counted too.
READS = ("item", "__float__", "__bool__", "__int__", "__index__", "tolist", "numpy")

IN_SHAPE, CLASSES, BATCH = (1, 8, 8), 8, 4
CPU = torch.device("cpu")


@contextlib.contextmanager
def count_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Record (read method, id of the tensor read) for every host read inside the block."""
    reads: list[tuple[str, int]] = []
    active = [True]

    def counted(name: str, fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            if active[0]:
                reads.append((name, id(self)))
            return fn(self, *args, **kwargs)

        return wrapper

    with monkeypatch.context() as m:
        for name in READS:
            m.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        try:
            yield reads
        finally:
            active[0] = False


def setup(name: str, steps: int, recipe: Recipe, seed: int = 0):
    """A method on the digits CNN, its optimizer and schedule, and a loader of ``steps``
    batches of device-resident images with the harness's crop-and-flip augmentation."""
    spec = METHODS.get(name)
    m = max(spec.min_members, min(2, spec.max_members or 2))
    torch.manual_seed(seed)
    hp = spec.hparams(**expand_hparams(spec, {})[0])
    model = spec.build(BuildContext("digits_cnn", IN_SHAPE, CLASSES, m), hp)
    loader = DeviceLoader(
        synthetic_images(BATCH * steps, IN_SHAPE, CLASSES, seed=seed),
        BATCH,
        CPU,
        mean=(0.5,),
        std=(0.25,),
        augment="crop_flip",
        shuffle=True,
        seed=seed,
        drop_last=True,
    )
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(loader))
    return model, loader, opt, sched


def test_counter_sees_every_kind_of_read(monkeypatch):
    t = torch.tensor(1.5)
    with count_host_reads(monkeypatch) as reads:
        float(t), bool(t), int(t), t.item(), t.tolist(), t.numpy(), f"{t:.1f}"
        [0, 1][torch.tensor(1)]
    assert sorted(n for n, _ in reads) == sorted(
        ["__float__", "__bool__", "__int__", "item", "tolist", "numpy", "item", "__index__"]
    )
    assert float(t) == 1.5  # patches are gone after the block


@pytest.mark.parametrize("name", METHODS.names())
@pytest.mark.parametrize(("steps", "sync_every"), [(7, 3), (6, 3)])
def test_train_epoch_reads_once_per_sync_window(monkeypatch, name, steps, sync_every):
    recipe = Recipe(epochs=1, batch_size=BATCH, grad_clip=1.0, label_smoothing=0.1)
    model, loader, opt, sched = setup(name, steps, recipe)
    with count_host_reads(monkeypatch) as reads:
        stats = train_epoch(model, loader, opt, sched, recipe, CPU, sync_every=sync_every)
    assert stats["steps"] == steps
    # one read per full window of sync_every steps, one at the epoch's end for the rest
    assert len(reads) <= steps // sync_every + 1, reads
    assert len(reads) == -(-steps // sync_every), reads
    assert torch.isfinite(torch.tensor(stats["train_loss"])) and stats["train_loss"] > 0


def test_default_sync_window_reads_once_per_short_epoch(monkeypatch):
    assert SYNC_EVERY == 50
    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, opt, sched = setup("sigma_ens", 5, recipe)
    with count_host_reads(monkeypatch) as reads:
        train_epoch(model, loader, opt, sched, recipe, CPU)
    assert len(reads) == 1, reads


def test_progress_bar_is_updated_without_reads(monkeypatch):
    from tqdm import tqdm

    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, opt, sched = setup("single", 5, recipe)
    bar = tqdm(total=5, disable=False, file=open("/dev/null", "w"))  # noqa: SIM115
    with count_host_reads(monkeypatch) as reads:
        stats = train_epoch(model, loader, opt, sched, recipe, CPU, progress=bar, sync_every=2)
    bar.close()
    assert bar.n == 5
    assert len(reads) == 3, reads
    assert stats["steps"] == 5
    assert bar.postfix is not None and bar.postfix.startswith("loss="), bar.postfix


class Poisoned:
    """A loader whose batch ``at`` is multiplied by ``factor`` (NaN: a diverged step), and whose
    batch ``broken`` (if any) has a wrong shape; counts the batches drawn from it."""

    def __init__(self, loader, at: int, factor: float = float("nan"), broken: int | None = None):
        self.loader, self.at, self.factor, self.broken = loader, at, factor, broken
        self.drawn = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for i, (x, y) in enumerate(self.loader):
            self.drawn += 1
            if i == self.at:
                x = x * self.factor
            if i == self.broken:
                x = torch.cat([x, x], 1)  # two channels for a one-channel network
            yield x, y


def test_divergence_names_its_step_within_the_sync_window():
    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, opt, sched = setup("sigma_ens", 9, recipe)
    poisoned = Poisoned(loader, at=4)
    with pytest.raises(DivergenceError, match="training loss became nan at step 4 of this epoch"):
        train_epoch(model, poisoned, opt, sched, recipe, CPU, sync_every=3)
    assert poisoned.drawn == 6  # read at the end of the window of steps 3, 4, 5


def test_loss_above_max_loss_is_divergence():
    recipe = Recipe(epochs=1, batch_size=BATCH, max_loss=1e-3)  # below ln(8), the first loss
    model, loader, opt, sched = setup("single", 4, recipe)
    with pytest.raises(DivergenceError, match=r"at step 0 of this epoch \(limit 0.001\)"):
        train_epoch(model, loader, opt, sched, recipe, CPU, sync_every=50)


def test_a_step_failing_after_divergence_reports_the_divergence():
    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, opt, sched = setup("single", 6, recipe)
    with pytest.raises(DivergenceError, match="at step 1 of this epoch") as info:
        train_epoch(model, Poisoned(loader, at=1, broken=2), opt, sched, recipe, CPU)
    assert isinstance(info.value.__context__, RuntimeError)  # the failing step is kept


def test_sync_every_must_be_positive():
    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, opt, sched = setup("single", 2, recipe)
    with pytest.raises(ValueError, match="sync_every must be >= 1, got 0"):
        train_epoch(model, loader, opt, sched, recipe, CPU, sync_every=0)


@pytest.mark.parametrize("name", ["single", "sigma_ens", "mimo"])
def test_statistics_equal_a_step_by_step_reference(name):
    """The window record gives the same epoch statistics as reading every step on the host."""
    recipe = Recipe(epochs=1, batch_size=BATCH, label_smoothing=0.1, grad_clip=2.0)
    model, loader, opt, sched = setup(name, 7, recipe)
    stats = train_epoch(model, loader, opt, sched, recipe, CPU, sync_every=3)

    ref_model, ref_loader, ref_opt, ref_sched = setup(name, 7, recipe)
    ref_model.train()
    losses, regs, correct, rows = [], [], 0, 0
    for x, y in ref_loader:
        loss, out, reg = ensemble_loss(ref_model, x, y, recipe)
        ref_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref_model.parameters(), recipe.grad_clip)
        ref_opt.step()
        ref_sched.step()
        losses.append(loss.item())
        regs.append(0.0 if reg is None else reg.item())
        correct += int((out.logits.argmax(-1) == out.targets).sum())
        rows += out.targets.numel()
    assert stats["steps"] == 7
    assert stats["train_loss"] == pytest.approx(sum(losses) / 7, rel=1e-6)
    assert stats["train_reg"] == pytest.approx(sum(regs) / 7, rel=1e-6, abs=1e-9)
    assert stats["train_acc"] == pytest.approx(correct / rows, rel=1e-9)
    if name == "sigma_ens":
        assert stats["train_reg"] != 0, "σN-Ens's regularizer (L_div) should be in the record"


def test_adamw_reads_only_its_cpu_step_counters(monkeypatch):
    """torch's AdamW (not capturable, not fused) keeps each parameter's step count in a CPU
    tensor and reads it every step for the bias correction; a CPU read does not wait for the
    accelerator, so those are the only extra reads allowed."""
    recipe = Recipe(epochs=1, batch_size=BATCH, optimizer="adamw", lr=1e-3)
    model, loader, opt, sched = setup("sigma_ens", 4, recipe)
    with count_host_reads(monkeypatch) as reads:
        train_epoch(model, loader, opt, sched, recipe, CPU, sync_every=2)
    counters = {id(state["step"]) for state in opt.state.values()}
    assert all(not state["step"].is_cuda for state in opt.state.values())
    others = [name for name, tensor in reads if tensor not in counters]
    assert len(others) == 2, others
    assert len(reads) > len(others)  # the counters were read: the filter is not vacuous
