"""Run a suite: :func:`run_suite`, the one way a suite is run. ``harness run`` and
:func:`harness.api.run` both call it with :class:`~harness.session.RunOptions`, so both check,
run and record alike; it prints nothing and returns a :class:`~harness.session.RunResult`
that the command line renders (the start lines through ``on_start``, then the executor's
messages and the summary table) and the Python face hands back."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.config.includes import SuiteError
from harness.session.options import RunOptions
from harness.session.result import CellFailure, RunResult, RunStart, SkippedCell


def run_suite(
    suite: str | os.PathLike,
    options: RunOptions,
    on_start: Callable[[RunStart], None] | None = None,
) -> RunResult:
    """Check everything, write the manifest, hand the pending cells to the executor, and say
    what became of each.

    Args:
        suite: the suite YAML file (parsed and validated once, here).
        options: everything else (:class:`~harness.session.RunOptions`).
        on_start: called once the checks passed and the manifest is written, just before the
            executor starts (the command line prints what is about to run); not for a dry run.

    Returns:
        The cells done, skipped and failed, the executor's messages, the results folder and
        the exit status (``RunResult.exit_code``); a dry run's plan (``RunResult.plan``).

    Raises:
        SuiteError: every problem found before anything runs (the executor's name, options
            it would ignore, the suite and its overrides, the trackers, the data, the results
            folder), one line each.
    """
    from harness.config.overrides import CellFilter
    from harness.executors import make_executor, runs_here
    from harness.executors.base import pending, write_manifest

    _check_executor(options)
    # Data and weight files are checked where the cells run: a scheduler's tasks resolve their
    # own data root (a Slurm profile's setup lines may set HARNESS_DATA_ROOT there).
    here = runs_here(options.executor)
    from harness.session.checks import load_suite_arg

    loaded = load_suite_arg(suite, options.overrides, check_files=here)
    all_cells = loaded.cells()
    cells = CellFilter(list(options.only)).select(all_cells)
    results = Path(options.results) / loaded.name
    if options.dry_run:  # what would run; the data is checked by `validate` and the run itself
        from harness.session.plan import plan_cells

        plan = plan_cells(all_cells, cells, results, options.force)
        return RunResult(loaded.name, results, cells, [], plan=plan)
    executor_options = _preflight(loaded, str(suite), options, results, here)
    try:
        results.mkdir(parents=True, exist_ok=True)
        write_manifest(loaded, results, tuple(options.only))
    except OSError as exc:  # its path, not that of the temporary file the write failed on
        problem = f"{results}: cannot write the results folder: {exc.strerror or exc}"
        raise SuiteError([problem]) from None
    todo = pending(cells, results, options.force)
    executor = make_executor(_executor_name(options), executor_options, len(todo))
    start = RunStart(loaded.name, results, cells, todo, executor.describe(len(todo)))
    if on_start is not None:
        on_start(start)
    t0 = time.perf_counter()
    # None: each cell's process resolves $HARNESS_DATA_ROOT or the user cache itself.
    root = Path(options.data_root).expanduser().resolve() if options.data_root else None
    outcome = executor.run(todo, results, root, options.force)
    return _result(start, outcome, time.perf_counter() - t0)


def _check_executor(options: RunOptions) -> None:
    """Import the plugins, then check the executor's name and the options it would ignore, and
    build it once when named (a Slurm profile's problems), before the suite is read."""
    from harness.executors import make_executor, resolve_name
    from harness.executors.devices import ExecutorError
    from harness.registry.core import load_plugins
    from harness.session.checks import run_flag_problems

    if options.plugins:  # before the executor's name: a plugin may add the executor
        load_plugins(options.plugins)
    try:  # the name may be a plugin's, known only once plugins are imported
        resolve_name(options.executor, 0)
    except ExecutorError as exc:
        raise SuiteError([f"harness run: error: {exc} (see harness run --help)"]) from None
    if flag_problems := run_flag_problems(options.executor, options.executor_options):
        raise SuiteError([f"harness run: {p}" for p in flag_problems])  # nothing has run yet
    if options.executor != "auto":  # its options (a Slurm profile), checked before anything runs
        make_executor(options.executor, options.executor_options)
    if options.executor_options.gpus is not None and _executor_name(options) == "local":
        from harness.engine.environment import visible_gpus
        from harness.executors.devices import choose_gpus

        choose_gpus(options.executor_options.gpus, visible_gpus)  # before anything runs


def _preflight(loaded: Any, source: str, options: RunOptions, results: Path, here: bool) -> Any:
    """The checks of this machine (trackers; data and the results folder where the cells run
    here); the executor's options with the trackers' settings resolved as this process sees
    them. Raises :class:`SuiteError` with every problem."""
    from harness.session.checks import default_root, preflight

    trackers = options.executor_options.trackers
    if here:  # the data layer imports torch: only on the way to running cells here
        problems = preflight(loaded, source, trackers, default_root(options.data_root), results)
    else:
        problems = preflight(loaded, source, trackers, None)
    if problems:
        raise SuiteError(problems)
    # Where the trackers log, as this process sees it ($MLFLOW_TRACKING_URI, $WANDB_PROJECT…),
    # fixed now and handed to every cell's process with the executor's options.
    return dataclasses.replace(options.executor_options, trackers=trackers.resolved())


def _done_since(cell_dir: Path) -> bool:
    """Whether a cell another process held when this run reached it has a done record now."""
    from harness.contract import usable_record

    rec = usable_record(cell_dir)
    return rec is not None and rec.get("status") == "done"


def _executor_name(options: RunOptions) -> str:
    """The executor asked for; ``auto`` with ``--gpus`` is the local executor, the one that
    places cells on GPUs (``auto`` chose in-process for one pending cell, and the GPUs named
    were silently ignored)."""
    if options.executor == "auto" and options.executor_options.gpus is not None:
        return "local"
    return options.executor


def _result(start: RunStart, outcome: Any, seconds: float) -> RunResult:
    """The run's result from the executor's outcome: each selected cell done, skipped or
    failed (a cell handed to a scheduler, or never started, is none of them: pending)."""
    from harness.storage.lease import describe

    labels = {c.cell_id: c.label for c in start.cells}
    todo = {c.cell_id for c in start.todo}
    skipped = [SkippedCell(c.cell_id, c.label, "done", "done") for c in start.cells
               if c.cell_id not in todo]  # fmt: skip
    done: list[str] = []
    failed: list[CellFailure] = []
    for rec in outcome.records:
        cid, status = rec.get("cell_id", ""), rec.get("status")
        if status == "done":
            done.append(cid)
        elif status == "leased":
            owner = describe(rec["lease"])
            if _done_since(start.results_dir / cid):  # the other run finished it meanwhile
                skipped.append(SkippedCell(cid, labels.get(cid, cid), "done", f"done by {owner}"))
            else:
                reason = f"leased by {owner}"
                skipped.append(SkippedCell(cid, labels.get(cid, cid), "leased", reason))
        elif status == "failed":
            failed.append(CellFailure.of(rec, labels.get(cid, cid)))
    return RunResult(
        **{f.name: getattr(start, f.name) for f in dataclasses.fields(RunStart)},
        done=done,
        skipped=skipped,
        failed=failed,
        finished=outcome.finished,
        halted=outcome.halted,
        messages=list(outcome.messages),
        seconds=seconds,
    )
