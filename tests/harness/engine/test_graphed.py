"""The CUDA-graphed training step's machinery, on the CPU (harness.engine.graphed).

A CUDA graph cannot be captured here, so :class:`Replaying` stands in for
:class:`~harness.engine.graphed.CudaGraphs`: its "capture" runs the step once and its "replay"
runs the captured closure again, which reads the *static* buffers — so a batch that was not
copied into them, a partial batch sent to the graph, or a recapture that did not happen all
change the trained weights, and the tests compare them with plain eager training.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from harness.contract.config import Recipe
from harness.engine.graphed import (
    WARMUP_STEPS,
    GraphedStep,
    learning_rate,
    portable_optimizer_state,
    prepare_optimizer,
    step_mode,
)
from harness.engine.train import make_optimizer, make_scheduler, train_epoch
from harness.registry import METHODS
from methods._base import BuildContext

CPU = torch.device("cpu")


class Replaying:
    """CPU stand-in for CudaGraphs (module docstring); counts warm-ups and captures."""

    capture_runs = True

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.warmups, self.captures, self.replays = fail, 0, 0, 0

    @contextlib.contextmanager
    def warmup(self):
        self.warmups += 1
        yield

    def capture(self, body):
        self.captures += 1
        if self.fail is not None:
            raise self.fail
        outs = body()

        def replay() -> None:
            self.replays += 1
            for old, new in zip(outs, body(), strict=True):
                old.copy_(new)

        return replay, outs


def batches(n: int, size: int, last: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = [(torch.randn(size, 1, 8, 8, generator=g), torch.randint(0, 10, (size,), generator=g))
           for _ in range(n)]  # fmt: skip
    if last:
        out.append(
            (torch.randn(last, 1, 8, 8, generator=g), torch.randint(0, 10, (last,), generator=g))
        )
    return out


def train(graphed, epochs: int = 2, method: str = "sigma_ens", data=None):
    """Train a small method for ``epochs`` over ``data``; returns the model and the stats."""
    spec = METHODS.get(method)
    torch.manual_seed(0)
    model = spec.build(BuildContext("digits_cnn", (1, 8, 8), 10, 2), spec.make_hparams({}))
    recipe = Recipe(epochs=epochs, batch_size=16, grad_clip=1.0)
    data = data if data is not None else batches(5, 16, last=6)
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(data))
    if graphed is not None:
        prepare_optimizer(opt, CPU)
    stats = []
    for epoch in range(epochs):
        model.set_progress(epoch, epochs)
        stats.append(train_epoch(model, data, opt, sched, recipe, CPU, graphed=graphed))
    return model, stats, opt


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
    """5 full batches and a partial one, 2 epochs: warm-up steps eager, a capture per epoch,
    replays from the static buffers, the partial batch eager; the weights equal eager ones."""
    backend = Replaying()
    step = GraphedStep(None, backend)
    graphed_model, g_stats, opt = train(step, method=method)
    eager_model, e_stats, _ = train(None, method=method)
    same_weights(graphed_model, eager_model)
    assert [s["train_loss"] for s in g_stats] == pytest.approx([s["train_loss"] for s in e_stats])
    assert backend.warmups == WARMUP_STEPS
    assert backend.captures == 2  # one per epoch: Python values read per epoch stay current
    # epoch 1: 3 warm-up, 1 captured (run by the stand-in), 1 replay, the partial batch eager;
    # epoch 2: 1 captured, 4 replays, the partial batch eager
    assert backend.replays == 1 + 4
    assert step.graphed_steps == 2 + 5 and step.steps == 12 and step.mode == "graphed"
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)  # the scheduler fills it
    assert learning_rate(opt) == pytest.approx(0.0)  # the cosine schedule's end


def test_capture_failure_falls_back_to_eager_with_one_reason(caplog):
    backend = Replaying(fail=RuntimeError("operation not permitted when stream is capturing\nmore"))
    step = GraphedStep(None, backend)
    with caplog.at_level(logging.WARNING, logger="harness"):
        model, _, _ = train(step)
    same_weights(model, train(None)[0])
    assert step.mode == "eager" and step.graphed_steps == 0
    assert step.failed == "RuntimeError: operation not permitted when stream is capturing"
    assert backend.captures == 1  # never tried again
    lines = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert lines == ["CUDA graph capture failed, training step runs eagerly: " + step.failed]


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
    pass replays the graph captured during warm-up."""
    from harness.engine import cost, graphed

    backend = Replaying()
    monkeypatch.setattr(cost, "step_mode", lambda recipe, device: ("graphed", "test"))
    monkeypatch.setattr(graphed, "CudaGraphs", lambda device: backend)
    spec = METHODS.get("single")
    model = spec.build(BuildContext("digits_cnn", (1, 8, 8), 10, 1), spec.make_hparams({}))
    out = cost.real_loop_throughput(model, Recipe(), CPU, 8, (1, 8, 8), 10, steps=1, warmup=1)
    assert out["real_step_mode"] == "graphed" and out["real_train_images_per_s"] > 0
    assert backend.warmups == WARMUP_STEPS and backend.captures == 1
    assert backend.replays == 1 + 1  # one in the warm-up pass after the capture, one timed
