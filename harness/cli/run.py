"""``harness run SUITE [KEY=VALUE…]``: run a suite's pending cells on the chosen executor.

:func:`run_suite` is the one way a suite is run: ``harness run`` (:func:`cmd_run`, which turns
its flags into :class:`RunOptions`) and :func:`harness.api.run` (which turns its arguments into
the same) both call it, so both check, run and record alike.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.cli.checks import run_flag_problems
from harness.cli.validate import load_suite_arg, preflight, tracker_options_of
from harness.config.includes import SuiteError
from harness.executors.base import ExecutorOptions


@dataclass(frozen=True)
class RunOptions:
    """How a suite is run: what ``harness run``'s flags and :func:`harness.api.run`'s
    arguments set.

    Attributes:
        overrides: ``KEY=VALUE`` suite overrides (``recipe.epochs=2``).
        only: ``--only`` filters (``method=sigma_ens,seed=0``).
        executor: ``auto``, ``inprocess``, ``local``, ``slurm`` or a plugin's.
        results: the results root; the suite's folder is ``<results>/<suite name>``.
        data_root: where the data lives (None: each cell's process resolves
            ``$HARNESS_DATA_ROOT``, else the user cache).
        force: redo finished cells.
        dry_run: say which cells would run and why the others would not; run nothing.
        list_every: with ``dry_run``, one line for every cell whatever the suite's size.
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
    list_every: bool = False
    plugins: tuple[str, ...] = ()
    executor_options: ExecutorOptions = field(default_factory=ExecutorOptions)


def run_options(args) -> RunOptions:
    """The :class:`RunOptions` that ``harness run``'s parsed flags set."""
    return RunOptions(
        overrides=tuple(args.overrides),
        only=tuple(args.only),
        executor=args.executor,
        results=Path(args.results or "results"),
        data_root=Path(args.data_root) if args.data_root else None,
        force=args.force,
        dry_run=args.dry_run,
        list_every=args.list,
        plugins=tuple(args.plugin),
        executor_options=ExecutorOptions(
            workers=args.workers,
            threads=args.threads,
            profile=args.profile,
            slurm_overrides=tuple(args.slurm),
            wait=args.wait,
            progress=not args.quiet,
            gpus=args.gpus,
            cells_per_gpu=args.cells_per_gpu or 1,
            trackers=tracker_options_of(args),
        ),
    )


def cmd_run(args) -> int:
    """``harness run``: :func:`run_suite` with the options its flags set."""
    return run_suite(args.suite, run_options(args))


def run_suite(suite: str | os.PathLike, options: RunOptions) -> int:
    """Check, write the manifest, hand the pending cells to the executor, print its outcome
    and the summary table.

    Args:
        suite: the suite YAML file.
        options: everything else (:class:`RunOptions`).

    Returns:
        0 every cell done (or handed to a scheduler; also a dry run), 1 a cell failed (its
        record says why), 2 a cell's data or weights were missing or damaged.

    Raises:
        SuiteError: every problem found before anything runs (the executor's name, flags it
            would ignore, the suite and its overrides, the trackers, the data, the results
            folder), one line each.
    """
    from harness.config.overrides import CellFilter
    from harness.executors import make_executor, resolve_name, runs_here
    from harness.executors.base import pending, write_manifest
    from harness.executors.devices import ExecutorError
    from harness.registry.core import load_plugins

    if options.plugins:  # before the executor's name: a plugin may add the executor
        load_plugins(options.plugins)
    try:  # the name may be a plugin's, known only once plugins are imported
        resolve_name(options.executor, 0)
    except ExecutorError as exc:
        raise SuiteError([f"harness run: error: {exc} (see harness run --help)"]) from None
    executor_options = options.executor_options
    if flag_problems := run_flag_problems(options.executor, executor_options):
        raise SuiteError([f"harness run: {p}" for p in flag_problems])  # nothing has run yet
    if options.executor != "auto":  # its options (a Slurm profile), checked before anything runs
        make_executor(options.executor, executor_options)
    # Data and weight files are checked where the cells run: a scheduler's tasks resolve their
    # own data root (a Slurm profile's setup lines may set HARNESS_DATA_ROOT there).
    here = runs_here(options.executor)
    loaded = load_suite_arg(str(suite), list(options.overrides), check_files=here)
    all_cells = loaded.cells()
    cells = CellFilter(list(options.only)).select(all_cells)
    results = Path(options.results) / loaded.name
    if options.dry_run:  # what would run; the data is checked by `validate` and the run itself
        return print_plan(all_cells, cells, results, options.force, every=options.list_every)
    trackers = executor_options.trackers
    if here:  # the data layer imports torch: only on the way to running cells here
        from harness.data._machinery.base import default_data_root

        root = default_data_root(options.data_root)
        problems = preflight(loaded, str(suite), trackers, root, results)
    else:
        problems = preflight(loaded, str(suite), trackers, None)
    if problems:
        raise SuiteError(problems)
    # Where the trackers log, as this process sees it ($MLFLOW_TRACKING_URI, $WANDB_PROJECT…),
    # fixed now and handed to every cell's process with the executor's options.
    executor_options = dataclasses.replace(executor_options, trackers=trackers.resolved())
    try:
        results.mkdir(parents=True, exist_ok=True)
        write_manifest(loaded, results, tuple(options.only))
    except OSError as exc:  # its path, not that of the temporary file the write failed on
        problem = f"{results}: cannot write the results folder: {exc.strerror or exc}"
        raise SuiteError([problem]) from None
    todo = pending(cells, results, options.force)
    print(
        f"suite {loaded.name!r}: {len(cells)} cells, {len(cells) - len(todo)} already done, "
        f"{len(todo)} to run → {results}"
    )
    executor = make_executor(options.executor, executor_options, len(todo))
    return _run_and_report(executor, todo, results, options)


def _run_and_report(executor, todo: list, results: Path, options: RunOptions) -> int:
    """Run ``todo`` on ``executor``; print its messages, then the summary once cells are over."""
    print(executor.describe(len(todo)))
    t0 = time.perf_counter()
    # None: each cell's process resolves $HARNESS_DATA_ROOT or the user cache itself.
    root = Path(options.data_root).expanduser().resolve() if options.data_root else None
    outcome = executor.run(todo, results, root, options.force)
    for line in outcome.messages:
        print(line)
    if not outcome.finished:  # handed to a scheduler: `harness status` follows it
        return 0
    print(f"finished in {time.perf_counter() - t0:.1f} s")
    report_leased(outcome.records)
    code = summary_or_full_disk(results)
    # A cell that failed on its data or weights (missing, damaged), or on a plugin metric that
    # raised or returned no number (MetricError), is the user's to fix: exit 2, as for the same
    # problem found before the run.
    missing = any(
        (err := r.get("error") or {}).get("data_missing") or err.get("type") == "MetricError"
        for r in outcome.records
    )
    # A full file system stopped the run: cells are left pending, whatever the summary says.
    return 2 if missing else max(code, int(outcome.halted))


def summary_or_full_disk(results: Path) -> int:
    """:func:`reports.render.terminal.print_summary`, whose record index may not fit on a file
    system the run filled: then one line instead of the table (the records are all there),
    status 1."""
    from harness.storage.space import out_of_space, out_of_space_cause
    from reports.render.terminal import print_summary

    try:
        return print_summary(results)
    except OSError as exc:
        cause = out_of_space_cause(exc)
        if cause is None:
            raise
        where = cause.filename or results
        print(f"no summary: {out_of_space(where, cause)}; `harness status {results}` lists "
              "the cells")  # fmt: skip
        return 1


#: A plan of up to this many cells lists each; a larger one lists (up to this many of) the cells
#: that would run or are held by another process, then the count per reason (--list: every cell).
PLAN_LINES = 50


def _verdict(
    cell, chosen: set, leases: dict, results: Path | None, force: bool
) -> tuple[str, str, str]:
    """(``run`` or ``skip``, the kind of reason the summary counts, why) for one cell."""
    from harness.contract import DamagedRecord, read_record
    from harness.storage.lease import describe

    if cell.cell_id not in chosen:
        return "skip", "not selected by --only", "not selected by --only"
    if cell.cell_id in leases:
        return (
            "skip",
            "leased by another live process",
            f"leased by {describe(leases[cell.cell_id])}",
        )
    try:
        rec = read_record(results / cell.cell_id) if results is not None else None
    except DamagedRecord as exc:
        why = f"damaged record.json, set aside and redone: {exc.reason}"
        return "run", "damaged record.json, set aside and redone", why
    status = (rec or {}).get("status")
    if status == "done":
        return ("run", *["done, redone (--force)"] * 2) if force else ("skip", "done", "done")
    if status == "failed":
        err = (rec or {}).get("error") or {}
        where = f" in {err['phase']}" if err.get("phase") else ""
        return "run", "failed, retried", f"failed{where} ({err.get('type', '?')}), retried"
    return "run", "pending", "pending"


def print_plan(
    all_cells: list, selected: list, results: Path, force: bool, every: bool = False
) -> int:
    """``--dry-run``: each cell ``run`` or ``skip`` and why: one line per cell for a plan of up
    to :data:`PLAN_LINES` cells or with ``every``; otherwise the cells that would run or are
    leased (the first :data:`PLAN_LINES`) and the number of cells per verdict and reason."""
    from collections import Counter

    from harness.storage.lease import live_leases

    chosen = {c.cell_id for c in selected}
    leases = live_leases(results) if results.is_dir() else {}
    where = results if results.is_dir() else None
    every = every or len(all_cells) <= PLAN_LINES
    counts: Counter = Counter()
    shown = 0
    for c in all_cells:
        verdict, kind, why = _verdict(c, chosen, leases, where, force)
        counts[verdict, kind] += 1
        if every or ((verdict == "run" or kind.startswith("leased")) and shown < PLAN_LINES):
            print(f"{verdict:4s}  {c.cell_id}  {c.label}  ({why})")
            shown += not every
    n_run = sum(n for (verdict, _), n in counts.items() if verdict == "run")
    if not every:
        for (verdict, why), n in sorted(counts.items()):
            print(f"{verdict:4s}  {n:,} cells: {why}")
        if shown < sum(n for (v, k), n in counts.items() if v == "run" or k.startswith("leased")):
            print(f"(the first {PLAN_LINES} cells that would run or are leased are listed; "
                  "--list lists every cell)")  # fmt: skip
    print(f"dry run: {n_run} of {len(all_cells)} cells would run → {results}")
    return 0


def report_leased(ran: list[dict]) -> None:
    """Name the cells this run skipped because another live process holds them."""
    from harness.storage.lease import describe

    for r in ran:
        if r.get("status") == "leased":
            print(f"skipped {r['cell_id']}: leased by {describe(r['lease'])}")
