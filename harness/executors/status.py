"""``harness status``: where each cell of a suite stands.

done / failed come from the result records; a cell that a live process works on, wherever it
runs, holds a lease whose owner is shown (host:pid, Slurm job); for the other cells without a
record the Slurm state comes from ``sacct`` (``squeue`` forgets finished jobs, and submitit too
reads sacct). Every cell not done that has trained shows its live progress from its own folder
(``progress.csv``, ``progress.json``: executor, device, epoch n/E, last accuracy, and an ETA while
it runs; for a running cell, its heartbeat ``live.json``: the step and running loss of the epoch
under way, or the evaluation's pass and batch), whichever executor trains it.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.contract import read_manifest
from harness.contract.record import DamagedRecord, read_record
from harness.executors.faults import MACHINE_FAULTS
from harness.executors.slurm.submit import SLURM_DIR, read_jobs
from harness.storage.lease import describe, live_leases
from harness.storage.progress import progress_summary

RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING"}


@dataclass(frozen=True)
class CellState:
    cell_id: str
    label: str
    state: str  # done | failed | running | queued | pending | lost | damaged
    job_id: str | None = None
    detail: str = ""
    progress: str = ""  # executor device, epoch n/E, last accuracy, ETA (harness.storage.progress)


def expand_job_id(job_id: str) -> list[str]:
    """sacct's id of one line → the ``ARRAY_TASK`` ids it stands for.

    sacct reports the tasks of an array that have not started yet (pending, or cancelled before
    they started) on one line, ``12_[3-9%4]`` or ``12_[1,4-6]``; started tasks, and plain jobs,
    have their own line and stay as they are.
    """
    head, sep, rest = job_id.partition("_[")
    if not sep:
        return [job_id]
    spec = rest.rstrip("]").split("%", 1)[0]
    ids = []
    for part in spec.split(","):
        span, _, step = part.partition(":")
        lo, _, hi = span.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
            ids += [f"{head}_{i}" for i in range(first, last + 1, int(step or 1))]
        except ValueError:  # an id form this parser does not know: keep it whole
            return [job_id]
    return ids


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Slurm state of each job id (``ARRAY_TASK`` ids), empty if sacct is unavailable."""
    if not job_ids or not shutil.which("sacct"):
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(arrays)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    states = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            jid, state = line.split("|", 1)
            for task in expand_job_id(jid.strip()):
                states[task] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


def log_tail(results_dir: Path, job_id: str | None, lines: int = 8) -> str:
    """Last lines of the task's stderr log (submitit writes ``_slurm/<job id>/<job id>_0_log.err``
    for each array task, appending the attempts of a requeued task)."""
    if not job_id:
        return ""
    logs = [
        p
        for folder in _task_folders(results_dir, job_id)
        for p in folder.glob(f"{job_id}_*_log.err")
        if p.stat().st_size
    ]
    if not logs:
        return ""
    text = max(logs, key=lambda p: p.stat().st_mtime).read_text(errors="replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def _task_folders(results_dir: Path, job_id: str) -> list[Path]:
    """Where submitit keeps a task's files: ``_slurm/<job id>/`` (array tasks and plain jobs),
    or the array's folder."""
    base = Path(results_dir) / SLURM_DIR
    return [f for f in dict.fromkeys((base / job_id, base / job_id.split("_")[0])) if f.is_dir()]


def task_returned(results_dir: Path, job_id: str) -> bool:
    """Whether submitit wrote the task's result file (its function returned or raised)."""
    return any(any(f.glob(f"{job_id}_*_result.pkl")) for f in _task_folders(results_dir, job_id))


def cell_states(results_dir: Path) -> list[CellState]:
    """Every current cell of the suite's manifest, with its live progress when it has any."""
    manifest = read_manifest(results_dir)
    jobs = read_jobs(results_dir)
    slurm = sacct_states(list(jobs.values()))
    leases = live_leases(results_dir)
    return [
        _with_progress(_cell_state(c, manifest, results_dir, jobs, slurm, leases), results_dir)
        for c in manifest["current"]
    ]


def _with_progress(state: CellState, results_dir: Path) -> CellState:
    """The cell's live progress (progress.csv, progress.json; live.json while it runs) for
    every cell not done."""
    if state.state == "done":
        return state
    summary = progress_summary(Path(results_dir) / state.cell_id, state.state == "running")
    return dataclasses.replace(state, progress=summary)


def _cell_state(
    cell_id: str,
    manifest: dict,
    results_dir: Path,
    jobs: dict[str, str],
    slurm: dict[str, str],
    leases: dict[str, dict],
) -> CellState:
    """One cell's state from its record, its lease and its Slurm job."""
    label = manifest["cells"][cell_id]["label"]
    job = jobs.get(cell_id)
    try:
        rec = read_record(Path(results_dir) / cell_id)
    except DamagedRecord as exc:  # not done; the next run sets the file aside and redoes it
        if cell_id not in leases:
            return CellState(cell_id, label, "damaged", job, f"{exc}; `harness run` redoes it")
        rec = None
    # sacct lags behind the task by a second or two: once the task has written its result
    # file it is over, whatever sacct still says (submitit's done() decides the same way).
    active = job and slurm.get(job) in RUNNING | QUEUED and not task_returned(results_dir, job)
    lease = leases.get(cell_id)
    if rec and rec["status"] == "done":
        return CellState(cell_id, label, "done", job)
    elif lease:  # trained or evaluated right now (a failed cell being retried, too)
        owner = describe(lease)
        age = f"heartbeat {lease['heartbeat_age_s']:.0f} s ago"
        return CellState(
            cell_id,
            label,
            "running",
            lease.get("slurm_job_id") or job,
            f"leased by {owner} since {lease.get('started', '?')}, {age}",
        )
    elif rec and not active:  # a failed cell that was re-submitted is running/queued again
        err = rec["error"]
        # A fault of the machine is its one line: where in the code it struck says nothing.
        trace = "" if err.get("type") in MACHINE_FAULTS else err.get("traceback", "")[-600:]
        tail = log_tail(results_dir, job) or trace
        return CellState(cell_id, label, "failed", job, f"{err['type']}: {err['message']}\n{tail}")
    elif job and slurm.get(job) in RUNNING:
        return CellState(cell_id, label, "running", job, slurm[job])
    elif job and slurm.get(job) in QUEUED:
        return CellState(cell_id, label, "queued", job, slurm[job])
    elif job and job in slurm:
        return CellState(
            cell_id,
            label,
            "lost",
            job,
            f"Slurm state {slurm[job]} and no record; re-run to resume\n"
            + log_tail(results_dir, job),
        )
    else:
        return CellState(cell_id, label, "pending", job)


def print_status(results_dir: Path) -> int:
    states = cell_states(results_dir)
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
        job = f" job {s.job_id}" if s.job_id else ""
        live = f"  [{s.progress}]" if s.progress else ""
        print(f"{s.state:8s} {s.cell_id}{job}  {s.label}{live}")
        if s.state in ("failed", "lost", "running", "damaged") and s.detail:
            for line in s.detail.strip().splitlines():
                print(f"           | {line}")
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 0
