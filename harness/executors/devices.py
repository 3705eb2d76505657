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


def bind_worker(device: str | None, concurrent: int = 1) -> None:
    """Pool initializer: make ``device`` (a ``CUDA_VISIBLE_DEVICES`` value: one GPU, or the
    comma-joined GPUs of a multi-process cell) the only devices the process sees, before torch
    initialises CUDA, then install the Ctrl-C handler. None: leave the environment (CPU).
    ``concurrent``: cells running at once on this node, so that file loaders share the cores
    (``$HARNESS_CONCURRENT_CELLS``, read by
    ``harness.data._machinery.file_loader.default_workers``)."""
    from harness.executors.interrupt import install_worker_handler

    install_worker_handler()
    os.environ["HARNESS_CONCURRENT_CELLS"] = str(concurrent)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device


def gpu_groups(gpus: Sequence[str], n: int) -> list[str]:
    """Disjoint groups of ``n`` GPUs as ``CUDA_VISIBLE_DEVICES`` values, for cells of ``n``
    processes (one GPU per rank). Fewer than ``n`` GPUs: one group of all of them, so the cell
    fails with :func:`harness.executors.ranks.rank_devices`' message, in a record."""
    groups = [",".join(gpus[i : i + n]) for i in range(0, len(gpus) - n + 1, n)]
    return groups or [",".join(gpus)]


#: Messages of CUDA errors that leave the process's CUDA context unusable ("sticky" errors: every
#: later CUDA call in the process fails with the same error), as the CUDA runtime words them.
STICKY_CUDA_ERRORS = (
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "uncorrectable ECC error encountered",
)


class BrokenContextError(ExecutorError):
    """A cell failed with a sticky CUDA error in the executor's own process (``inprocess``):
    later cells there would fail the same way, so none is started (one clear line, exit 2)."""


def is_sticky_cuda_error(message: str) -> bool:
    """Whether a failure message names a CUDA error after which the process must be replaced."""
    return "CUDA error" in message and any(e in message for e in STICKY_CUDA_ERRORS)
