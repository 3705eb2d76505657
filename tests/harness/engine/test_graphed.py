"""The CUDA-graphed training step's machinery, on the CPU (harness.engine.graphed).

A CUDA graph cannot be captured here, so :class:`harness.engine.graphed.CudaGraphs` runs over
the stand-in of tests/graph_standin.py, which has a graph's semantics: capture records the
step's ATen operations and computes nothing, a replay re-executes them and runs no Python. A
batch that was not copied into the static buffers, a partial batch sent to the graph, or a value
read in Python inside the step all change the trained weights, and the tests compare them with
plain eager training. :class:`Counting` counts what the machinery asked of the backend.
"""

from __future__ import annotations

import logging

import pytest
import torch

from harness.contract.config import Recipe
from harness.engine.graphed import (
    WARMUP_STEPS,
    CudaGraphs,
    GraphedStep,
    cell_step,
    learning_rate,
    portable_optimizer_state,
    prepare_optimizer,
    step_mode,
)
from harness.engine.train import make_optimizer, make_scheduler, train_epoch
from harness.registry import METHODS
from methods._base import BuildContext
from tests.graph_standin import StandInCuda

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    """Graphed and eager weights are compared to 1e-6: one summation order (one thread), so the
    comparison holds alone, in any order and on AVX2 or AVX-512 machines alike."""
    StandInCuda.reset()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    StandInCuda.reset()


class Counting(CudaGraphs):
    """:class:`CudaGraphs` over the stand-in, counting warm-ups, captures and replays; ``fail``
    makes every capture raise it."""

    def __init__(self, fail: Exception | None = None) -> None:
        super().__init__(CPU, StandInCuda)
        self.fail, self.warmups, self.captures, self.replays = fail, 0, 0, 0

    def warmup(self):
        self.warmups += 1
        return super().warmup()

    def capture(self, body):
        self.captures += 1
        if self.fail is not None:
            raise self.fail
        replay, outs = super().capture(body)

        def counted() -> None:
            self.replays += 1
            replay()

        return counted, outs


def batches(n: int, size: int, last: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = [(torch.randn(size, 1, 8, 8, generator=g), torch.randint(0, 10, (size,), generator=g))
           for _ in range(n)]  # fmt: skip
    if last:
        out.append(
            (torch.randn(last, 1, 8, 8, generator=g), torch.randint(0, 10, (last,), generator=g))
        )
    return out


def train(backend, epochs: int = 2, method: str = "sigma_ens", data=None, recapture=False):
    """Train a small method for ``epochs`` over ``data``, graphed through ``backend`` or eagerly
    (None); returns the model, the stats, the optimizer and the step."""
    spec = METHODS.get(method)
    torch.manual_seed(0)
    model = spec.build(BuildContext("digits_cnn", (1, 8, 8), 10, 2), spec.make_hparams({}))
    recipe = Recipe(epochs=epochs, batch_size=16, grad_clip=1.0)
    data = data if data is not None else batches(5, 16, last=6)
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(data))
    mode = "graphed" if backend is not None else "eager"
    step = cell_step(model, opt, recipe, CPU, mode, backend=backend)
    stats = []
    for epoch in range(epochs):
        model.set_progress(epoch, epochs)
        if recapture and epoch:
            step.recapture()
        stats.append(train_epoch(model, data, opt, sched, recipe, CPU, step=step))
    return model, stats, opt, step


def same_weights(a, b) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7, msg=name)


def test_step_mode_graphs_cuda_steps_only():
    cuda = torch.device("cuda")
    assert step_mode(Recipe(), cuda) == ("graphed", "recipe.cuda_graph: auto")
    assert step_mode(Recipe(), CPU) == ("eager", "CUDA graphs need a CUDA device (this is cpu)")
    assert step_mode(Recipe(cuda_graph="off"), cuda) == ("eager", "recipe.cuda_graph: off")
    assert step_mode(Recipe(compile=True), cuda)[0] == "compiled"
    assert step_mode(Recipe(processes=2), cuda)[0] == "eager"


@pytest.mark.parametrize("method", ["sigma_ens", "mc_dropout"])
def test_graphed_training_equals_eager_training(method):
    """5 full batches and a partial one, 2 epochs: warm-up steps eager, one capture for the
    cell, replays from the static buffers every epoch, the partial batch eager; the weights and
    the statistics equal eager ones."""
    backend = Counting()
    graphed_model, g_stats, opt, step = train(backend, method=method)
    eager_model, e_stats, _, _ = train(None, method=method)
    same_weights(graphed_model, eager_model)
    for g, e in zip(g_stats, e_stats, strict=True):
        assert g == pytest.approx(e, rel=1e-6)
    assert g_stats[0]["train_acc"] > 0 and g_stats[0]["steps"] == 6
    assert backend.warmups == WARMUP_STEPS
    assert backend.captures == 1  # one graph for the cell: τ, λ and the lr live in tensors
    # epoch 1: 3 warm-up, the capture and its replay, 1 replay, the partial batch eager;
    # epoch 2: 5 replays, the partial batch eager
    assert backend.replays == 2 + 5
    assert step.graphed_steps == 2 + 5 and step.steps == 12 and step.mode == "graphed"
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)  # the scheduler fills it
    assert learning_rate(opt) == pytest.approx(0.0)  # the cosine schedule's end


def test_recapture_goes_into_a_new_pool_and_trains_the_same():
    """An explicit recapture (the harness never needs one within a cell) captures into a pool
    of its own: reusing the freed graph's pool while .grad tensors allocated there are alive is
    what PyTorch's allocator refuses."""
    backend = Counting()
    graphed_model, _, _, step = train(backend, epochs=3, recapture=True)
    eager_model, _, _, _ = train(None, epochs=3)
    assert step.failed is None and backend.captures == 3
    same_weights(graphed_model, eager_model)


def test_capture_failure_falls_back_to_eager_with_one_reason(caplog):
    backend = Counting(fail=RuntimeError("operation not permitted when stream is capturing\nmore"))
    with caplog.at_level(logging.WARNING, logger="harness"):
        model, _, _, step = train(backend)
    same_weights(model, train(None)[0])
    assert step.mode == "eager" and step.graphed_steps == 0
    assert step.failed == "RuntimeError: operation not permitted when stream is capturing"
    assert backend.captures == 1  # never tried again
    lines = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert lines == ["CUDA graph capture failed, training step runs eagerly: " + step.failed]


def test_a_step_that_reads_a_device_value_on_the_host_falls_back_and_keeps_its_stream():
    """A host read inside the step cannot be captured (a real stream refuses it); the cell runs
    eagerly, on the stream it was on before the capture began."""
    backend = Counting()
    model = METHODS.get("single").build(
        BuildContext("digits_cnn", (1, 8, 8), 10, 1), METHODS.get("single").make_hparams({})
    )
    recipe = Recipe(epochs=1, batch_size=16)
    opt = make_optimizer(model, recipe)
    inner = cell_step(model, opt, recipe, CPU, "eager")

    def reads_loss(x, y):
        stats = inner(x, y)
        float(stats[0])  # a host read: what .item() in a method's step would do
        return stats

    step = GraphedStep(reads_loss, backend)
    prepare_optimizer(opt, CPU)
    sched = make_scheduler(opt, recipe, 5)
    train_epoch(model, batches(5, 16), opt, sched, recipe, CPU, step=step)
    assert step.mode == "eager" and "operation not permitted" in step.failed
    assert StandInCuda.current_stream() is StandInCuda.default_stream


def test_optimizer_state_is_portable_after_prepare():
    """A graphed cell's checkpoint holds what an eager optimizer saves: float learning rates
    and the constructor's flags, so it resumes on any device and mode."""
    spec = METHODS.get("single")
    model = spec.build(BuildContext("digits_cnn", (1, 8, 8), 10, 1), spec.make_hparams({}))
    for kind in ("sgd", "adamw"):
        recipe = Recipe(optimizer=kind, lr=0.1)
        eager = make_optimizer(model, recipe)
        opt = make_optimizer(model, recipe)
        prepare_optimizer(opt, CPU)
        group = opt.param_groups[0]
        assert isinstance(group["lr"], torch.Tensor) and float(group["lr"]) == pytest.approx(0.1)
        assert group["capturable"] if kind == "adamw" else group["fused"]
        state = portable_optimizer_state(opt)
        want = eager.state_dict()["param_groups"]
        # the same groups, the rate a float again (float32-rounded: the device tensor's value)
        assert [g | {"lr": 0} for g in state["param_groups"]] == [g | {"lr": 0} for g in want]
        assert [type(g["lr"]) for g in state["param_groups"]] == [float] * len(want)
        assert state["param_groups"][0]["lr"] == pytest.approx(0.1, rel=1e-7)
        fresh = make_optimizer(model, recipe)
        fresh.load_state_dict(state)
        assert fresh.param_groups[0]["lr"] == pytest.approx(0.1, rel=1e-7)


def test_bench_real_loop_warms_up_enough_to_capture_even_when_asked_for_fewer(monkeypatch):
    """``harness bench --loop real --steps 1 --warmup 1`` in the graphed mode: the warm-up
    grows to the eager steps plus a capture, and the loader holds that many batches; the timed
    pass replays the graph captured during warm-up (no Python runs in it)."""
    from harness.engine import cost, graphed

    backend = Counting()
    monkeypatch.setattr(cost, "step_mode", lambda recipe, device: ("graphed", "test"))
    monkeypatch.setattr(graphed, "CudaGraphs", lambda device: backend)
    spec = METHODS.get("single")
    model = spec.build(BuildContext("digits_cnn", (1, 8, 8), 10, 1), spec.make_hparams({}))
    out = cost.real_loop_throughput(model, Recipe(), CPU, 8, (1, 8, 8), 10, steps=1, warmup=1)
    assert out["real_step_mode"] == "graphed" and out["real_train_images_per_s"] > 0
    assert backend.warmups == WARMUP_STEPS and backend.captures == 1
    assert backend.replays == 2 + 1  # the capture's and one more in the warm-up pass, one timed
