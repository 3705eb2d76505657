"""Every method is trained alike: compiled training steps under ``compile: true``, bf16
activations under bf16 autocast.

* ``compile: true`` compiles each method's *training step* (:func:`harness.engine.train.step_loss`),
  not only ``forward``: the deep ensemble's per-member batches, BatchEnsemble's and
  Masksembles' feeding and MIMO's shuffles never call ``forward``. A recording backend shows
  the members' convolutions and the loss inside the compiled graph, compiled once and reused.
* Under bf16 autocast (the CPU's shows the same promotion rules as CUDA's: a fp32 parameter
  multiplied into a bf16 activation makes it fp32) every submodule's floating output in a
  training step is bf16.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.contract.config import Recipe
from harness.engine.train import ensemble_loss, train_epoch
from harness.registry import METHODS
from tests.harness.engine.test_host_sync import BATCH, CPU, setup


class RecordingBackend:
    """A ``torch.compile`` backend that runs graphs eagerly and records what they contain."""

    def __init__(self) -> None:
        self.graphs = 0
        self.targets: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs += 1
        self.targets += [
            getattr(n.target, "__name__", str(n.target))
            for n in gm.graph.nodes
            if n.op in ("call_function", "call_method")
        ]
        return gm.forward


@pytest.mark.parametrize("name", METHODS.names())
def test_compile_compiles_every_methods_training_step(name):
    torch._dynamo.reset()
    recipe = Recipe(epochs=1, batch_size=BATCH, compile=True)
    model, loader, opt, sched = setup(name, 3, recipe)
    backend = RecordingBackend()
    stats = train_epoch(model, loader, opt, sched, recipe, CPU, compile_backend=backend)
    assert stats["steps"] == 3 and stats["train_loss"] > 0
    assert backend.graphs == 1  # one graph for the whole step's forward, reused for 3 steps
    assert "conv2d" in backend.targets, sorted(set(backend.targets))  # the members' forward
    assert "cross_entropy" in backend.targets  # and the loss


def test_without_compile_nothing_is_compiled():
    torch._dynamo.reset()
    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, opt, sched = setup("deep_ensemble", 2, recipe)
    backend = RecordingBackend()
    train_epoch(model, loader, opt, sched, recipe, CPU, compile_backend=backend)
    assert backend.graphs == 0


@pytest.mark.parametrize("name", METHODS.names())
def test_every_methods_activations_are_bf16_under_autocast(name):
    recipe = Recipe(epochs=1, batch_size=BATCH)
    model, loader, _, _ = setup(name, 1, recipe)
    seen: dict[str, torch.dtype] = {}

    def hook(module: nn.Module, inputs, output) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            seen[f"{type(module).__name__} #{len(seen)}"] = output.dtype

    for sub in model.modules():
        if sub is not model:
            sub.register_forward_hook(hook)
    x, y = next(iter(loader))
    assert x.dtype == torch.float32
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, out, _ = ensemble_loss(model, x, y, recipe)
    assert any("Conv" in k for k in seen), seen  # the hooks saw the convolutions
    fp32 = {k: v for k, v in seen.items() if v != torch.bfloat16}
    assert fp32 == {}, f"{name}: activations promoted to fp32: {fp32}"
    assert out.logits.dtype == torch.bfloat16 and loss.dtype == torch.float32


# Every method's CUDA-graphed step against its eager step, through a stand-in with a graph's
# semantics: tests/harness/engine/test_graph_standin.py.
