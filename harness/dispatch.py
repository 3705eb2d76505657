"""Executors: run a suite's pending cells in-process, in local worker processes, or on Slurm.

All three run the same :func:`harness.runner.run_cell`, so a grid gives the same records
wherever it runs. The suite's cell list is written to ``<results>/suite.json`` first, which is how
``harness status`` and ``harness report`` know which cells are still missing.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from harness.records import atomic_write_text, read_record
from harness.suite import Cell, Suite

SUITE_FILE = "suite.json"


def write_manifest(suite: Suite, results_dir: Path) -> None:
    """Record which cells the suite expects (merged with earlier runs of other versions)."""
    path = results_dir / SUITE_FILE
    old = json.loads(path.read_text()) if path.exists() else {"cells": {}}
    cells = old.get("cells", {})
    for c in suite.cells():
        cells[c.cell_id] = {"label": c.label, "cell": c.to_json()}
    atomic_write_text(
        path,
        json.dumps(
            {
                "name": suite.name,
                "source": str(suite.source),
                "current": [c.cell_id for c in suite.cells()],
                "cells": cells,
            },
            indent=1,
        )
        + "\n",
    )


def read_manifest(results_dir: Path) -> dict[str, Any]:
    path = Path(results_dir) / SUITE_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{results_dir} holds no {SUITE_FILE}: is it a suite's results "
            "folder written by `harness run`?"
        )
    return json.loads(path.read_text())


def pending(cells: list[Cell], results_dir: Path, force: bool = False) -> list[Cell]:
    """Cells without a finished record (all of them with ``force``)."""
    if force:
        return list(cells)
    out = []
    for c in cells:
        rec = read_record(results_dir / c.cell_id)
        if not rec or rec["status"] != "done":
            out.append(c)
    return out


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


def resolve_executor(
    executor: str, workers: int | None, threads: int | None, cells: int
) -> tuple[str, int, int | None]:
    """Choose how to run: ``auto`` is in-process on a GPU machine and local worker processes on
    a CPU-only one (one per core, one thread each: small models train several times faster that
    way than one process with several intra-op threads, measured in docs/benchmarks.md).

    Returns:
        (executor, workers, threads per process or None for torch's default).
    """
    import torch

    cores = os.cpu_count() or 1
    if executor == "auto":
        executor = "inprocess" if torch.cuda.is_available() or cells <= 1 else "local"
    if executor == "local":
        workers = max(1, min(workers or cores, cells))
        threads = threads or max(1, cores // workers)
    return executor, workers or 1, threads


def _run_cell_json(
    cell_json: dict[str, Any],
    results_dir: str,
    data_root: str | None,
    force: bool,
    threads: int = 1,
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
    """Run cells in ``workers`` spawned processes on this machine."""
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
