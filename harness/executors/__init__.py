"""Executors: where a suite's cells run, behind one small protocol (:class:`Executor`).

========== ====================================================================================
inprocess  every cell in this process, one after another
local      spawned worker processes on this machine: one per GPU (each sees only its own), or
           one per core on a CPU-only machine
slurm      one Slurm job array through submitit, one task per cell
========== ====================================================================================

The CLI picks one by name (``auto``: in-process for a single cell or on a machine with one GPU,
local workers on a CPU-only machine or across several GPUs). Adding an executor is one module
with a class taking :class:`ExecutorOptions` and implementing ``describe`` and ``run`` (and
declaring ``reads`` and ``runs_here``), made known one of three ways, none an edit here:

- the module calls :func:`register_executor` at import and is named with ``--plugin MODULE``
  (or in ``$HARNESS_PLUGINS``);
- an installed distribution declares the entry point ``NAME = "module:Class"`` in the group
  ``harness.executors`` (read, not imported, until the executor is picked).

All three land in :data:`EXECUTORS`, the same ``Registry`` type methods, trackers and figures use
(the built-ins are registered there as ``"module:Class"``, imported on use).

No executor imports the CLI or the reporter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.registry.core import Registry

# The protocol and options live in harness.executors.base; this module stays light (the CLI's
# parser reads EXECUTORS for --help) and imports them only for types.
if TYPE_CHECKING:
    from harness.executors.base import Executor, ExecutorOptions

__all__ = [
    "EXECUTORS",
    "executor_class",
    "executor_listing",
    "executor_names",
    "make_executor",
    "options_read",
    "register_executor",
    "resolve_name",
    "runs_here",
]

#: Entry-point group of executors in installed distributions (``name = "module:Class"``).
ENTRY_POINT_GROUP = "harness.executors"

#: Executor name → its class or ``"module:Class"`` (imported on use: the Slurm one needs
#: submitit): the registry type methods use, with the built-ins below first, then the
#: ``--plugin`` modules' :func:`register_executor` calls, then installed entry points (their
#: ``"module:Class"`` values, read from the metadata and imported only when picked).
EXECUTORS: Registry[str | type] = Registry(
    "executor", group=ENTRY_POINT_GROUP, modules=("harness.executors",), entry_values=True
)
#: The built-in executors, in the order ``--help`` and ``harness ls`` show them.
BUILT_IN = ("inprocess", "local", "slurm")
for _name, _target in zip(
    BUILT_IN,
    (
        "harness.executors.local:InProcessExecutor",
        "harness.executors.local:LocalWorkersExecutor",
        "harness.executors.slurm.executor:SlurmExecutor",
    ),
    strict=True,
):
    EXECUTORS.register(_name, _target)


def register_executor(name: str, target: str | type) -> None:
    """Make ``--executor name`` run ``target`` (a class, or ``"module:Class"`` imported on use):
    what a ``--plugin`` module calls at import to add an executor in one file.

    Raises:
        ExecutorError: ``name`` is ``auto`` or already names another executor.
    """
    from harness.executors.devices import ExecutorError

    known = _targets()
    if name == "auto" or (name in known and known[name] is not target):
        raise ExecutorError(f"executor {name!r} is already registered; pick another name")
    if name not in known:
        EXECUTORS.register(name, target)


def _targets() -> dict[str, str | type]:
    """Every executor's target (the built-ins, the registered, the entry points'); the lookup
    imports ``$HARNESS_PLUGINS`` first (a worker or task that did not get ``--plugin``)."""
    return dict(EXECUTORS.registered())


def _entry_point_targets() -> dict[str, str]:
    """Executors of installed distributions (name → ``"module:Class"``), from their metadata."""
    import importlib.metadata

    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


#: One line per built-in executor for ``harness ls`` (their classes are not imported to list them).
DESCRIPTIONS = {
    "inprocess": "every cell in this process, one after another",
    "local": "spawned worker processes on this machine (one per GPU, or one per core)",
    "slurm": "one Slurm job array through submitit, one task per cell",
}


def executor_listing() -> list[tuple[str, str]]:
    """``(name, one line)`` of every executor, for ``harness ls``: a built-in's description, a
    registered class's first docstring line, else where it comes from (no import)."""
    out = [("auto", "inprocess for one cell or on a one-GPU machine, else local")]
    targets = _targets()
    for name in executor_names():
        target = targets[name]
        if name in DESCRIPTIONS and isinstance(target, str) and name in BUILT_IN:
            line = DESCRIPTIONS[name]
        elif isinstance(target, type):
            doc = (target.__doc__ or "").strip().splitlines()
            line = f"{doc[0] if doc else target.__qualname__} ({target.__module__})"
        else:
            kind = "entry point" if name in _entry_point_targets() else "plugin"
            line = f"{target} ({kind})"
        out.append((name, line))
    return out


def executor_names() -> list[str]:
    """Every name ``--executor`` accepts but ``auto``: the built-in ones first, in order."""
    return list(dict.fromkeys([*BUILT_IN, *sorted(_targets())]))


def resolve_name(
    name: str,
    n_cells: int,
    gpu_count: Callable[[], int] | None = None,
) -> str:
    """``auto`` → ``inprocess`` for at most one cell or on a one-GPU machine, else ``local``
    (one worker per core on CPU, one per GPU on a machine with several).

    ``gpu_count`` replaces device discovery.

    Raises:
        ExecutorError: an unknown executor name (a ValueError), with the closest one and the
            valid ones, worded as argparse words an invalid choice.
    """
    if name == "auto":
        if gpu_count is None:
            from harness.engine.environment import visible_gpus

            gpu_count = lambda: len(visible_gpus())  # noqa: E731
        return "inprocess" if n_cells <= 1 or gpu_count() == 1 else "local"
    if name not in _targets():
        from harness.contract.build import closest
        from harness.executors.devices import ExecutorError

        names = ["auto", *executor_names()]
        near = closest(name, names)
        hint = f"; did you mean {near!r}?" if near else ""
        choices = ", ".join(repr(n) for n in names)
        raise ExecutorError(
            f"argument --executor: invalid choice: {name!r} (choose from {choices}){hint}"
        )
    return name


#: What ``auto`` may resolve to.
AUTO = ("inprocess", "local")


def executor_class(name: str) -> type[Executor]:
    """The class of the executor called ``name`` (a name :data:`EXECUTORS` holds).

    Raises:
        ExecutorError: an unknown executor name, listing the valid ones.
        RegistryError: an installed distribution's executor whose module fails to import or
            lacks the class (one line naming the entry point, its group and its module).
    """
    name = resolve_name(name, 0) if name != "auto" else AUTO[0]
    target = _targets()[name]
    if isinstance(target, type):
        return target
    module, _, cls = target.partition(":")
    if name in BUILT_IN:  # the harness's own: an error here is a bug, shown as one
        return getattr(importlib.import_module(module), cls)
    from importlib.metadata import entry_points

    from harness.registry.core import RegistryError, entry_point_error, plugin_error

    try:
        found = getattr(importlib.import_module(module), cls, None)
    except Exception as exc:  # a plugin may raise anything while importing
        for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
            raise entry_point_error(ep, exc) from exc
        raise plugin_error(module, exc, f"executor {name!r}: module") from exc
    if not isinstance(found, type):
        raise RegistryError(
            f"executor {name!r} ({target}, group {ENTRY_POINT_GROUP}): module {module} has no "
            f"class {cls}"
        )
    return found


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
