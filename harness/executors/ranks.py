"""One cell from an executor: in this process, or the N ranks of a ``processes: N`` cell.

:func:`run_one` is what the local executors call per cell (and what a plugin executor should
call): it runs :func:`harness.engine.runner.run_cell` here (which trains the `single` cell a
conversion starts from, :func:`harness.engine.pretrain.single_to_train` being the one
pre-training decision; :func:`pretrain_first` trains it here instead when ranks must find it
done), or for a multi-process cell :func:`launch_cell`
spawns the cell's N ranks (``torch.multiprocessing`` spawn, the ``env://`` rendezvous on a free
local port, one GPU each through ``CUDA_VISIBLE_DEVICES`` on a GPU machine) and waits for them;
each rank runs ``run_cell`` inside the process group. A rank whose launcher dies (SIGKILL) stops
by itself, so a re-run resumes from the last checkpoint without a stray rank still writing. On
Slurm the cell is one array task of N Slurm tasks, each a rank
(:func:`harness.executors.slurm.submit.run_slurm_rank`). What the ranks do is
:mod:`harness.engine.distributed`'s; the engine starts no process.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch

from harness.contract import Cell
from harness.engine.distributed import (
    DistributedError,
    collective_timeout,
    needs_launch,
    process_group,
    uses_cuda,
)
from harness.storage.lease import LeaseHeld, acquire
from harness.storage.tracker_options import TrackerOptions

log = logging.getLogger("harness")

#: Seconds the launcher lets the other ranks finish after rank 0 has exited.
FOLLOWER_GRACE_S = 60.0

__all__ = ["launch_cell", "pretrain_first", "rank_devices", "run_one"]


def run_one(
    cell: Cell,
    results_dir: Path,
    data_root: Path | None = None,
    force: bool = False,
    progress: bool = True,
    shared_device: bool = False,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """Run one cell as :func:`harness.engine.runner.run_cell` does (same arguments, same
    result), starting its ranks here when its recipe asks for several processes; the cell logs
    to ``trackers`` (the executor's ``options.trackers``)."""
    from harness.engine import runner

    if needs_launch(cell):
        return launch_cell(cell, results_dir, data_root, force, progress, shared_device, trackers)
    pretrain_first(cell, results_dir, data_root, progress, trackers)
    return runner.run_cell(
        cell, results_dir, data_root, force, progress, shared_device, trackers=trackers
    )


def pretrain_first(
    cell: Cell,
    results_dir: Path,
    data_root: Path | None,
    progress: bool = False,
    trackers: TrackerOptions | None = None,
) -> None:
    """Train the `single` cell that ``cell`` converts (``pretrain_epochs``), if any, here when
    the runner cannot: before the ranks of a multi-process ``cell`` join their group (inside it
    every rank then finds it done and only loads it), or when the `single` cell itself needs
    ranks (the engine starts no process). Otherwise the runner trains it under its lease, so a
    failed `single` cell is attempted once. A suite without that cell is left to ``cell``'s run
    to record."""
    from harness.engine.pretrain import single_to_train, wait_for_record

    try:
        single = single_to_train(cell, Path(results_dir))
    except ValueError:  # no such `single` cell: the runner records the cell's failure
        return
    if single is None or not (needs_launch(cell) or needs_launch(single)):
        return
    while True:  # leased by another live process: wait for its record, or take it over
        rec = run_one(single, results_dir, data_root, False, progress, trackers=trackers)
        if rec["status"] != "leased" or wait_for_record(single, Path(results_dir)) is not None:
            return


# ------------------------------------------------------------------------ launching locally


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous of the ranks binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_devices(cell: Cell) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` entry of each rank (one GPU each), or None per rank on CPU.

    Raises:
        DistributedError: a CUDA cell with fewer visible GPUs than processes (NCCL refuses two
            ranks on one GPU).
    """
    n = cell.recipe.processes
    if not uses_cuda(cell):
        return [None] * n
    from harness.engine.environment import visible_gpus

    gpus = visible_gpus()
    if len(gpus) < n:
        raise DistributedError(
            f"{cell.label} needs {n} GPUs (recipe processes: {n}), this process sees "
            f"{len(gpus)} ({', '.join(gpus) or 'none'}); run it with --executor inprocess on a "
            f"machine with {n} GPUs, or on Slurm"
        )
    return gpus[:n]


def _watch_parent(parent: int) -> None:
    """End this rank when its launcher is gone (killed): an orphaned rank would go on writing."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="launcher-watch").start()


def _rank_main(
    rank: int,
    world: int,
    port: int,
    gpu: str | None,
    parent: int,
    threads: int,
    cell_json: dict[str, Any],
    results_dir: str,
    data_root: str | None,
    force: bool,
    progress: bool,
    shared_device: bool,
    trackers: TrackerOptions | None,
    results: Any,
) -> None:
    """One spawned rank: the env:// variables, its GPU, then
    :func:`harness.engine.runner.run_cell`."""
    from harness.engine.runner import run_cell

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA initialises: cuda:0 is this GPU
    _watch_parent(parent)
    torch.set_num_threads(threads)
    cell = Cell.from_json(cell_json, validated=True)
    with process_group(cell):
        root = Path(data_root) if data_root else None
        out = run_cell(
            cell, Path(results_dir), root, force, progress, shared_device, trackers=trackers
        )
    if rank == 0:
        results.put(out)


def launch_cell(
    cell: Cell,
    results_dir: Path,
    data_root: Path | None,
    force: bool = False,
    progress: bool = True,
    shared_device: bool = False,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """Run ``cell`` on ``cell.recipe.processes`` spawned local ranks and wait for them (rank 0
    logs to ``trackers``, an argument of each spawned rank).

    Returns:
        The finished record when the cell is done (and not ``force``d), else rank 0's
        :func:`harness.engine.runner.run_cell` result (the record, or ``leased``), or, when rank
        0 died without one, the record on disk or a ``failed`` stub naming its exit code.
    """
    from harness.contract import usable_record

    existing = usable_record(Path(results_dir) / cell.cell_id)
    if existing and existing["status"] == "done" and not force:
        return existing  # no ranks to start
    n = cell.recipe.processes
    try:
        devices = rank_devices(cell)
    except DistributedError as exc:
        return record_launch_failure(cell, Path(results_dir), exc)
    pretrain_first(cell, results_dir, data_root, trackers=trackers)
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    port, parent = free_port(), os.getpid()
    threads = max(1, torch.get_num_threads() // n) if devices[0] is None else 1
    root = str(data_root) if data_root else None
    args = (cell.to_json(), str(results_dir), root, force, progress, shared_device, trackers)
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, n, port, devices[r], parent, threads, *args, results),
            name=f"rank{r}",
        )
        for r in range(n)
    ]
    for p in procs:
        p.start()
    try:
        while procs[0].is_alive():
            procs[0].join(timeout=1.0)
            if any(p.exitcode not in (None, 0) for p in procs[1:]) and procs[0].is_alive():
                # A rank crashed: rank 0 fails at its next collective and records why.
                procs[0].join(timeout=collective_timeout().total_seconds())
                break
        deadline = time.monotonic() + FOLLOWER_GRACE_S
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():  # Ctrl-C, or a rank stuck in a collective rank 0 never joins
                p.terminate()
                p.join(timeout=10)
    if not results.empty():
        return results.get()
    rec = usable_record(Path(results_dir) / cell.cell_id)
    if rec:
        return rec
    return {
        "cell_id": cell.cell_id,
        "status": "failed",
        "error": {
            "type": DistributedError.__name__,
            "message": f"rank 0 exited with code {procs[0].exitcode} and wrote no record",
        },
    }


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def record_launch_failure(cell: Cell, results_dir: Path, exc: Exception) -> dict[str, Any]:
    """A ``failed`` record (phase ``setup``) for a cell whose ranks cannot be started, written
    under the cell's lease like any record, so the grid goes on and the reason is reported."""
    from harness.contract import new_record
    from harness.engine.environment import environment
    from harness.registry import resolved
    from harness.storage.checkpoint import log_event
    from harness.storage.records import write_record

    cell_dir = results_dir / cell.cell_id
    try:
        lease = acquire(cell_dir)
    except LeaseHeld as held:
        return {"cell_id": cell.cell_id, "status": "leased", "lease": held.owner}
    try:
        cell = resolved(cell)
        rec = new_record(cell, environment(torch.device("cpu")), _now())
        rec["status"] = "failed"
        rec["error"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "",
            "data_missing": False,
            "phase": "setup",
        }
        rec["timings"]["total_s"] = 0.0
        rec["finished_at"] = _now()
        write_record(cell_dir, rec)
        log_event(cell_dir, "failed", phase="setup", error=type(exc).__name__)
        log.warning("cell %s failed: %s", cell.label, exc)
        return rec
    finally:
        lease.release()
