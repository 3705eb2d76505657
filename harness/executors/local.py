"""Executors on this machine: one cell after another in this process, or worker processes.

Both run :func:`harness.runner.run_cell`, so a grid gives the same records wherever it runs.
On a machine with GPUs, each worker is bound to one GPU (it sees only that one, as ``cuda:0``):
one worker per GPU by default, ``cells_per_gpu`` for more; cells go to whichever worker is free.
On a CPU-only machine the workers share the cores. Whenever several cells share a device their
throughput is measured under contention (recorded as ``cost.shared_device``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from harness.contract import Cell
from harness.executors.base import ExecutorOptions
from harness.executors.devices import Discover, bind_worker, choose_gpus, visible_gpus, worker_slots


def run_inprocess(
    cells: list[Cell],
    results_dir: Path,
    data_root: Path | None,
    force: bool = False,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run cells one after another in this process, with a progress bar over cells."""
    from tqdm.auto import tqdm

    from harness.runner import run_cell

    records = []
    bar = tqdm(cells, desc="cells", unit="cell", disable=not progress)
    for cell in bar:
        bar.set_postfix_str(cell.label)
        records.append(run_cell(cell, results_dir, data_root, force=force, progress=progress))
    return records


def _run_cell_json(
    cell_json: dict[str, Any],
    results_dir: str,
    data_root: str | None,
    force: bool,
    threads: int = 1,
    shared_device: bool = False,
) -> dict[str, Any]:
    import torch

    from harness.interrupt import check_not_stopping
    from harness.runner import run_cell

    check_not_stopping()  # after Ctrl-C no new cell starts, even one already queued to us
    torch.set_num_threads(threads)  # workers share the cores: no oversubscription
    record = run_cell(
        Cell.from_json(cell_json),
        Path(results_dir),
        Path(data_root) if data_root else None,
        force=force,
        progress=False,
        shared_device=shared_device,
    )
    return {**record, "worker": worker_info()}


def worker_info() -> dict[str, Any]:
    """Where a cell ran, as seen inside its worker (kept in the executor's in-memory records)."""
    return {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


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
) -> list[dict[str, Any]]:
    """Run cells in ``workers`` spawned processes on this machine.

    Args:
        devices: One ``CUDA_VISIBLE_DEVICES`` value per worker (:func:`worker_slots`); None: the
            workers share the machine's device (CPU).
        task: What a worker calls per cell (a module-level function: it is pickled by name).
    """
    from tqdm.auto import tqdm

    from harness.interrupt import stop_pool

    ctx = mp.get_context("spawn")  # fork after torch initialisation is unsafe
    slots = None
    if devices:
        workers = len(devices)
        slots = ctx.Queue()
        for d in devices:  # each worker takes one when it starts: one binding per worker
            slots.put(d)
    shared = len(set(devices)) < len(devices) if devices else workers > 1
    records = []
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=bind_worker, initargs=(slots,)
    )
    try:
        futures = [
            pool.submit(
                task,
                c.to_json(),
                str(results_dir),
                str(data_root) if data_root else None,
                force,
                threads,
                shared,
            )
            for c in cells
        ]
        for fut in tqdm(
            as_completed(futures),
            total=len(futures),
            desc="cells",
            unit="cell",
            disable=not progress,
        ):
            records.append(fut.result())
    except KeyboardInterrupt:
        stop_pool(pool)  # running cells stop at a safe point, queued ones never start
        raise
    pool.shutdown()
    return records


class InProcessExecutor:
    """Every cell in this process, one after another (the default on a GPU machine)."""

    name = "inprocess"

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options
        self.records: list[dict[str, Any]] = []

    def describe(self, n_cells: int) -> str:
        threads = f", {self.options.threads} torch thread(s)" if self.options.threads else ""
        return f"running {n_cells} cells in this process{threads}"

    def run(
        self, cells: list[Cell], results_dir: Path, data_root: Path | None, force: bool
    ) -> bool:
        if self.options.threads:
            import torch

            torch.set_num_threads(self.options.threads)
        self.records = run_inprocess(
            cells, results_dir, data_root, force=force, progress=self.options.progress
        )
        return True


class LocalWorkersExecutor:
    """Cells in spawned worker processes on this machine.

    With GPUs: ``cells_per_gpu`` workers (default 1) bound to each chosen GPU (``gpus``, default
    every visible one). CPU-only: one worker per core, one thread each (small models train
    several times faster that way than one process with several intra-op threads, measured in
    docs/benchmarks.md). ``discover`` lists the visible GPUs and ``task`` is what a worker
    calls per cell (both injectable for tests).
    """

    name = "local"

    def __init__(
        self,
        options: ExecutorOptions,
        discover: Discover = visible_gpus,
        task: Callable[..., dict[str, Any]] = _run_cell_json,
    ) -> None:
        self.options = options
        self.discover = discover
        self.task = task
        self.records: list[dict[str, Any]] = []
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
    ) -> bool:
        workers, threads, devices = self._shape(len(cells))
        self.records = run_local(
            cells,
            results_dir,
            data_root,
            workers,
            force=force,
            progress=self.options.progress,
            threads=threads,
            devices=devices,
            task=self.task,
        )
        return True
