"""``harness run SUITE [KEY=VALUE…]``: run a suite's pending cells on the chosen executor.

The run itself is :func:`harness.session.run_suite`, which :func:`harness.api.run` calls too;
this module turns the flags into its :class:`~harness.session.RunOptions` and renders the
:class:`~harness.session.RunResult`: the lines before the executor starts, its messages, the
cells skipped because another process holds them, and the summary table (or a dry run's plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.executors.base import ExecutorOptions
from harness.session import RunOptions, RunResult, RunStart
from harness.session.plan import plan_cells


def run_options(args: Any) -> RunOptions:
    """The :class:`~harness.session.RunOptions` that ``harness run``'s parsed flags set."""
    from harness.cli.validate import tracker_options_of

    return RunOptions(
        overrides=tuple(args.overrides),
        only=tuple(args.only),
        executor=args.executor,
        results=Path(args.results or "results"),
        data_root=Path(args.data_root) if args.data_root else None,
        force=args.force,
        dry_run=args.dry_run,
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


def cmd_run(args: Any) -> int:
    """``harness run``: :func:`harness.session.run_suite` with the options its flags set, its
    result printed; the exit status is the result's (1 also when no summary could be written)."""
    from harness.contract.errors import UsageError
    from harness.session import run as session_run

    if args.list and not args.dry_run:  # it used to train every cell, the plan never shown
        raise UsageError("--list lists a dry run's plan: add --dry-run (nothing is trained)")
    result = session_run.run_suite(
        args.suite, run_options(args), on_start=lambda start: print_start(start, args.suite)
    )
    return render_result(result, every=args.list)


def print_start(start: RunStart, suite: str = "SUITE") -> None:
    """The two lines before the executor starts: the cells and where they go, and how they run;
    then a note when done cells were evaluated otherwise than the suite now asks."""
    n, todo = len(start.cells), len(start.todo)
    print(
        f"suite {start.suite!r}: {n} cells, {n - todo} already done, {todo} to run → "
        f"{start.results_dir}"
    )
    print(start.executor)
    for note in evaluation_notes(start, suite):
        print(note)


def _scored_on(limit: int | None) -> str:
    return f"evaluation.limit={limit}" if limit else "the whole test set"


def evaluation_notes(start: RunStart, suite: str = "SUITE") -> list[str]:
    """A line for the done cells (left as they are: the evaluation is not part of a cell's id)
    whose records were evaluated with other settings than the suite's now: another
    ``evaluation.limit`` (their records keep it, the report never pools them with the others),
    or other OOD sets, corruptions, calibration… (a suite that gained an OOD set said "0 to
    run" and nothing else). ``harness evaluate`` brings them to the suite's settings."""
    import json

    todo = {c.cell_id for c in start.todo}
    limits: list[tuple[str, int | None, int | None]] = []
    other: dict[str, list[str]] = {}
    for cell in start.cells:
        if cell.cell_id in todo:
            continue
        try:
            record = json.loads((start.results_dir / cell.cell_id / "record.json").read_text())
            was = dict(record.get("evaluation") or {})
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        now = cell.to_json()["evaluation"]
        if (was.pop("limit", None) or None) != (now.pop("limit", None) or None):
            limits.append((cell.cell_id, was_limit(record), cell.evaluation.limit))
        # a key an older record lacks is not a difference: it predates the setting
        if fields := [k for k in now if k in was and was[k] != now[k]]:
            other.setdefault(cell.cell_id, fields)
    how = f"harness evaluate {start.results_dir} --suite {suite}"
    notes = []
    if limits:
        cid, was, now = limits[0]
        notes.append(
            f"note: {len(limits)} done cells (e.g. {cid}) were scored on {_scored_on(was)}, "
            f"this suite asks for {_scored_on(now)}; left as they are (never pooled with the "
            f"others): {how} re-scores them at the suite's limit"
        )
    if other:
        cid, fields = next(iter(other.items()))
        notes.append(
            f"note: {len(other)} done cells (e.g. {cid}) were evaluated with other settings "
            f"than this suite's (evaluation: {', '.join(fields)}); left as they are: {how} "
            "re-evaluates them from their saved weights (no retraining)"
        )
    return notes


def was_limit(record: dict) -> int | None:
    """The ``evaluation.limit`` a record was scored with (None: the whole test set)."""
    return (record.get("evaluation") or {}).get("limit") or None


def render_result(result: RunResult, every: bool = False) -> int:
    """Print what a run did: a dry run's plan; else the executor's messages and, once its cells
    are over, the time, the cells another process holds and the summary table. Returns the
    exit status."""
    if result.plan is not None:
        return render_plan(result.plan, result.results_dir, every)
    for line in result.messages:
        print(line)
    if not result.finished:  # handed to a scheduler: `harness status` follows it
        return result.exit_code
    print(f"finished in {result.seconds:.1f} s")
    for skipped in result.skipped:  # the cells another run held when this one reached them
        if skipped.kind == "leased" or skipped.reason.startswith("done by "):
            print(f"skipped {skipped.cell_id}: {skipped.reason}")
    status = max(result.exit_code, summary_or_full_disk(result.results_dir))
    if result.leased:  # the last line names what is left undone, as for failed cells
        owners = sorted({s.reason.removeprefix("leased by ") for s in result.leased})
        print(f"not done here: {len(result.leased)} cell(s) held by another live run "
              f"({', '.join(owners[:3])}{', …' if len(owners) > 3 else ''}); "
              f"`harness status {result.results_dir}` follows them, and this command again "
              "prints the whole table once they are done")  # fmt: skip
    return status


def summary_or_full_disk(results: Path) -> int:
    """:func:`reports.render.terminal.print_summary`, whose record index may not fit on a file
    system the run filled: then one line instead of the table (the records are all there),
    status 1; otherwise 0 (the failed cells are the result's to count)."""
    from harness.storage.space import out_of_space, out_of_space_cause
    from reports.render.terminal import print_summary

    try:
        print_summary(results)
    except OSError as exc:
        cause = out_of_space_cause(exc)
        if cause is None:
            raise
        where = cause.filename or results
        print(f"no summary: {out_of_space(where, cause)}; `harness status {results}` lists "
              "the cells")  # fmt: skip
        return 1
    return 0


#: A plan of up to this many cells lists each; a larger one lists (up to this many of) the cells
#: that would run or are held by another process, then the count per reason (--list: every cell).
PLAN_LINES = 50


def print_plan(
    all_cells: list, selected: list, results: Path, force: bool, every: bool = False
) -> int:
    """``--dry-run``'s output for ``all_cells`` of which ``selected`` are kept by ``--only``:
    :func:`harness.session.plan.plan_cells`, rendered by :func:`render_plan`."""
    return render_plan(plan_cells(all_cells, selected, results, force), results, every)


def render_plan(plan: list, results: Path, every: bool = False) -> int:
    """Each cell ``run`` or ``skip`` and why: one line per cell for a plan of up to
    :data:`PLAN_LINES` cells or with ``every``; otherwise the cells that would run or are
    leased (the first :data:`PLAN_LINES`) and the number of cells per verdict and reason."""
    from collections import Counter

    every = every or len(plan) <= PLAN_LINES
    counts: Counter = Counter()
    shown = 0
    for p in plan:
        counts[p.verdict, p.kind] += 1
        if every or ((p.verdict == "run" or p.kind.startswith("leased")) and shown < PLAN_LINES):
            print(f"{p.verdict:4s}  {p.cell.cell_id}  {p.cell.label}  ({p.why})")
            shown += not every
    n_run = sum(n for (verdict, _), n in counts.items() if verdict == "run")
    if not every:
        for (verdict, why), n in sorted(counts.items()):
            print(f"{verdict:4s}  {n:,} cells: {why}")
        if shown < sum(n for (v, k), n in counts.items() if v == "run" or k.startswith("leased")):
            print(f"(the first {PLAN_LINES} cells that would run or are leased are listed; "
                  "--list lists every cell)")  # fmt: skip
    print(f"dry run: {n_run} of {len(plan)} cells would run → {results}")
    return 0
