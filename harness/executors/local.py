"""Executors on this machine: one cell after another in this process, or worker processes.

Both run :func:`harness.runner.run_cell`, so a grid gives the same records wherever it runs.
Worker processes share the machine's device: on a GPU they share it, and their throughput is
measured under contention (recorded as ``cost.shared_device``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from harness.contract import Cell
from harness.executors.base import ExecutorOptions


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
    return run_cell(
        Cell.from_json(cell_json),
        Path(results_dir),
        Path(data_root) if data_root else None,
        force=force,
        progress=False,
        shared_device=shared_device,
    )


def run_local(
    cells: list[Cell],
    results_dir: Path,
    data_root: Path | None,
    workers: int,
    force: bool = False,
    progress: bool = True,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Run cells in ``workers`` spawned processes on this machine (they share its device)."""
    from tqdm.auto import tqdm

    from harness.interrupt import install_worker_handler, stop_pool

    ctx = mp.get_context("spawn")  # fork after torch initialisation is unsafe
    records = []
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=install_worker_handler
    )
    try:
        futures = [
            pool.submit(
                _run_cell_json,
                c.to_json(),
                str(results_dir),
                str(data_root) if data_root else None,
                force,
                threads,
                workers > 1,
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
    """Cells in spawned worker processes on this machine (the default on a CPU-only one: one
    per core, one thread each; small models train several times faster that way than one
    process with several intra-op threads, measured in docs/benchmarks.md)."""

    name = "local"

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options
        self.records: list[dict[str, Any]] = []

    def _shape(self, n_cells: int) -> tuple[int, int]:
        cores = os.cpu_count() or 1
        workers = max(1, min(self.options.workers or cores, n_cells))
        return workers, self.options.threads or max(1, cores // workers)

    def describe(self, n_cells: int) -> str:
        workers, threads = self._shape(n_cells)
        return (
            f"running {n_cells} cells in {workers} worker processes, {threads} thread(s) "
            "each (--executor inprocess for one process)"
        )

    def run(
        self, cells: list[Cell], results_dir: Path, data_root: Path | None, force: bool
    ) -> bool:
        workers, threads = self._shape(len(cells))
        self.records = run_local(
            cells,
            results_dir,
            data_root,
            workers,
            force=force,
            progress=self.options.progress,
            threads=threads,
        )
        return True
