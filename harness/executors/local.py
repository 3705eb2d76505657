"""Executors on this machine: one cell after another in this process, or worker processes.

Both run each cell with :func:`harness.executors.ranks.run_one` (the engine's
:func:`harness.engine.runner.run_cell`, or the ranks of a multi-process cell), so a grid gives
the same records wherever it runs.
On a machine with GPUs, each worker is bound to one GPU (it sees only that one, as ``cuda:0``),
a worker of a ``processes: N`` cell to N GPUs (its ranks take one each);
one worker per GPU by default, ``cells_per_gpu`` for more; cells go to whichever worker is free.
On a CPU-only machine the workers share the cores. Whenever several cells share a device their
throughput is measured under contention (recorded as ``cost.shared_device``). A cell that fails
with a sticky CUDA error (illegal address, device-side assert) breaks its worker's CUDA context:
that worker is replaced before another cell runs on its GPU.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from harness.contract import Cell
from harness.engine.environment import visible_gpus
from harness.executors.base import ExecutorOptions, RunOutcome
from harness.executors.devices import (
    BrokenContextError,
    Discover,
    bind_worker,
    choose_gpus,
    gpu_groups,
    is_sticky_cuda_error,
    worker_slots,
)
from harness.executors.faults import (
    MAIN_REIMPORTED_EXIT,
    MachineFaults,
    MainReimported,
    outcome_after,
    raised_failure,
    refuse_run_in_starting_worker,
)
from harness.executors.live import CellLines
from harness.storage.space import OutOfSpace
from harness.storage.tracker_options import TrackerOptions


def run_inprocess(
    cells: list[Cell],
    results_dir: Path,
    data_root: Path | None,
    force: bool = False,
    progress: bool = True,
    faults: MachineFaults | None = None,
    trackers: TrackerOptions | None = None,
) -> list[dict[str, Any]]:
    """Run cells one after another in this process, with a progress bar over cells and the
    running cell's line beneath it (:mod:`harness.executors.live`, drawn from a thread); after
    an out-of-space failure none starts (``faults`` says so: :class:`MachineFaults`). Every
    cell logs to ``trackers``. SIGTERM stops the running cell as Ctrl-C does."""
    from tqdm.auto import tqdm

    from harness.executors.interrupt import sigterm_interrupts

    records: list[dict[str, Any]] = []
    faults = faults if faults is not None else MachineFaults()
    bar = tqdm(cells, desc="cells", unit="cell", disable=not progress)
    lines = CellLines.open(results_dir, progress)
    running: list[Cell] = []
    following = lines.following(lambda: list(running)) if lines else contextlib.nullcontext()
    with sigterm_interrupts(), following:
        for i, cell in enumerate(bar):
            bar.set_postfix_str(cell.label)
            running[:] = [cell]
            stop = _run_here(cell, results_dir, data_root, force, trackers, faults, records, lines)
            running.clear()
            if lines is not None:
                lines.finished(cell)
            if stop:
                break
            _after_cell(records[-1], cell, len(cells) - i - 1)
    return records


def _run_here(
    cell: Cell,
    results_dir: Path,
    data_root: Path | None,
    force: bool,
    trackers: TrackerOptions | None,
    faults: MachineFaults,
    records: list[dict[str, Any]],
    lines: CellLines | None,
) -> bool:
    """One cell of :func:`run_inprocess`, its record appended to ``records``; whether no cell
    may start after it (a full file system: every later cell would fail too). The cell shows
    its progress through its files (the executor's lines), not bars of its own."""
    from harness.executors.ranks import run_one

    if lines is not None:
        lines.started(cell)
    try:
        rec = run_one(cell, results_dir, data_root, force=force, progress=False, trackers=trackers)
        records.append(rec)
    except OutOfSpace as exc:  # raised, not recorded: nothing of the cell could be written
        records.append(raised_failure(cell.cell_id, exc))
    return faults.note(records[-1])


def _after_cell(record: dict[str, Any], cell: Cell, left: int) -> None:
    """Raise :class:`BrokenContextError` after a cell whose failure broke this process's CUDA
    context while ``left`` cells are still to run here."""
    error = (record.get("error") or {}).get("message") or ""
    if is_sticky_cuda_error(error) and left:
        # This process's CUDA context is broken: every later cell here would fail too.
        raise BrokenContextError(
            f"{cell.label} failed with a CUDA error that breaks this process's CUDA "
            f"context ({error.splitlines()[0]}); the {left} cells after it "
            "were not started: run the same command again (finished cells are skipped), "
            "or use --executor local, which replaces a broken worker"
        )


def _run_cell_json(
    cell_json: dict[str, Any],
    results_dir: str,
    data_root: str | None,
    force: bool,
    threads: int = 1,
    shared_device: bool = False,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """A worker's task: one cell (from its JSON) in this spawned process, with the run's
    ``trackers`` (pickled with the call: the worker reads no environment for them)."""
    import torch

    from harness.executors.interrupt import running_cell
    from harness.executors.ranks import run_one

    # After Ctrl-C or SIGTERM no new cell starts, even one already queued to us; if the parent
    # dies, the cell stops as on Ctrl-C and this worker exits.
    with running_cell():
        torch.set_num_threads(threads)  # workers share the cores: no oversubscription
        record = run_one(
            Cell.from_json(cell_json, validated=True),
            Path(results_dir),
            Path(data_root) if data_root else None,
            force=force,
            progress=False,
            shared_device=shared_device,
            trackers=trackers,
        )
    return {**record, "worker": worker_info(record)}


def worker_info(record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where a cell ran, as seen inside its worker (kept in the executor's in-memory records),
    and whether the cell's failure broke the worker's CUDA context (``poisoned``: the executor
    then replaces the worker before it runs another cell)."""
    error = ((record or {}).get("error") or {}).get("message") or ""
    return {
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "poisoned": is_sticky_cuda_error(error),
    }


def run_local(
    cells: list[Cell],
    results_dir: Path,
    data_root: Path | None,
    workers: int,
    force: bool = False,
    progress: bool = True,
    threads: int = 1,
    devices: list[str] | None = None,
    task: Callable[..., dict[str, Any]] = _run_cell_json,
    gpus: list[str] | None = None,
    faults: MachineFaults | None = None,
    trackers: TrackerOptions | None = None,
) -> list[dict[str, Any]]:
    """Run cells in ``workers`` spawned processes on this machine.

    A worker killed by a signal is replaced and its cell retried once; after an out-of-space
    failure no cell starts (``faults`` collects both: :class:`MachineFaults`).

    One-process cells first, on the workers; then each cell of ``processes: N`` (N > 1) in a
    worker that sees N GPUs (disjoint groups of the GPUs, so as many run at once as there are
    groups), from which it launches its N ranks. On the CPU, ``workers // N`` such cells at once.

    Args:
        devices: One ``CUDA_VISIBLE_DEVICES`` value per worker (:func:`worker_slots`); None: the
            workers share the machine's device (CPU).
        task: What a worker calls per cell (a module-level function: it is pickled by name),
            as :func:`_run_cell_json` (the same arguments, ``trackers`` by keyword).
        gpus: The GPUs multi-process cells are placed on (default: those in ``devices``).
        trackers: The experiment trackers every cell logs to (an argument of each task).
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(cells), desc="cells", unit="cell", disable=not progress)
    # One line per running cell beneath the bar, from the cells' files (harness.executors.live).
    lines = CellLines.open(results_dir, progress)
    shared = len(set(devices)) < len(devices) if devices else workers > 1
    common = (str(results_dir), str(data_root) if data_root else None, force, threads, shared)
    # Passed with every task: the workers are spawned, they inherit nothing of this process.
    task = functools.partial(task, trackers=trackers or TrackerOptions())
    one = [c for c in cells if c.recipe.processes <= 1]
    slots: list[str | None] = list(devices) if devices else [None] * workers
    faults = faults if faults is not None else MachineFaults()
    try:
        records = _run_on_slots(one, slots, task, common, bar, faults, lines)
        for n in sorted({c.recipe.processes for c in cells} - {0, 1}):
            if faults.stopped:
                break
            many = [c for c in cells if c.recipe.processes == n]
            gpus = gpus or (list(dict.fromkeys(devices)) if devices else [])
            groups: list[str | None] = (
                gpu_groups(gpus, n) if gpus else [None] * max(1, workers // n)
            )
            records += _run_on_slots(many, groups, task, common, bar, faults, lines)
    finally:
        if lines is not None:
            lines.close()
    bar.close()
    return records


WAIT_POLL_S = 0.2  # how often the parent looks at the Ctrl-C flag while cells run


def dead_worker_exit_code(proc: Any, timeout: float = 10.0) -> int | None:
    """The exit code of a pool's worker that died (minus the signal that killed it), or None
    when it is not known within ``timeout`` seconds.

    The pool's manager thread reaps the dead worker too. When its ``waitpid`` wins the race,
    ours fails (ECHILD) and ``join`` returns before the manager has stored the exit code on the
    shared Process object, so one ``join`` can report None for a worker that SIGKILL ended:
    ask again until the code is there.
    """
    deadline = time.monotonic() + timeout
    while proc.exitcode is None and time.monotonic() < deadline:
        proc.join(timeout=0.1)
    return proc.exitcode


def _run_on_slots(
    cells: list[Cell],
    slots: list[str | None],
    task: Callable[..., dict[str, Any]],
    common: tuple[Any, ...],
    bar: Any,
    faults: MachineFaults,
    lines: CellLines | None = None,
) -> list[dict[str, Any]]:
    """Cells on one single-process pool per slot (a slot: the devices its worker sees), each
    cell to whichever slot is free. A pool per slot, rather than one pool of all, lets one
    worker be replaced: after a cell whose failure is a sticky CUDA error (the process's CUDA
    context is broken, every later cell in it would fail too), that slot's worker is shut down
    and a fresh one started on the same devices; the other workers go on. So is a worker that
    a signal killed (its pool is broken): its cell goes back to the front of the queue, until
    it has killed ``harness.executors.faults.KILLS_ALLOWED`` workers and is failed. After an
    out-of-space failure no cell is submitted; the running ones finish. The running cells'
    ``lines`` (:class:`harness.executors.live.CellLines`; None: none) are redrawn between two
    waits."""
    # Length: submitting, replacing a worker, a kill's retry and Ctrl-C all act on the same
    # pools, their processes, the queue and the running table; split, each part takes them all.
    from harness.executors.interrupt import deferred_stop, kill_pool, stop_pool

    ctx = mp.get_context("spawn")  # fork after torch initialisation is unsafe

    concurrent = min(len(slots), len(cells))  # cells at once: their file loaders share cores

    def start(slot: str | None) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            1, mp_context=ctx, initializer=bind_worker, initargs=(slot, concurrent)
        )

    queue = list(reversed(cells))  # popped from the end: cells start in the given order
    pools = [start(slot) for slot in slots[:concurrent]]
    running: dict[Future, tuple[int, Cell]] = {}
    workers: list[Any] = [None] * len(pools)  # each pool's one process, once started
    records: list[dict[str, Any]] = []

    def submit(i: int) -> None:
        if queue and not faults.stopped:
            cell = queue.pop()
            if lines is not None:
                lines.started(cell)  # before its worker can write a row
            running[pools[i].submit(task, cell.to_json(), *common)] = i, cell
            # The pool's one process (its table, `_processes`, as harness.executors.interrupt
            # reads it): its exit code tells which signal killed it, if one does.
            table = getattr(pools[i], "_processes", None) or {}
            workers[i] = workers[i] or next(iter(table.values()), None)

    def replace(i: int) -> None:
        pools[i].shutdown(wait=True)  # the worker exits (or is gone); its devices: a new one
        pools[i] = start(slots[i])
        workers[i] = None

    def killed(i: int, cell: Cell) -> dict[str, Any] | None:
        """The worker running ``cell`` died: a new one, and the cell again or its failure."""
        proc = workers[i]
        pid, code = (proc.pid, dead_worker_exit_code(proc)) if proc is not None else (None, None)
        if code == MAIN_REIMPORTED_EXIT:  # not the cell's fault: every worker would do the same
            raise MainReimported
        replace(i)
        if faults.worker_killed(cell.cell_id, cell.label, pid, code):
            queue.append(cell)  # next to start, on whichever worker is free first
            return None
        from harness.engine.faults import record_killed_cell

        line = faults.kill_failure(cell.cell_id, cell.label, code)
        return record_killed_cell(cell, Path(common[0]), line)

    # Ctrl-C and SIGTERM set `interrupted`; it is acted on between waits, never inside the
    # pool's locks.
    with deferred_stop() as interrupted:
        try:
            for i in range(len(pools)):
                submit(i)
            while running:
                done, _ = wait(running, timeout=WAIT_POLL_S, return_when=FIRST_COMPLETED)
                if interrupted.is_set():
                    raise interrupted.interruption()
                for fut in done:
                    i, cell = running.pop(fut)
                    if lines is not None:
                        lines.finished(cell)  # its last epochs' lines, before the bar moves
                    try:
                        record = fut.result()
                    except OutOfSpace as exc:  # raised, not recorded: nothing was written
                        record = raised_failure(cell.cell_id, exc)
                    except BrokenProcessPool:  # its worker died: SIGKILL, the OOM killer
                        record = killed(i, cell)
                        if record is None:  # retried
                            submit(i)
                            continue
                    records.append(record)
                    bar.update(1)
                    faults.note(record)  # out of space: submit() starts nothing from now on
                    if record.get("worker", {}).get("poisoned"):
                        replace(i)
                    submit(i)
                if lines is not None:
                    lines.show([c for _, c in running.values()])
        except KeyboardInterrupt:
            stop_pool(pools)  # running cells stop at a safe point, queued ones never start
            raise
        except MainReimported:
            kill_pool(pools)  # the other workers are dying the same way, none holds a cell
            raise
    for pool in pools:
        pool.shutdown()
    return records


class InProcessExecutor:
    """Every cell in this process, one after another (the default on a GPU machine)."""

    name = "inprocess"
    reads = ("threads", "progress", "trackers")
    runs_here = True

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options

    def describe(self, n_cells: int) -> str:
        threads = f", {self.options.threads} torch thread(s)" if self.options.threads else ""
        return f"running {n_cells} cells in this process{threads}"

    def run(
        self, cells: list[Cell], results_dir: Path, data_root: Path | None, force: bool
    ) -> RunOutcome:
        refuse_run_in_starting_worker()  # a script's run at import, re-run by a spawned worker
        if self.options.threads:
            import torch

            torch.set_num_threads(self.options.threads)
        faults = MachineFaults()
        records = run_inprocess(
            cells, results_dir, data_root, force=force, progress=self.options.progress,
            faults=faults, trackers=self.options.trackers,
        )  # fmt: skip
        return outcome_after(faults, records, len(cells))


class LocalWorkersExecutor:
    """Cells in spawned worker processes on this machine.

    With GPUs: ``cells_per_gpu`` workers (default 1) bound to each chosen GPU (``gpus``, default
    every visible one). CPU-only: one worker per core, one thread each (small models train
    several times faster that way than one process with several intra-op threads, measured in
    docs/benchmarks.md). ``discover`` lists the visible GPUs and ``task`` is what a worker
    calls per cell (both injectable for tests).
    """

    name = "local"
    reads = ("workers", "threads", "gpus", "cells_per_gpu", "progress", "trackers")
    runs_here = True

    def __init__(
        self,
        options: ExecutorOptions,
        discover: Discover = visible_gpus,
        task: Callable[..., dict[str, Any]] = _run_cell_json,
    ) -> None:
        self.options = options
        self.discover = discover
        self.task = task
        self._gpus: list[str] | None = None

    def gpus(self) -> list[str]:
        """The GPUs cells are placed on (empty: CPU only)."""
        if self._gpus is None:
            self._gpus = choose_gpus(self.options.gpus, self.discover)
        return self._gpus

    def _shape(self, n_cells: int) -> tuple[int, int, list[str] | None]:
        """(workers, torch threads per worker, each worker's GPU or None on CPU)."""
        cores = os.cpu_count() or 1
        gpus = self.gpus()
        if gpus:
            most = len(gpus) * self.options.cells_per_gpu
            workers = max(1, min(self.options.workers or most, most, n_cells))
            devices = worker_slots(gpus, self.options.cells_per_gpu, workers)
            return workers, self.options.threads or max(1, cores // workers), devices
        workers = max(1, min(self.options.workers or cores, n_cells))
        return workers, self.options.threads or max(1, cores // workers), None

    def describe(self, n_cells: int) -> str:
        workers, threads, devices = self._shape(n_cells)
        where = f" on GPUs {', '.join(dict.fromkeys(devices))}" if devices else ""
        return (
            f"running {n_cells} cells in {workers} worker processes{where}, {threads} "
            "thread(s) each (--executor inprocess for one process)"
        )

    def run(
        self, cells: list[Cell], results_dir: Path, data_root: Path | None, force: bool
    ) -> RunOutcome:
        refuse_run_in_starting_worker()  # a script's run at import, re-run by a spawned worker
        workers, threads, devices = self._shape(len(cells))
        faults = MachineFaults()
        records = run_local(
            cells,
            results_dir,
            data_root,
            workers,
            force=force,
            progress=self.options.progress,
            threads=threads,
            devices=devices,
            task=self.task,
            gpus=self.gpus(),
            faults=faults,
            trackers=self.options.trackers,
        )
        return outcome_after(faults, records, len(cells))
