"""Check and run suites from Python (:func:`validate`, :func:`run`): the functions ``harness
validate`` and ``harness run`` call (:mod:`harness.session`), with keyword arguments for the
flags, their problems raised as :class:`HarnessError`, and their typed results handed back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.api._common import HarnessError, PathLike, argument_problems
from harness.session.result import RunResult, Validation

__all__ = ["RunResult", "Validation", "run", "validate"]


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
        The suite's name and cells (:class:`harness.session.Validation`).

    Raises:
        HarnessError: every problem, each naming its file and key or the override.
    """
    from harness.config.includes import SuiteError
    from harness.registry.core import RegistryError
    from harness.session import ValidateOptions, validate_suite

    if problems := argument_problems(
        {"suite": suite}, {"overrides": overrides, "only": only}
    ) + argument_problems({"data_root": data_root} if data_root is not None else {}):
        raise HarnessError(problems)
    options = ValidateOptions(
        overrides=tuple(overrides),
        only=tuple(only),
        check_data=check_data,
        data_root=Path(data_root) if data_root is not None else None,
    )
    try:
        return validate_suite(suite, options)
    except (SuiteError, RegistryError, FileNotFoundError) as exc:
        raise HarnessError(_suite_problems(exc)) from None


def run(
    suite: PathLike,
    overrides: Sequence[str] = (),
    *,
    executor: str = "auto",
    results: PathLike = "results",
    only: Sequence[str] = (),
    force: bool = False,
    loggers: Sequence[str] = (),
    tags: Mapping[str, object] | None = None,
    mlflow_experiment: str | None = None,
    wandb_project: str | None = None,
    log_model: bool = False,
    workers: int | None = None,
    threads: int | None = None,
    gpus: Sequence[str] | None = None,
    cells_per_gpu: int | None = None,
    profile: str | None = None,
    slurm: Sequence[str] = (),
    wait: bool = False,
    data_root: PathLike | None = None,
    plugins: Sequence[str] = (),
    progress: bool = False,
    limit: int | None = None,
) -> RunResult:
    """Run a suite's pending cells: :func:`harness.session.run_suite`, the function ``harness
    run`` calls, with the same checks, executors and records. Nothing is printed (progress bars
    with ``progress``); the summary table is :func:`leaderboard`'s.

    Args:
        suite: a suite YAML file.
        overrides: ``KEY=VALUE`` strings (``"recipe.epochs=1"``).
        executor: ``auto``, ``inprocess``, ``local``, ``slurm`` or a plugin's.
        results: the results root; the suite's folder is ``<results>/<suite name>``.
        only: ``--only`` filters.
        force: redo finished cells.
        loggers: trackers (``"mlflow"``, ``"wandb"``, ``"tensorboard"``); MLflow logs to
            ``$MLFLOW_TRACKING_URI`` when set, else to ``<results>/<suite>/mlruns``. They are
            handed to every cell's process with the executor's options; nothing is set in this
            process's environment.
        tags: ``{key: value}`` tags for every tracker run (``--tag key=value``).
        mlflow_experiment: the MLflow experiment (default: ``$MLFLOW_EXPERIMENT_NAME``, else the
            suite's name).
        wandb_project: the W&B project (default: ``$WANDB_PROJECT``, else
            ``implicit-ensemble-harness``).
        log_model: send each finished cell's ``final.pt`` to MLflow / W&B as an artifact.
        workers, threads: local worker processes and torch threads per worker.
        gpus, cells_per_gpu: the local executor's GPUs (``["0", "2"]`` or ``[0, 2]``) and cells per
            GPU.
        profile, slurm, wait: the Slurm executor's profile, ``KEY=VALUE`` profile overrides,
            and whether to wait for the job array.
        data_root: where the data lives.
        plugins: modules to import first (``--plugin``).
        progress: show progress bars (off by default in a notebook).
        limit: score every cell on a fixed subset of this many test images (and of each OOD
            and corruption set): a quick first look, the override ``evaluation.limit=N``
            (docs/records.md); such cells are never pooled or compared with full-set ones.

    Returns:
        What the run did (:class:`harness.session.RunResult`): ``exit_code`` (``harness
        run``'s), ``results_dir`` (read it with :func:`load_results`), the cells ``done``,
        ``skipped`` and ``failed`` (each with its reason; ``leased``: the skipped cells another
        live process still holds), the executor's ``messages``.

    Raises:
        HarnessError: the problems that stop a run before it starts (the suite, overrides,
            options an executor would ignore, trackers, data), one line each.
    """
    # Length: one keyword per `harness run` option, each documented above, mapped onto the
    # RunOptions the command line builds; split, the mapping would repeat the signature.
    from harness.config.includes import SuiteError
    from harness.contract.errors import UsageError
    from harness.executors.base import ExecutorOptions
    from harness.executors.devices import ExecutorError
    from harness.registry.core import RegistryError
    from harness.session import RunOptions
    from harness.session import run as session_run
    from harness.storage.tracker_options import TrackerOptions

    if isinstance(gpus, list | tuple):  # GPU indices as numbers too: gpus=[0, 2]
        gpus = [str(g) if isinstance(g, int) and not isinstance(g, bool) else g for g in gpus]
    problems = argument_problems(
        {"suite": suite, "results": results, **({"data_root": data_root} if data_root else {})},
        {"overrides": overrides, "only": only, "loggers": loggers, "plugins": plugins,
         "slurm": slurm, **({"gpus": gpus} if gpus is not None else {})},
        {"workers": workers, "threads": threads, "cells_per_gpu": cells_per_gpu},
    )  # fmt: skip
    if problems:
        raise HarnessError(problems)
    trackers = TrackerOptions.of(
        loggers,
        tags or {},
        mlflow_experiment=mlflow_experiment,
        wandb_project=wandb_project,
        log_model=log_model,
    )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise HarnessError([f"limit: {limit!r}: pass a whole number of test images >= 1, or None "
                            "for the whole test set"])  # fmt: skip
    if limit is not None:
        overrides = [*overrides, f"evaluation.limit={limit}"]
    options = RunOptions(
        overrides=tuple(overrides),
        only=tuple(only),
        executor=executor,
        results=Path(results),
        data_root=Path(data_root) if data_root is not None else None,
        force=force,
        plugins=tuple(plugins),
        executor_options=ExecutorOptions(
            workers=workers,
            threads=threads,
            profile=profile,
            slurm_overrides=tuple(slurm),
            wait=wait,
            progress=progress,
            gpus=tuple(gpus) if gpus is not None else None,
            cells_per_gpu=cells_per_gpu or 1,
            trackers=trackers,
        ),
    )
    try:
        return session_run.run_suite(suite, options)
    except SuiteError as exc:
        raise HarnessError(_suite_problems(exc)) from None
    except (RegistryError, ExecutorError, UsageError) as exc:
        raise HarnessError([str(exc)]) from None
