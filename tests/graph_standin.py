"""A CPU stand-in for CUDA graphs with their semantics: capture records ATen operations, replay
re-executes them and runs no Python.

:class:`harness.engine.graphed.CudaGraphs` talks to ``torch.cuda`` through five names
(``CUDAGraph``, ``graph``, ``Stream``, ``stream``, ``current_stream`` and ``set_stream``);
:class:`StandInCuda` provides them on the CPU. What a real CUDA graph does, and this imitates:

- **Replay runs no Python.** Capture records every ATen operation the step dispatches (a
  ``TorchDispatchMode``, below autograd, so the backward and the optimizer are recorded too);
  replay re-executes that list on the captured tensors and writes each result into the tensor
  capture produced. A dict filled in Python inside the step, a value read once per epoch in
  Python, a list appended to: all frozen at capture.
- **Host code runs once.** A tensor made by a factory call without ``device=``
  (``torch.randperm(n)``, ``torch.arange(n)``) is a host tensor, and so is anything computed
  from host tensors only: those operations run at capture and are not recorded, so a CPU random
  draw is frozen for every replay (as the pinned host buffer a real graph copies from). A random
  operation on device tensors (dropout, ``torch.rand(..., device=x.device)``) draws again at
  every replay, as CUDA's Philox generator does in a graph.
- **No host reads while capturing.** ``.item()``, ``float()``, ``bool()``, ``.tolist()``,
  ``.cpu()`` or ``.numpy()`` of a device tensor raise "operation not permitted when stream is
  capturing".
- **Capture computes nothing.** Tensors capture allocates hold garbage (here: NaN, or -1 for
  integers) until the first replay; tensors that existed before capture (weights, optimizer
  state, running statistics) and the random state are as they were before it.
- **Memory pools.** A capture allocates into a private pool (a new one, or ``pool=`` another
  graph's handle). Capturing into a pool whose graphs were all freed while some of its tensors
  are still alive (a parameter's ``.grad``) fails as PyTorch's allocator does (the
  ``use_count > 0`` assertion, pytorch#133600).
- **Streams.** ``graph.__enter__`` makes the capture stream current before capture begins, as
  ``torch.cuda.graph`` does: a capture that fails to begin leaves it current.

Limits (said, not hidden): it runs the kernels of the CPU, not CUDA's, so numerics are the
CPU's; an implicit synchronous host→device copy (a non-scalar CPU tensor indexing a device
one) is not detected; a CPU generator passed explicitly to a device operation is not refused.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from itertools import count
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CAPTURING = "CUDA error: operation not permitted when stream is capturing"
POOL_ASSERT = (
    "it->second->use_count > 0 INTERNAL ASSERT FAILED at CUDACachingAllocator.cpp "
    "(stand-in: capture into a private pool whose graphs were freed while its blocks live; "
    "pytorch#133600)"
)

#: Factory functions: without ``device=`` they make host tensors.
FACTORIES = {torch.randperm, torch.arange, torch.zeros, torch.ones, torch.empty, torch.full,
             torch.rand, torch.randn, torch.randint, torch.tensor, torch.as_tensor,
             torch.linspace, torch.eye, torch.normal, torch.bernoulli}  # fmt: skip
#: Tensor methods that read a device tensor on the host.
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
              torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
              torch.Tensor.__index__}  # fmt: skip


#: Operators that write some arguments although their schema does not say so: batch norm's
#: running statistics in training (argument positions; PyTorch's ``_native_batch_norm_legit``
#: was added because of it).
UNANNOTATED_WRITES = {
    torch.ops.aten.native_batch_norm.default: (3, 4),
    torch.ops.aten._batch_norm_with_update.default: (3, 4),
}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Pool:
    """A private memory pool: the graphs captured into it and the tensors they allocated."""

    _ids = count(1)

    def __init__(self) -> None:
        self.handle = (0, next(self._ids))
        self.graphs: weakref.WeakSet = weakref.WeakSet()
        self.blocks: list[weakref.ref] = []

    def live_blocks(self) -> int:
        return sum(ref() is not None for ref in self.blocks)


class _Recorder(TorchDispatchMode):
    """Records the device operations of a capture (module docstring)."""

    def __init__(self, graph: StandInGraph) -> None:
        super().__init__()
        self.graph = graph
        self.host: dict[int, weakref.ref] = {}
        self.host_depth = 0  # > 0 inside a host factory call
        self.fresh_ptrs: set[int] = set()
        self.snapshots: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.snapped: set[tuple[int, int, tuple, tuple]] = set()

    def is_host(self, t: torch.Tensor) -> bool:
        ref = self.host.get(id(t))
        return ref is not None and ref() is t

    def mark_host(self, out: Any) -> None:
        for t in _tensors(out):
            self.host[id(t)] = weakref.ref(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        if func is torch.ops.aten._local_scalar_dense.default and not self.is_host(args[0]):
            raise RuntimeError(CAPTURING + " (stand-in: a host read of a device tensor)")
        if self.host_depth or (inputs and all(self.is_host(t) for t in inputs)):
            out = func(*args, **kwargs)  # host code: runs once, now
            self.mark_host(out)
            return out
        self._snapshot_mutated(func, args, kwargs)
        out = func(*args, **kwargs)
        outs = _tensors(out)
        fresh = self._fresh_outputs(func, outs)
        self.graph.ops.append((func, args, kwargs, outs, fresh))
        for t in (outs[i] for i in fresh):
            self.fresh_ptrs.add(_ptr(t))
            self.graph.fresh.append(t)
            self.graph.pool_obj.blocks.append(weakref.ref(t))
        return out

    def _fresh_outputs(self, func, outs: list[torch.Tensor]) -> list[int]:
        """Indices of outputs the operation allocated (not aliases of its inputs)."""
        returns = func._schema.returns
        aliased = [r.alias_info is not None for r in returns]
        if len(aliased) != len(outs):  # a Tensor[] return: aliases only if the schema says so
            aliased = [bool(aliased and aliased[0])] * len(outs)
        return [i for i, a in enumerate(aliased) if not a]

    def _snapshot_mutated(self, func, args, kwargs) -> None:
        """Keep the value of every pre-existing tensor this operation writes, to restore it when
        capture ends (capture computes nothing)."""
        unannotated = UNANNOTATED_WRITES.get(func, ())
        for i, arg in enumerate(func._schema.arguments):
            written = arg.alias_info is not None and arg.alias_info.is_write
            if not written and i not in unannotated:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in _tensors(value):
                if _ptr(t) in self.fresh_ptrs or self.is_host(t):
                    continue
                key = (_ptr(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
                if key not in self.snapped:
                    self.snapped.add(key)
                    with torch.utils._python_dispatch._disable_current_modes():
                        self.snapshots.append((t, t.detach().clone()))


class _HostCalls(TorchFunctionMode):
    """Marks factory calls without ``device=`` as host code, and refuses host reads of device
    tensors while capturing."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        device_read = func in HOST_READS and args and isinstance(args[0], torch.Tensor)
        if device_read and not rec.is_host(args[0]):
            raise RuntimeError(f"{CAPTURING} (stand-in: {func.__name__} of a device tensor)")
        if func in FACTORIES and kwargs.get("device") is None:
            rec.host_depth += 1
            try:
                out = func(*args, **kwargs)
            finally:
                rec.host_depth -= 1
            rec.mark_host(out)
            return out
        return func(*args, **kwargs)


class StandInGraph:
    """``torch.cuda.CUDAGraph`` on the CPU (module docstring)."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.fresh: list[torch.Tensor] = []
        self.pool_obj: _Pool | None = None
        self.replays = 0
        self._modes: contextlib.ExitStack | None = None
        self._recorder: _Recorder | None = None
        self._rng: torch.Tensor | None = None

    def capture_begin(self, pool: tuple | None = None, **_: Any) -> None:
        if pool is not None:
            obj = StandInCuda.pools.get(pool)
            if obj is not None and not len(obj.graphs) and obj.live_blocks():
                raise RuntimeError(POOL_ASSERT)
            self.pool_obj = obj if obj is not None else _Pool()
        else:
            self.pool_obj = _Pool()
        StandInCuda.pools[self.pool_obj.handle] = self.pool_obj
        self.pool_obj.graphs.add(self)
        self._rng = torch.get_rng_state()
        self._recorder = _Recorder(self)
        self._modes = contextlib.ExitStack()
        self._modes.enter_context(self._recorder)
        self._modes.enter_context(_HostCalls(self._recorder))
        StandInCuda.capturing = True

    def capture_end(self) -> None:
        assert self._modes is not None and self._recorder is not None
        self._modes.close()
        StandInCuda.capturing = False
        with torch.no_grad():
            for t, saved in reversed(self._recorder.snapshots):  # capture computed nothing
                t.copy_(saved)
            for t in self.fresh:  # ... and what it allocated holds garbage until a replay
                t.fill_(math.nan if t.is_floating_point() else -1)
        torch.set_rng_state(self._rng)
        # no reference cycle through the recorder: a graph nobody holds is freed at once, as a
        # real CUDAGraph (its pool then knows it is gone)
        self._recorder = self._modes = None

    def replay(self) -> None:
        """Re-execute the recorded operations on the captured tensors; no Python of the step."""
        self.replays += 1
        with torch.no_grad():
            for func, args, kwargs, outs, fresh in self.ops:
                new = _tensors(func(*args, **kwargs))
                for i in fresh:
                    outs[i].copy_(new[i])

    def pool(self) -> tuple:
        assert self.pool_obj is not None, "pool() before capture"
        return self.pool_obj.handle


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other: _Stream) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stand-in stream {self.name}>"


class StandInCuda:
    """The part of ``torch.cuda`` that :class:`~harness.engine.graphed.CudaGraphs` uses."""

    pools: ClassVar[dict[tuple, _Pool]] = {}
    capturing = False
    default_stream = _Stream("default")
    _current: ClassVar[list[_Stream]] = []
    CUDAGraph = StandInGraph

    @classmethod
    def reset(cls) -> None:
        cls._current.clear()
        cls.capturing = False

    @staticmethod
    def Stream(device: Any = None) -> _Stream:
        return _Stream("side")

    @classmethod
    def current_stream(cls, device: Any = None) -> _Stream:
        return cls._current[-1] if cls._current else cls.default_stream

    @classmethod
    def set_stream(cls, stream: _Stream) -> None:
        cls._current[:] = [] if stream is cls.default_stream else [stream]

    class stream:
        # entered context that is never exited stays entered, also once it is collected)
        def __init__(self, s: _Stream) -> None:
            self.s = s

        def __enter__(self) -> None:
            StandInCuda._current.append(self.s)

        def __exit__(self, *exc: object) -> None:
            StandInCuda._current.pop()

    class graph:
        """``torch.cuda.graph``: enters the capture stream, then begins capture (so a
        capture that cannot begin leaves the capture stream current, as the real one)."""

        def __init__(self, cuda_graph: StandInGraph, pool: tuple | None = None,
                     stream: _Stream | None = None, **_: Any) -> None:  # fmt: skip
            self.cuda_graph, self.pool = cuda_graph, pool
            self.stream_ctx = StandInCuda.stream(stream or _Stream("capture"))

        def __enter__(self) -> None:
            self.stream_ctx.__enter__()
            self.cuda_graph.capture_begin(self.pool)

        def __exit__(self, *exc: object) -> None:
            self.cuda_graph.capture_end()
            self.stream_ctx.__exit__(*exc)
