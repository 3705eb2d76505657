"""Executors: where a suite's cells run, behind one small protocol (:class:`Executor`).

========== ====================================================================================
inprocess  every cell in this process, one after another
local      spawned worker processes on this machine: one per GPU (each sees only its own), or
           one per core on a CPU-only machine
slurm      one Slurm job array through submitit, one task per cell
========== ====================================================================================

The CLI picks one by name from :data:`EXECUTORS` (``auto``: in-process for a single cell or on a
machine with one GPU, local workers on a CPU-only machine or across several GPUs). Adding an
executor is one module with a class taking :class:`ExecutorOptions` and implementing
``describe`` and ``run`` (and declaring ``reads`` and ``runs_here``), plus one line here.
No executor imports the CLI or the reporter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

# The protocol and options live in harness.executors.base; this module stays light (the CLI's
# parser reads EXECUTORS for --help) and imports them only for types.
if TYPE_CHECKING:
    from harness.executors.base import Executor, ExecutorOptions

__all__ = [
    "EXECUTORS",
    "executor_class",
    "make_executor",
    "options_read",
    "resolve_name",
    "runs_here",
]

#: Executor name → "module:class" (imported on use: the Slurm one needs submitit).
EXECUTORS: dict[str, str] = {
    "inprocess": "harness.executors.local:InProcessExecutor",
    "local": "harness.executors.local:LocalWorkersExecutor",
    "slurm": "harness.executors.slurm.executor:SlurmExecutor",
}


def resolve_name(
    name: str,
    n_cells: int,
    gpu_count: Callable[[], int] | None = None,
) -> str:
    """``auto`` → ``inprocess`` for at most one cell or on a one-GPU machine, else ``local``
    (one worker per core on CPU, one per GPU on a machine with several).

    ``gpu_count`` replaces device discovery.

    Raises:
        ValueError: an unknown executor name, listing the valid ones.
    """
    if name == "auto":
        if gpu_count is None:
            from harness.engine.environment import visible_gpus

            gpu_count = lambda: len(visible_gpus())  # noqa: E731
        return "inprocess" if n_cells <= 1 or gpu_count() == 1 else "local"
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; valid: auto, {', '.join(EXECUTORS)}")
    return name


#: What ``auto`` may resolve to.
AUTO = ("inprocess", "local")


def executor_class(name: str) -> type[Executor]:
    """The class of the executor called ``name`` (a name of :data:`EXECUTORS`).

    Raises:
        ValueError: an unknown executor name, listing the valid ones.
    """
    module, _, cls = EXECUTORS[resolve_name(name, 0) if name != "auto" else AUTO[0]].partition(":")
    return getattr(importlib.import_module(module), cls)


def options_read(name: str) -> set[str]:
    """The :class:`ExecutorOptions` fields ``name`` uses (``auto``: those of either executor
    it may resolve to)."""
    names = AUTO if name == "auto" else (name,)
    return set().union(*(executor_class(n).reads for n in names))


def runs_here(name: str) -> bool:
    """Whether ``name``'s cells run on this machine (``auto`` always does)."""
    return all(executor_class(n).runs_here for n in (AUTO if name == "auto" else (name,)))


def make_executor(name: str, options: ExecutorOptions, n_cells: int = 0) -> Executor:
    """The executor called ``name`` (or ``auto``, resolved for ``n_cells`` cells)."""
    return executor_class(resolve_name(name, n_cells))(options)
