"""The CPU stand-in for CUDA graphs (tests/graph_standin.py) behaves like a CUDA graph, and the
harness's graphed training step is right under it.

Part 1 holds the stand-in to what a real graph does (no Python at replay, host code frozen,
capture computes nothing, host reads refused, private pools, the capture stream). Part 2 runs
:class:`harness.engine.graphed.CudaGraphs` itself, with the stand-in in place of ``torch.cuda``,
through the training loop: a cell stays graphed every epoch, the benchmark's timed pass replays
the graph its warm-up captured, and MIMO draws fresh member orders at every replay.
"""

from __future__ import annotations

import gc

import pytest
import torch

from harness.contract.config import Recipe
from harness.engine.graphed import CudaGraphs, cell_step
from harness.engine.train import make_optimizer, make_scheduler, train_epoch
from harness.registry import METHODS
from methods._base import BuildContext
from tests.graph_standin import CAPTURING, POOL_ASSERT, StandInCuda, StandInGraph

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _streams():
    StandInCuda.reset()
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # graphed and eager runs compared bit for bit need one order
    yield
    torch.set_num_threads(before)
    StandInCuda.reset()


def capture(body, pool=None) -> tuple[StandInGraph, object]:
    g = StandInCuda.CUDAGraph()
    with StandInCuda.graph(g, pool=pool):
        out = body()
    return g, out


# ---------------------------------------------------------------- part 1: the stand-in itself


def test_replay_runs_no_python_but_every_recorded_operation():
    w, x = torch.zeros(3), torch.ones(3)
    calls: list[int] = []

    def body():
        calls.append(1)  # Python: runs at capture only
        w.add_(x)  # an in-place update of a pre-existing tensor: replayed
        return (w * 2).sum()

    g, out = capture(body)
    assert calls == [1]
    assert w.tolist() == [0, 0, 0]  # capture computed nothing ...
    assert torch.isnan(out)  # ... and what it allocated is garbage until a replay
    g.replay()
    g.replay()
    assert calls == [1] and w.tolist() == [2, 2, 2] and out.item() == 12
    x.fill_(5)  # the static input changes: the replay reads it
    g.replay()
    assert w.tolist() == [7, 7, 7] and out.item() == 42


def test_host_draws_are_frozen_device_draws_are_fresh():
    x = torch.zeros(6)

    def body():
        host = torch.randperm(6)  # no device: host code, run once
        dev = torch.rand(6, device=x.device)  # on the device: drawn again at every replay
        return x + host, x + dev

    g, (from_host, from_device) = capture(body)
    seen_host, seen_device = [], []
    for _ in range(3):
        g.replay()
        seen_host.append(from_host.clone())
        seen_device.append(from_device.clone())
    assert all(torch.equal(seen_host[0], h) for h in seen_host)
    assert not torch.equal(seen_device[0], seen_device[1])
    assert sorted(seen_host[0].tolist()) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("read", ["item", "float", "bool", "tolist", "cpu"])
def test_host_reads_of_device_tensors_are_refused_while_capturing(read):
    x = torch.ones(2)
    reads = {
        "item": lambda t: t.sum().item(),
        "float": lambda t: float(t.sum()),
        "bool": lambda t: bool(t.sum() > 0),
        "tolist": lambda t: t.tolist(),
        "cpu": lambda t: t.cpu(),
    }
    with pytest.raises(RuntimeError, match=CAPTURING):
        capture(lambda: reads[read](x * 2))
    StandInCuda.reset()
    # a host tensor may be read: host code runs at capture
    g, out = capture(lambda: x * torch.arange(2).sum().item())
    g.replay()
    assert out.tolist() == [1.0, 1.0]


def test_pool_of_freed_graphs_with_live_blocks_cannot_be_captured_into():
    w = torch.ones(2, requires_grad=True)
    kept = {}

    def body():
        loss = (w * 3).sum()
        kept["grad"] = torch.autograd.grad(loss, w)[0]  # like .grad: outlives the graph
        return loss

    g1, out1 = capture(body)
    pool = g1.pool()
    g2, out2 = capture(lambda: w.sum() * 2, pool=pool)  # g1 alive: sharing its pool is fine
    del g1, g2, out1, out2  # the graphs and their outputs; the gradient lives on
    gc.collect()
    with pytest.raises(RuntimeError, match="use_count > 0"):
        capture(lambda: w.sum(), pool=pool)
    assert POOL_ASSERT.startswith("it->second->use_count")
    # the capture stream stays current after a capture that could not begin (torch.cuda.graph
    # enters the stream before it begins capturing): the harness must restore it
    assert StandInCuda.current_stream() is not StandInCuda.default_stream
    StandInCuda.reset()
    del kept["grad"]
    gc.collect()
    capture(lambda: w.sum(), pool=pool)  # no live block left: the pool can be reused


# ------------------------------------------------- part 2: the harness's step under the stand-in


def batches(n: int, size: int, seed: int = 0):
    """``n`` full batches of digits-shaped inputs (cells run ``drop_last``)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 1, 8, 8, generator=g), torch.randint(0, 10, (size,), generator=g))
        for _ in range(n)
    ]


def build(method: str, hparams: dict | None = None):
    spec = METHODS.get(method)
    torch.manual_seed(0)
    return spec.build(
        BuildContext("digits_cnn", (1, 8, 8), 10, 2), spec.make_hparams(hparams or {})
    )


def train(
    method: str,
    graphed: bool,
    epochs: int = 2,
    hparams: dict | None = None,
    n: int = 6,
    recapture: bool = False,
):
    """Train ``method`` for ``epochs`` over ``n`` full batches (cells run ``drop_last``), graphed
    through the stand-in or eagerly; ``recapture``: capture the step again at every epoch.
    Returns the model, each epoch's stats and the step."""
    model = build(method, hparams)
    recipe = Recipe(epochs=epochs, batch_size=8, grad_clip=1.0)
    data = batches(n, 8)
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(data))
    backend = CudaGraphs(CPU, StandInCuda) if graphed else None
    step = cell_step(model, opt, recipe, CPU, "graphed" if graphed else "eager", backend=backend)
    torch.manual_seed(1)
    stats = []
    for epoch in range(epochs):
        model.set_progress(epoch, epochs)
        if recapture and epoch:
            step.recapture()
        stats.append(train_epoch(model, data, opt, sched, recipe, CPU, step=step))
    return model, stats, step


def same_weights(a, b, method: str) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{method}: {name}")


def test_a_graphed_cell_stays_graphed_every_epoch():
    """Defect 1: the step was captured again every epoch into the pool of the graph it had just
    freed, while the parameters' .grad tensors allocated there were alive: a real allocator
    refuses (pytorch#133600), and every cell fell back to eager steps from epoch 2, leaving
    the capture stream current."""
    graphed, _, step = train("single", graphed=True, epochs=3)
    eager, _, _ = train("single", graphed=False, epochs=3)
    assert step.failed is None, step.failed
    assert step.mode == "graphed"
    assert StandInCuda.current_stream() is StandInCuda.default_stream
    same_weights(graphed, eager, "single")


def test_the_benchmark_timed_pass_replays_the_graph_of_its_warmup(monkeypatch):
    """Defect 2: ``harness bench --loop real`` ran its warm-up pass, then a timed pass that
    replayed the warm-up's graph: a replay runs no Python, so the step's count of trained rows
    (filled in Python inside the step) was missing for the new pass (KeyError)."""
    import harness.engine.cost as cost
    import harness.engine.graphed as graphed_mod

    monkeypatch.setattr(cost, "step_mode", lambda recipe, device: ("graphed", "stand-in"))
    monkeypatch.setattr(graphed_mod, "CudaGraphs", lambda device: CudaGraphs(device, StandInCuda))
    model = build("single")
    out = cost.real_loop_throughput(model, Recipe(), CPU, 8, (1, 8, 8), 10, steps=3, warmup=5)
    assert out["real_step_mode"] == "graphed", out
    assert out["real_train_images_per_s"] > 0


def test_mimo_draws_fresh_member_orders_at_every_replay():
    """Defect 3: MIMO drew its member orders with torch.randperm on the host and copied them
    in: a graph replays the orders drawn at capture for the whole cell, silently changing the
    algorithm. Graphed training must equal eager training."""
    graphed, _, step = train("mimo", graphed=True)
    eager, _, _ = train("mimo", graphed=False)
    assert step.failed is None, step.failed
    same_weights(graphed, eager, "mimo")


@pytest.mark.parametrize("recapture", [False, True], ids=["captured-once", "recaptured"])
@pytest.mark.parametrize("method", METHODS.names())
def test_every_methods_graphed_training_equals_eager_training(method, recapture):
    """Every registered method, 2 epochs of full batches: the graphed step (captured once for
    the cell, or again at every epoch) trains the weights and reports the statistics eager
    steps do, and stays graphed."""
    graphed, g_stats, step = train(method, graphed=True, recapture=recapture)
    eager, e_stats, _ = train(method, graphed=False)
    assert step.failed is None, step.failed
    assert step.graphed_steps == 2 * 6 - 3 and step.captures == (2 if recapture else 1)
    same_weights(graphed, eager, method)
    for g, e in zip(g_stats, e_stats, strict=True):
        assert g == pytest.approx(e, rel=1e-5), method


def test_sigma_ens_schedule_reaches_a_step_captured_once():
    """σN-Ens's τ and λ follow their schedule in a graph captured in epoch 1: they live in
    device tensors that set_progress fills (a Python float would be frozen at capture)."""
    hp = {"schedule": "linear", "tau": 1.0, "tau_end": 0.05, "lam": 0.01, "lam_end": 0.1}
    graphed, g_stats, step = train("sigma_ens", graphed=True, epochs=3, hparams=hp)
    eager, e_stats, _ = train("sigma_ens", graphed=False, epochs=3, hparams=hp)
    assert step.captures == 1 and step.failed is None
    same_weights(graphed, eager, "sigma_ens")
    regs = [s["train_reg"] for s in g_stats]
    assert regs == pytest.approx([s["train_reg"] for s in e_stats], rel=1e-5)
    assert abs(regs[2]) > 5 * abs(regs[0])  # λ grew tenfold and τ fell: the graph saw both
