"""``harness validate SUITE [KEY=VALUE…]``: every problem knowable before training, no cell run.

Also the suite loading and preflight that ``run`` and ``report`` share. Checking changes
nothing: no environment variable, no file (the trackers asked for are options the run hands
to its cells, :func:`tracker_options_of`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.config.includes import SuiteError

if TYPE_CHECKING:
    from harness.storage.tracker_options import TrackerOptions


def load_suite_arg(
    path: str, overrides: list[str] | tuple[str, ...] = (), check_files: bool = False
):
    """The suite named on the command line, with its overrides, validated once (a folder is
    refused by name); ``check_files``: its ``pretrained:`` files must be on this machine.

    Raises:
        SuiteError: every problem, each naming its file and key or the override.
    """
    from harness.config.parse import load_suite

    if Path(path).is_dir():
        raise SuiteError(
            [f"{path}: is a directory; give a suite YAML file (e.g. suites/smoke.yaml)"]
        )
    return load_suite(path, overrides, check_files)


def preflight(
    suite,
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


def tracker_options_of(args) -> TrackerOptions:
    """The trackers ``--logger`` (repeatable), ``--tensorboard``, ``--tag key=value``,
    ``--mlflow-experiment``, ``--wandb-project`` and ``--log-model`` ask for (those of the flags
    the command has), as the options the executor hands to every cell's process."""
    from harness.storage.tracker_options import TrackerOptions

    return TrackerOptions.of(
        getattr(args, "logger", None) or (),
        getattr(args, "tag", None) or (),
        tensorboard=getattr(args, "tensorboard", False),
        mlflow_experiment=getattr(args, "mlflow_experiment", None),
        wandb_project=getattr(args, "wandb_project", None),
        log_model=getattr(args, "log_model", False),
    )


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


def check_data(suite, data_root: Path) -> list[str]:
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


def cmd_validate(args) -> int:
    from harness.config.overrides import CellFilter

    # Without data (--skip-data) weight files are not checked either: weights are data too.
    suite = load_suite_arg(args.suite, args.overrides, check_files=not args.skip_data)
    data_root = None
    if not args.skip_data:  # the data layer imports torch: only when the data is checked
        from harness.data._machinery.base import default_data_root

        data_root = default_data_root(args.data_root)
    results = Path(args.results or "results") / suite.name
    if problems := preflight(suite, args.suite, tracker_options_of(args), data_root, results):
        for p in problems:
            print(p, file=sys.stderr)
        return 2
    every = suite.cells()
    cells = CellFilter(args.only).select(every)
    grid = (
        f"{len(suite.grid.datasets)} datasets × {len(suite.grid.backbones)} backbones × "
        f"{len(suite.grid.methods)} methods × M {list(suite.grid.M)} × "
        f"{len(suite.grid.seeds)} seeds"
    )
    # With --only the count is of the selected cells; the grid they are taken from says so.
    shape = f"of the grid's {len(every)}: {grid}" if len(cells) != len(every) else grid
    print(f"{args.suite}: OK — suite {suite.name!r}, {len(cells)} cells ({shape})")
    for name, why in suite.left_out:  # a new backbone family must not drop methods silently
        print(f"  methods: [all] leaves out {name}: {why}")
    if args.verbose:
        for c in cells:
            print(f"  {c.cell_id}  {c.label}")
    return 0
