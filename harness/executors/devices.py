"""Which GPUs the local executor may use, and how each worker is bound to one of them.

A worker sees only its own GPU: ``CUDA_VISIBLE_DEVICES`` is set in the worker process before
anything in it touches CUDA (workers are spawned, never forked, so no CUDA state is inherited),
and inside the worker that GPU is ``cuda:0``. Standard library only until a GPU count is needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

#: A device-discovery function: the ids ``CUDA_VISIBLE_DEVICES`` may name (injectable in tests).
Discover = Callable[[], list[str]]


class ExecutorError(ValueError):
    """Bad executor options (e.g. ``--gpus`` naming a GPU that is not visible)."""


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    The entries of ``CUDA_VISIBLE_DEVICES`` when it is set (indices or UUIDs, kept as written so
    a worker's value names the same physical GPU), else ``0 .. n-1`` from torch's device count.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    # device_count() does not create a CUDA context in this process; workers are spawned anyway.
    return [str(i) for i in range(torch.cuda.device_count())]


def parse_gpus(text: str | None) -> tuple[str, ...] | None:
    """``--gpus 0,2`` → ``("0", "2")``; None stays None (every visible GPU)."""
    if text is None:
        return None
    return tuple(d.strip() for d in text.split(",") if d.strip())


def choose_gpus(wanted: Sequence[str] | None, discover: Discover) -> list[str]:
    """The GPUs to place cells on: ``wanted`` (each must be visible), else every visible one.

    Raises:
        ExecutorError: a wanted GPU is not among the visible ones (listing those).
    """
    visible = discover()
    if wanted is None:
        return list(visible)
    missing = [g for g in wanted if g not in visible]
    if missing:
        shown = ", ".join(visible) or "none"
        raise ExecutorError(f"--gpus {','.join(missing)}: no such GPU; visible GPUs: {shown}")
    return list(dict.fromkeys(wanted))


def worker_slots(gpus: Sequence[str], cells_per_gpu: int, workers: int) -> list[str]:
    """The device of each worker, in start order: GPUs interleaved (``0,1,2,0,1,2`` for two
    cells per GPU) so that fewer workers than slots still spread over distinct GPUs first."""
    if cells_per_gpu < 1:
        raise ExecutorError(f"--cells-per-gpu must be >= 1, got {cells_per_gpu}")
    return [g for _ in range(cells_per_gpu) for g in gpus][:workers]


def bind_worker(slots) -> None:
    """Pool initializer: take this worker's GPU from the ``slots`` queue and make it the only
    device the process sees (before torch initialises CUDA), then install the Ctrl-C handler."""
    from harness.interrupt import install_worker_handler

    install_worker_handler()
    if slots is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slots.get(timeout=60)
