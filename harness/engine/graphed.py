"""A training step captured once as a CUDA graph and replayed: the host launches one graph per
step instead of every kernel of forward, loss, backward, clipping and the optimizer.

Why: at CIFAR size every method is launch-bound on a GPU host (docs/benchmarks.md: a graphed
step of the plain ResNet-18 at B = 128 took 3.1 ms instead of 11.0), so eager figures measure
the host's dispatch rate, not the method. The step is the same for every method (the harness's
``ensemble_loss``, the method's own ``training_outputs``), so the treatment is equal.

How (PyTorch's "whole-network capture" recipe, torch.cuda.graphs):
- one step object per cell (:func:`cell_step`), owned by the training loop;
- the first :data:`WARMUP_STEPS` steps of a cell run eagerly on a side stream (they are real
  steps on real batches; cuBLAS/cuDNN initialise their workspaces there);
- the first full batch after them is captured, with static input buffers (``x``, ``y`` copied
  in on the device each step), into a private memory pool of its own, and that one graph is
  replayed for the rest of the cell, every epoch. Whatever a step reads that changes during a
  cell lives in a device tensor updated in place outside the graph: the learning rate (a device
  tensor per parameter group that the scheduler fills; SGD runs its fused kernel, AdamW
  ``capturable``), σN-Ens's scheduled τ and λ (buffers ``set_progress`` fills), the step's
  reported statistics (device scalars, the rows trained included: a replay runs no Python);
- dropout, MC Dropout, Masksembles and MIMO's member orders draw from CUDA's default generator,
  which graph capture makes replay-safe (a new Philox offset every replay);
- a batch of another shape (a partial one) runs eagerly;
- when capture fails (a method synchronises in its step, draws from a CPU generator, …) the cell
  falls back to eager steps for good, with a one-line reason in the log and the record, on the
  stream it was on before (``torch.cuda.graph`` makes the capture stream current before it
  begins capturing, and does not restore it when beginning fails).

Why capture once: a capture per epoch would go into a fresh pool each time (reusing the pool of
a freed graph while the parameters' ``.grad`` tensors allocated there are alive is refused by
PyTorch's allocator, pytorch#133600), costing a pool of activations per epoch until the old
blocks die, and a capture per epoch is only needed when a step reads Python values.

Capture goes through a small backend (:class:`CudaGraphs`, given ``torch.cuda`` or a stand-in)
so that the machinery is tested on a CPU with a stand-in that has a CUDA graph's semantics
(tests/graph_standin.py: replays run no Python, host code is frozen, pools are checked).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from harness.contract.config import Recipe
from harness.engine.train import StepStats, TrainStep

log = logging.getLogger("harness")

#: Eager steps before the first capture (PyTorch's notes use a few; 3 as their example).
WARMUP_STEPS = 3


def step_mode(recipe: Recipe, device: torch.device) -> tuple[str, str]:
    """("graphed" | "compiled" | "eager", why) for a cell's training step."""
    if recipe.compile:
        return "compiled", "recipe.compile: torch.compile traces the step"
    if device.type != "cuda":
        return "eager", f"CUDA graphs need a CUDA device (this is {device.type})"
    if recipe.cuda_graph == "off":
        return "eager", "recipe.cuda_graph: off"
    if recipe.processes > 1:
        return "eager", "a multi-process cell (DistributedDataParallel) runs eager steps"
    return "graphed", "recipe.cuda_graph: " + recipe.cuda_graph


def prepare_optimizer(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Make ``opt``'s step capturable: each group's learning rate a 1-element tensor on
    ``device`` (the scheduler fills it in place), SGD on its fused kernel (which reads the
    tensor on the device), AdamW ``capturable`` with its step counts on the device. Called
    after a checkpoint's state is loaded (which would replace the groups' values)."""
    adam = isinstance(opt, torch.optim.AdamW | torch.optim.Adam)
    for group in opt.param_groups:
        if not isinstance(group["lr"], Tensor):
            group["lr"] = torch.tensor(float(group["lr"]), device=device)
        else:
            group["lr"] = group["lr"].to(device)
        if adam:
            group["capturable"], group["foreach"] = True, True
        else:
            group["fused"], group["foreach"] = True, False
    if adam:  # step counts saved by an eager run are CPU tensors
        for state in opt.state.values():
            if "step" in state and isinstance(state["step"], Tensor):
                state["step"] = state["step"].to(device, torch.float32)


def cell_step(
    model: Any,
    opt: torch.optim.Optimizer,
    recipe: Recipe,
    device: torch.device,
    mode: str,
    compile_backend: Any = "inductor",
    backend: Any = None,
) -> TrainStep | GraphedStep:
    """The one training step of a cell: a :class:`GraphedStep` when ``mode``
    (:func:`step_mode`) is "graphed", its optimizer made capturable (call after a checkpoint's
    optimizer state is loaded); else a :class:`TrainStep`.

    Args:
        backend: the graph backend of a graphed step (default :class:`CudaGraphs` of
            ``device``; tests pass one over a stand-in).
    """
    graphed = mode == "graphed"
    step = TrainStep(model, opt, recipe, device, compile_backend, graphed=graphed)
    if not graphed:
        return step
    prepare_optimizer(opt, device)
    return GraphedStep(step, backend if backend is not None else CudaGraphs(device))


def portable_optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """``opt.state_dict()`` as an eager optimizer built by ``make_optimizer`` would save it:
    learning rates as floats and the constructor's foreach/fused/capturable flags, so a cell
    resumed on another device or mode loads it unchanged. One host read per group (at an
    epoch's end, where the loop synchronises anyway)."""
    state = opt.state_dict()
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), Tensor):
            group["lr"] = float(group["lr"].item())
        for flag in ("fused", "foreach", "capturable"):
            if flag in group:
                group[flag] = opt.defaults.get(flag, group[flag])
    return state


def learning_rate(opt: torch.optim.Optimizer) -> float:
    """The first group's learning rate as a float (a tensor once the step is graphed)."""
    lr = opt.param_groups[0]["lr"]
    return float(lr.item()) if isinstance(lr, Tensor) else float(lr)


class CudaGraphs:
    """The real backend: warm-up on a side stream, capture with ``torch.cuda.graph``.

    Args:
        device: the CUDA device.
        api: the module providing ``CUDAGraph``, ``graph``, ``Stream``, ``stream``,
            ``current_stream`` and ``set_stream``: ``torch.cuda``, or in the tests a CPU
            stand-in with a CUDA graph's semantics (tests/graph_standin.py).
    """

    def __init__(self, device: torch.device, api: Any = None) -> None:
        self.device = device
        self.api = api if api is not None else torch.cuda

    @contextlib.contextmanager
    def warmup(self) -> Iterator[None]:
        cuda = self.api
        side = cuda.Stream(self.device)
        side.wait_stream(cuda.current_stream(self.device))
        with cuda.stream(side):
            yield
        cuda.current_stream(self.device).wait_stream(side)

    def capture(self, body: Callable[[], StepStats]) -> tuple[Callable[[], None], StepStats]:
        """Capture ``body`` into a new graph with a private pool of its own; returns its replay
        and the outputs it writes. A failed capture leaves the stream that was current."""
        cuda = self.api
        before = cuda.current_stream(self.device)
        graph = cuda.CUDAGraph()
        try:
            with cuda.graph(graph):
                outs = body()
        except BaseException:
            cuda.set_stream(before)  # torch.cuda.graph may leave the capture stream current
            raise
        return graph.replay, outs


class GraphedStep:
    """A cell's training step as a replayed CUDA graph (module docstring).

    Args:
        eager: the cell's :class:`~harness.engine.train.TrainStep` (built with
            ``graphed=True``): ``(x, y) -> (loss, reg, correct, rows)`` device scalars.
        backend: :class:`CudaGraphs` (tests pass one over a CPU stand-in).
    """

    def __init__(self, eager: Callable[[Tensor, Tensor], StepStats], backend: Any) -> None:
        self.eager, self.backend = eager, backend
        self.steps = self.graphed_steps = self.captures = 0
        self.failed: str | None = None  # the reason capture failed: eager from then on
        self._replay: Callable[[], None] | None = None
        self._static: tuple[Tensor, Tensor] | None = None
        self._outs: StepStats | None = None

    @property
    def mode(self) -> str:
        """ "graphed", or "eager" once capture failed."""
        return "eager" if self.failed else "graphed"

    def recapture(self) -> None:
        """Drop the graph: the next full batch is captured again, into a new pool. Not needed
        within a cell (one capture serves it); for a step whose captured values changed in
        Python, which the harness's steps never do."""
        self._replay = self._outs = None

    def __call__(self, x: Tensor, y: Tensor) -> StepStats:
        """One training step on (x, y); returns (loss, reg, correct, rows) device scalars,
        which a replay overwrites: copy them before the next step."""
        self.steps += 1
        if self.failed or self.steps <= WARMUP_STEPS:
            if self.failed:
                return self.eager(x, y)
            with self.backend.warmup():
                return self.eager(x, y)
        static = self._static
        if static is not None and (static[0].shape != x.shape or static[1].shape != y.shape):
            return self.eager(x, y)  # a partial batch (or any other shape)
        if static is None:
            self._static = static = (torch.empty_like(x), torch.empty_like(y))
        static[0].copy_(x, non_blocking=True)
        static[1].copy_(y, non_blocking=True)
        if self._replay is None:
            self.captures += 1
            try:
                self._replay, self._outs = self.backend.capture(lambda: self.eager(*static))
            except Exception as exc:  # any capture failure: eager steps, said once
                self.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                log.warning("CUDA graph capture failed, training step runs eagerly: %s",
                            self.failed)  # fmt: skip
                return self.eager(x, y)
        self._replay()  # capture records kernels without running them: the batch runs now
        self.graphed_steps += 1
        return self._outs
