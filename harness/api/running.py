"""Check and run suites from Python (:func:`validate`, :func:`run`), as ``harness validate`` and
``harness run`` do."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.api._common import HarnessError, PathLike

if TYPE_CHECKING:
    from harness.contract import Cell


@dataclass(frozen=True)
class Validation:
    """A suite that passed every check.

    Attributes:
        suite: the suite's name (its results go to ``<results>/<suite>``).
        cells: the cells it expands to (after ``only``): ``cell.cell_id``, ``cell.label``,
            ``cell.config()``.
        left_out: ``(method, why)`` for each method ``methods: [all]`` leaves out.
    """

    suite: str
    cells: list[Cell]
    left_out: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` did.

    Attributes:
        exit_code: ``harness run``'s: 0 every cell done (or handed to Slurm), 1 a cell failed
            (its record says why), 2 a problem found before anything ran or missing data.
        results_dir: the suite's results folder; read it with :func:`load_results`.
    """

    exit_code: int
    results_dir: Path


def _suite_problems(exc: Exception) -> list[str]:
    return list(getattr(exc, "problems", None) or [str(exc)])


def validate(
    suite: PathLike,
    overrides: Sequence[str] = (),
    *,
    only: Sequence[str] = (),
    check_data: bool = True,
    data_root: PathLike | None = None,
) -> Validation:
    """Check a suite as ``harness validate`` does, without training anything.

    Args:
        suite: a suite YAML file.
        overrides: ``KEY=VALUE`` strings, as on the command line (``"recipe.epochs=1"``).
        only: ``--only`` filters (``"method=sigma_ens,seed=0"``).
        check_data: check that the datasets (and ``pretrained:`` weights) are on this machine.
        data_root: where the data lives (default: ``$HARNESS_DATA_ROOT``, else the user cache).

    Returns:
        The suite's name and cells.

    Raises:
        HarnessError: every problem, each naming its file and key or the override.
    """
    from harness.cli.validate import check_data as data_problems
    from harness.cli.validate import load_suite_arg
    from harness.config.includes import SuiteError
    from harness.config.overrides import CellFilter
    from harness.registry.core import RegistryError

    try:
        loaded = load_suite_arg(str(suite), list(overrides), check_files=check_data)
        cells = CellFilter(list(only)).select(loaded.cells())
    except (SuiteError, RegistryError, FileNotFoundError) as exc:
        raise HarnessError(_suite_problems(exc)) from None
    if check_data:
        from harness.data.base import default_data_root

        root = default_data_root(Path(data_root) if data_root else None)
        if problems := data_problems(loaded, root):
            raise HarnessError([f"{suite}: {p}" for p in problems])
    return Validation(loaded.name, cells, list(loaded.left_out))


def run(
    suite: PathLike,
    overrides: Sequence[str] = (),
    *,
    executor: str = "auto",
    results: PathLike = "results",
    only: Sequence[str] = (),
    force: bool = False,
    loggers: Sequence[str] = (),
    workers: int | None = None,
    threads: int | None = None,
    data_root: PathLike | None = None,
    progress: bool = False,
    args: Sequence[str] = (),
) -> RunResult:
    """Run a suite's pending cells as ``harness run`` does (same checks, executors, records).

    Args:
        suite: a suite YAML file.
        overrides: ``KEY=VALUE`` strings (``"recipe.epochs=1"``).
        executor: ``auto``, ``inprocess``, ``local``, ``slurm`` or a plugin's.
        results: the results root; the suite's folder is ``<results>/<suite name>``.
        only: ``--only`` filters.
        force: redo finished cells.
        loggers: trackers (``"mlflow"``, ``"wandb"``, ``"tensorboard"``); MLflow logs to
            ``$MLFLOW_TRACKING_URI`` when set, else to ``<results>/<suite>/mlruns``.
        workers, threads: local worker processes and torch threads per worker.
        data_root: where the data lives.
        progress: show progress bars (off by default in a notebook).
        args: any other ``harness run`` flags (``["--profile", "local", "--wait"]``).

    Returns:
        The exit code and the results folder. The summary table is printed as the CLI prints it.

    Raises:
        HarnessError: the problems that stop a run before it starts (the suite, overrides, data).
    """
    from harness.cli import main
    from harness.storage.loggers import LOGGERS_ENV
    from harness.storage.progress import TENSORBOARD_ENV

    name = validate(suite, overrides, only=only, check_data=False).suite
    argv = ["run", str(suite), *overrides, "--executor", executor, "--results", str(results)]
    for flag in only:
        argv += ["--only", flag]
    for logger in loggers:
        argv += ["--logger", logger]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if data_root is not None:
        argv += ["--data-root", str(data_root)]
    argv += [*(["--force"] if force else []), *([] if progress else ["-q"]), *args]
    # `harness run --logger` hands the trackers to the cells' processes through the environment;
    # in a long-lived Python session that must not outlive this call.
    saved = {k: os.environ.get(k) for k in (LOGGERS_ENV, TENSORBOARD_ENV)}
    try:
        code = main(argv)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return RunResult(code, Path(results) / name)
