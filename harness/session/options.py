"""What a run or a validation is asked to do: the options ``harness run`` / ``harness validate``
build from their flags and :func:`harness.api.run` / :func:`harness.api.validate` from their
arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.executors.base import ExecutorOptions
from harness.storage.tracker_options import TrackerOptions


@dataclass(frozen=True)
class RunOptions:
    """How a suite is run (:func:`harness.session.run_suite`).

    Attributes:
        overrides: ``KEY=VALUE`` suite overrides (``recipe.epochs=2``).
        only: ``--only`` filters (``method=sigma_ens,seed=0``).
        executor: ``auto``, ``inprocess``, ``local``, ``slurm`` or a plugin's.
        results: the results root; the suite's folder is ``<results>/<suite name>``.
        data_root: where the data lives (None: each cell's process resolves
            ``$HARNESS_DATA_ROOT``, else the user cache).
        force: redo finished cells.
        dry_run: plan only: which cells would run and why the others would not; nothing runs,
            no data is checked, nothing is written.
        plugins: modules to import first (they register methods, backbones, datasets,
            executors).
        executor_options: what the executor is configured with: workers, threads, GPUs, the
            Slurm profile, progress bars, and the experiment trackers (``trackers``) every
            cell logs to.
    """

    overrides: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    executor: str = "auto"
    results: Path = Path("results")
    data_root: Path | None = None
    force: bool = False
    dry_run: bool = False
    plugins: tuple[str, ...] = ()
    executor_options: ExecutorOptions = field(default_factory=ExecutorOptions)


@dataclass(frozen=True)
class ValidateOptions:
    """What a validation checks besides the suite itself (:func:`harness.session.validate_suite`).

    Attributes:
        overrides: ``KEY=VALUE`` suite overrides.
        only: ``--only`` filters: the cells returned are those selected.
        check_data: check that the datasets, corruption sets and ``pretrained:`` weight files
            are on this machine (and the results folder, when ``results`` is given).
        data_root: where the data lives (None: ``$HARNESS_DATA_ROOT``, else the user cache).
        results: the results root whose suite folder must be a folder with room for one cell
            (None: not checked).
        trackers: the experiment trackers a run would log to (each must be able to).
        plugins: modules to import first.
    """

    overrides: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    check_data: bool = True
    data_root: Path | None = None
    results: Path | None = None
    trackers: TrackerOptions = field(default_factory=TrackerOptions)
    plugins: tuple[str, ...] = ()
