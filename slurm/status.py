"""``harness status``: where each cell of a suite stands.

done / failed come from the result records; for cells without a record the Slurm state comes
from ``sacct`` (``squeue`` forgets finished jobs, and submitit too reads sacct).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.dispatch import read_manifest
from harness.records import read_record
from slurm.submit import SLURM_DIR, read_jobs

RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING"}


@dataclass(frozen=True)
class CellState:
    cell_id: str
    label: str
    state: str  # done | failed | running | queued | pending | lost
    job_id: str | None = None
    detail: str = ""


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
            states[jid.strip()] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


def log_tail(results_dir: Path, job_id: str | None, lines: int = 8) -> str:
    if not job_id:
        return ""
    folder = Path(results_dir) / SLURM_DIR / job_id.split("_")[0]
    logs = sorted(folder.glob(f"{job_id}_*_log.err")) if folder.exists() else []
    if not logs:
        return ""
    text = logs[-1].read_text(errors="replace").strip().splitlines()
    return "\n".join(text[-lines:])


def cell_states(results_dir: Path) -> list[CellState]:
    manifest = read_manifest(results_dir)
    jobs = read_jobs(results_dir)
    slurm = sacct_states(list(jobs.values()))
    out = []
    for cell_id in manifest["current"]:
        label = manifest["cells"][cell_id]["label"]
        rec = read_record(Path(results_dir) / cell_id)
        job = jobs.get(cell_id)
        if rec and rec["status"] == "done":
            out.append(CellState(cell_id, label, "done", job))
        elif rec:
            err = rec["error"]
            tail = log_tail(results_dir, job) or err.get("traceback", "")[-600:]
            out.append(
                CellState(cell_id, label, "failed", job, f"{err['type']}: {err['message']}\n{tail}")
            )
        elif job and slurm.get(job) in RUNNING:
            out.append(CellState(cell_id, label, "running", job, slurm[job]))
        elif job and slurm.get(job) in QUEUED:
            out.append(CellState(cell_id, label, "queued", job, slurm[job]))
        elif job and job in slurm:
            out.append(
                CellState(
                    cell_id,
                    label,
                    "lost",
                    job,
                    f"Slurm state {slurm[job]} and no record; re-run to resume\n"
                    + log_tail(results_dir, job),
                )
            )
        else:
            out.append(CellState(cell_id, label, "pending", job))
    return out


def print_status(results_dir: Path) -> int:
    states = cell_states(results_dir)
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
        job = f" job {s.job_id}" if s.job_id else ""
        print(f"{s.state:8s} {s.cell_id}{job}  {s.label}")
        if s.state in ("failed", "lost") and s.detail:
            for line in s.detail.strip().splitlines():
                print(f"           | {line}")
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 0
