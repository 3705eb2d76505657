"""Submitting a suite's pending cells as one Slurm job array through submitit.

Each array task runs one cell (:func:`harness.executors.ranks.run_one`; a task of a multi-process
cell runs it as one rank, :func:`run_slurm_rank`) and writes its record into the shared results
folder. Tasks are ``submitit.helpers.Checkpointable``: on a time limit or
preemption submitit calls :meth:`CellTask.checkpoint`, which requeues the same cell; the runner
then resumes from the cell's last per-epoch checkpoint. Job ids go to
``<results>/_slurm/jobs.json`` for ``harness status`` and ``harness cancel``. The executor
protocol's adapter is :class:`harness.executors.slurm.executor.SlurmExecutor`; nothing here knows
the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import submitit

from harness.contract import Cell
from harness.storage.records import atomic_write_text
from harness.storage.tracker_options import TrackerOptions

SLURM_DIR = "_slurm"  # leading "_": not a cell folder for the reporter
JOBS_FILE = "jobs.json"


class CellTask(submitit.helpers.Checkpointable):
    """One array task: train and evaluate one cell, resumable after a requeue.

    Args:
        force: redo a finished cell from scratch (``harness run --force``). Only the task's
            first attempt does: a requeued attempt (Slurm's restart count > 0, or the
            submission :meth:`checkpoint` makes) resumes what the first one started.
        trackers: the experiment trackers the cell logs to. The task object is pickled into
            the job's payload, so they reach the node with it, whatever the cluster exports.
    """

    def __init__(self, force: bool = False, trackers: TrackerOptions | None = None) -> None:
        self.force = force
        self.trackers = trackers or TrackerOptions()

    def __call__(
        self, cell_json: dict[str, Any], results_dir: str, data_root: str | None
    ) -> dict[str, Any]:
        import torch

        from harness.executors.ranks import run_one

        _log_to_task_log()
        # Slurm gives the task cpus_per_task cores, but without cgroups or CPU binding torch
        # would start one thread per core of the node and the array's tasks oversubscribe it.
        cpus = os.environ.get("SLURM_CPUS_PER_TASK")
        if cpus and cpus.isdigit() and not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(cpus))
        cell = Cell.from_json(cell_json, validated=True)
        logging.getLogger("harness").info(
            "cell %s (%s): job %s, restart %s, %d torch threads",
            cell.cell_id,
            cell.label,
            os.environ.get("SLURM_JOB_ID"),
            os.environ.get("SLURM_RESTART_COUNT", "0"),
            torch.get_num_threads(),
        )
        root = Path(data_root) if data_root else None
        force = self.force and os.environ.get("SLURM_RESTART_COUNT", "0") in ("", "0")
        if cell.recipe.processes > 1:  # this task is one rank of the cell
            rec = run_slurm_rank(cell, Path(results_dir), root, force, self.trackers)
        else:
            rec = run_one(
                cell, Path(results_dir), root, force=force, progress=False, trackers=self.trackers
            )
        return {"cell_id": rec["cell_id"], "status": rec["status"]}

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # Training state is already on disk (checkpoint.pt after every epoch): requeueing the
        # same call, without --force, resumes from it.
        again = CellTask(force=False, trackers=self.trackers)
        return submitit.helpers.DelayedSubmission(again, *args, **kwargs)


def run_slurm_rank(
    cell: Cell,
    results_dir: Path,
    data_root: Path | None,
    force: bool = False,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """One task of a multi-task Slurm job: export the rendezvous (submitit), train the `single`
    cell the cell converts if it is not done (one task trains it, the others wait on its
    lease), join the group and run the cell as that rank (``force``: redo it from scratch)."""
    from harness.engine.distributed import process_group
    from harness.engine.runner import run_cell
    from harness.executors.ranks import pretrain_first

    submitit.helpers.TorchDistributedEnvironment().export(
        set_cuda_visible_devices=False,
        overwrite=True,  # LOCAL_RANK picks the GPU instead
    )
    pretrain_first(cell, results_dir, data_root, trackers=trackers)
    with process_group(cell):
        return run_cell(cell, results_dir, data_root, force, False, trackers=trackers)


def slurm_parameters(params: dict[str, Any], processes: int) -> dict[str, Any]:
    """submitit ``update_parameters`` for a cell of ``processes`` tasks: the profile's per-cell
    ``gpus_per_node`` becomes per task (one GPU per rank), ``tasks_per_node`` = processes."""
    if processes == 1:
        return dict(params)
    out = {**params, "tasks_per_node": processes, "nodes": 1}
    if params.get("gpus_per_node"):
        out["gpus_per_node"] = params["gpus_per_node"] * processes
    return out


def _log_to_task_log() -> None:
    """Send the harness's INFO logs (resuming after epoch N, cell failed: ...) to stderr, which
    submitit writes to the task's ``_log.err``: ``harness status`` shows its tail."""
    logger = logging.getLogger("harness")
    if not any(getattr(h, "harness_task_log", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("harness %(levelname)s (%(asctime)s) - %(message)s"))
        handler.harness_task_log = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def read_jobs(results_dir: Path) -> dict[str, str]:
    """cell id → Slurm job id (``ARRAY_TASK`` form) of the latest submission of each cell."""
    path = Path(results_dir) / SLURM_DIR / JOBS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def make_executor(results_dir: Path, profile, processes: int = 1) -> submitit.AutoExecutor:
    """submitit's executor for the profile; ``processes`` > 1: one task per rank of a cell."""
    folder = Path(results_dir).resolve() / SLURM_DIR / "%j"
    ex = submitit.AutoExecutor(
        folder=folder, cluster="slurm", slurm_max_num_timeout=profile.max_num_timeout
    )
    params = slurm_parameters(profile.executor_parameters(), processes)
    ex.update_parameters(name=f"harness-{Path(results_dir).name}", **params)
    return ex


def submit_cells(
    cells: list[Cell],
    results_dir: Path,
    data_root: Path | None,
    profile,
    force: bool = False,
    trackers: TrackerOptions | None = None,
) -> list[submitit.Job]:
    """Submit one job array with one array task per cell (one array per distinct recipe
    ``processes``: a cell of N processes is an array task of N Slurm tasks); returns submitit's
    jobs in the order of ``cells``. ``force``: each task redoes its cell from scratch;
    ``trackers``: what each task logs to (in the task's pickled payload)."""
    if not cells:
        return []
    root = str(data_root) if data_root else None
    by_id: dict[str, submitit.Job] = {}
    for processes in sorted({c.recipe.processes for c in cells}):
        group = [c for c in cells if c.recipe.processes == processes]
        ex = make_executor(results_dir, profile, processes)
        submitted = ex.map_array(
            CellTask(force=force, trackers=trackers),
            [c.to_json() for c in group],
            [str(Path(results_dir).resolve())] * len(group),
            [root] * len(group),
        )
        by_id.update({c.cell_id: j for c, j in zip(group, submitted)})
    jobs = [by_id[c.cell_id] for c in cells]
    ids = read_jobs(results_dir)
    ids.update({c.cell_id: j.job_id for c, j in zip(cells, jobs)})
    atomic_write_text(Path(results_dir) / SLURM_DIR / JOBS_FILE, json.dumps(ids, indent=1))
    return jobs


def wait_jobs(
    jobs: list[submitit.Job],
    poll_s: float = 2.0,
    progress: bool = True,
    cells: list[Cell] | None = None,
    results_dir: Path | None = None,
) -> None:
    """Wait until every job is done (polling sacct; submitit's wait() backs off to minutes).
    With ``cells`` (one per job) and ``results_dir``, each running task's cell shows its line
    beneath the bar over tasks, from the cell's files in the shared results folder
    (:mod:`harness.executors.live`)."""
    from tqdm.auto import tqdm

    from harness.executors.live import CellLines

    with tqdm(total=len(jobs), desc="slurm tasks", unit="task", disable=not progress) as bar:
        lines = CellLines.open(results_dir, progress) if cells and results_dir else None
        of = dict(zip((id(j) for j in jobs), cells or []))
        if lines is not None:
            for cell in of.values():
                lines.started(cell)
        pending = list(jobs)
        try:
            while pending:
                still = [j for j in pending if not j.done(force_check=True)]
                left = {id(j) for j in still}
                for job in pending:
                    if lines is not None and id(job) not in left and id(job) in of:
                        lines.finished(of[id(job)])
                bar.update(len(pending) - len(still))
                pending = still
                if lines is not None:  # queued tasks have neither a lease nor a heartbeat
                    lines.show([of[id(j)] for j in pending if id(j) in of], working_only=True)
                if pending:
                    time.sleep(poll_s)
        finally:
            if lines is not None:
                lines.close()
