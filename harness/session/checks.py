"""The suite loading and the checks before anything runs, shared by ``run``, ``validate``,
``report`` and the Python face. Checking changes nothing: no environment variable, no file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.includes import SuiteError

if TYPE_CHECKING:
    from harness.config.suite import Suite
    from harness.storage.tracker_options import TrackerOptions


def load_suite_arg(
    path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (), check_files: bool = False
) -> Suite:
    """The suite at ``path``, with its overrides, validated once (a folder is refused by name);
    ``check_files``: its ``pretrained:`` files must be on this machine.

    Raises:
        SuiteError: every problem, each naming its file and key or the override.
    """
    from harness.config.parse import load_suite

    if Path(path).is_dir():
        raise SuiteError(
            [f"{path}: is a directory; give a suite YAML file (e.g. suites/smoke.yaml)"]
        )
    return load_suite(str(path), list(overrides), check_files)


def preflight(
    suite: Suite,
    source: str,
    trackers: TrackerOptions,
    data_root: Path | None,
    results: Path | None = None,
) -> list[str]:
    """The problems a valid suite (loaded from ``source``) can still meet on this machine:
    trackers that cannot work (an unknown name, a package not installed, a tracking server
    that does not answer, a tag or setting no tracker takes), a data root that is no folder,
    data that is not there, a results folder that is a file or under one, or without room for
    one cell. The suite itself was validated when it was loaded. ``data_root`` None: the cells
    run elsewhere, nothing of this machine is checked. Nothing is changed."""
    from harness.storage.loggers import tracker_problems

    problems = tracker_problems(trackers)
    if data_root is not None:
        if root_problem := data_root_problem(data_root):
            problems.append(root_problem)  # every dataset would say the same, less clearly
        else:
            problems += [f"{source}: {p}" for p in check_data(suite, data_root)]
        if results is not None and (bad := folder_problem(results, "the results folder")):
            problems.append(bad)  # the space check below would read the wrong file system
        elif results is not None and (room := results_space_problem(suite.cells(), results)):
            problems.append(room)
    return problems


def folder_problem(folder: Path, what: str) -> str | None:
    """``folder`` (``what`` names it in the line) is a file, or does not exist and cannot be
    created: a file where it or one of its parents should be, or no permission to write."""
    folder = Path(folder).expanduser()
    if folder.exists():
        return None if folder.is_dir() else f"{folder}: {what} is not a directory"
    from harness.storage.space import nearest_existing

    parent = nearest_existing(folder)
    if not parent.is_dir():
        return f"{folder}: {what} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{folder}: {what} cannot be created: no permission to write in {parent}"
    return None


def data_root_problem(data_root: Path) -> str | None:
    """The data root (``--data-root``, ``$HARNESS_DATA_ROOT`` or the user cache) is a file, or
    does not exist and cannot be created (datasets are read and caches written there)."""
    return folder_problem(data_root, "the data root")


def results_space_problem(cells: list, results: Path) -> str | None:
    """Less free space on the results folder's file system than the largest cell's checkpoint
    plus record (harness.engine.footprint): its first checkpoint would fail."""
    from harness.engine.footprint import largest_footprint, surely_fits
    from harness.storage.space import free_bytes, human_bytes, space_left

    free = free_bytes(results)
    if free is None or surely_fits(cells, free):
        return None
    need = largest_footprint(cells)
    if need is None or need.total <= free:
        return None
    return (
        f"{results}: no space for one cell: {space_left(results)} on its file system, and cell "
        f"{need.cell.label} ({need.parameters:,} parameters) writes a "
        f"{human_bytes(need.checkpoint_bytes)} checkpoint plus its record; free space or give "
        "--results on a larger file system"
    )


def check_data(suite: Suite, data_root: Path) -> list[str]:
    """Problems with data a suite needs: each names the path looked in and the fetch command."""
    from harness.data._machinery.base import DataMissingError
    from harness.registry import DATASETS

    problems = []
    names = list(dict.fromkeys([*suite.grid.datasets, *suite.evaluation.ood]))
    for name in names:
        try:
            DATASETS.get(name).require(data_root)
        except DataMissingError as exc:
            problems.append(str(exc))
    if suite.evaluation.corruptions:
        from harness.data._machinery.corruption_sets import check_corruptions

        for name in suite.grid.datasets:  # only the files this suite's list needs
            problems.extend(check_corruptions(name, suite.evaluation.corruptions, data_root))
    return problems


def default_root(explicit: Path | str | None) -> Path:
    """The data root: ``explicit``, else ``$HARNESS_DATA_ROOT``, else the user cache (the data
    layer imports torch: called only on the way to checking or running cells here)."""
    from harness.data._machinery.base import default_data_root

    return default_data_root(explicit)


#: ExecutorOptions field → the ``harness run`` flag (and :func:`harness.api.run` argument) that
#: sets it.
_FLAGS = {
    "workers": "--workers",
    "gpus": "--gpus",
    "cells_per_gpu": "--cells-per-gpu",
    "profile": "--profile",
    "slurm_overrides": "--slurm",
    "wait": "--wait",
    "trackers": "--logger",
}


def run_flag_problems(executor: str, options: Any) -> list[str]:
    """Options of a run (an :class:`harness.executors.base.ExecutorOptions`) that the executor
    called ``executor`` would silently ignore: each executor declares the options it reads
    (``reads``), and one set to anything but its default for any other is refused."""
    from harness.executors import executor_names, options_read
    from harness.executors.base import ExecutorOptions

    names = ["auto", *executor_names()]
    defaults = ExecutorOptions()
    problems = []
    for field, flag in _FLAGS.items():
        value = getattr(options, field)
        if field == "workers" and value == 1 and executor == "inprocess":
            continue  # one worker is what inprocess is: consistent, not ignored
        if value == getattr(defaults, field) or field in options_read(executor):
            continue
        readers = [n for n in names if field in options_read(n)]
        problems.append(
            f"{flag}: only for --executor {' or '.join(readers)}; "
            f"--executor {executor} does not use it"
        )
    return problems
