"""Integration tests of submitit against the real local Slurm (slurm/local_cluster/start.sh).

Trivial functions only (not the harness): they check that the cluster and submitit's round trip
work as the harness needs: results, exceptions, job arrays, requeue on a time limit with a
checkpoint, cancellation. Skipped with a reason when no cluster answers, except under
HARNESS_REQUIRE_SLURM=1 (CI), where they fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from tests.fixtures.machine_faults import fault_env

pytestmark = pytest.mark.slurm

# Jobs unpickle the submitted callables in a fresh interpreter that cannot import this test
# module by name: ship its functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def executor(slurm_env, tmp_path: Path) -> submitit.AutoExecutor:
    # tmp_path is on this machine, where slurmd runs the jobs as the submitting user.
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(name="harness-slurm-test", timeout_min=5, cpus_per_task=1)
    return ex


def wait_done(job: submitit.Job, timeout_s: float) -> float:
    """Poll sacct (forced, every second) until the job is done; return the seconds waited.

    submitit's own wait() backs off to one sacct call a minute, and never ends for a job that
    sacct does not report as finished; a deadline keeps a broken cluster from hanging the test.
    """
    start = time.monotonic()
    while not job.done(force_check=True):
        if time.monotonic() - start > timeout_s:
            subprocess.run(["scancel", str(job.job_id)], check=False)
            pytest.fail(
                f"job {job.job_id} not done after {timeout_s:.0f}s (state {job.state}); "
                f"stdout: {job.paths.stdout}"
            )
        time.sleep(1)
    return time.monotonic() - start


def wait_sacct_state(job: submitit.Job, timeout_s: float = 30) -> str:
    """The job's final state in sacct, which may lag behind the result file by a few seconds."""
    deadline = time.monotonic() + timeout_s
    state = job.get_info(mode="force").get("State", "UNKNOWN")
    while state in ("UNKNOWN", "PENDING", "RUNNING", "COMPLETING", "REQUEUED"):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
        state = job.get_info(mode="force").get("State", "UNKNOWN")
    return state


# ------------------------------------------------------------------ functions run by the jobs


def add(a: int, b: int) -> dict:
    return {"sum": a + b, "job_id": os.environ.get("SLURM_JOB_ID"), "host": os.uname().nodename}


def fail(tag: str) -> None:
    raise ValueError(f"deliberate failure {tag}")


def square(x: int) -> tuple[int, str | None]:
    return x * x, os.environ.get("SLURM_ARRAY_TASK_ID")


def sleep_long(seconds: float) -> str:
    time.sleep(seconds)
    return "not cancelled"


class CountUntilRequeued(submitit.helpers.Checkpointable):
    """Counts steps; the first attempt never finishes (only a time limit stops it), the resumed
    attempt returns what it found in its checkpoint."""

    def __init__(self) -> None:
        self.steps = 0
        self.attempts: list[dict] = []

    def __call__(self, step_s: float) -> dict:
        self.attempts.append(
            {
                "job_id": os.environ.get("SLURM_JOB_ID"),
                "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                "started": time.time(),
                "steps_at_start": self.steps,
            }
        )
        if len(self.attempts) > 1:  # resumed from the checkpoint
            return {"steps": self.steps, "attempts": self.attempts}
        while True:
            time.sleep(step_s)
            self.steps += 1

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        self.attempts[-1]["checkpointed"] = time.time()
        return super().checkpoint(*args, **kwargs)


# ------------------------------------------------------------------------------------- tests


def test_job_returns_its_result(executor: submitit.AutoExecutor) -> None:
    job = executor.submit(add, 2, 3)
    wait_done(job, timeout_s=60)
    result = job.result()
    assert result["sum"] == 5
    assert result["job_id"] == str(job.job_id)
    assert wait_sacct_state(job) == "COMPLETED"


def test_exception_surfaces_with_its_message(executor: submitit.AutoExecutor) -> None:
    job = executor.submit(fail, "xyz-42")
    wait_done(job, timeout_s=60)
    with pytest.raises(FailedJobError, match=r"ValueError: deliberate failure xyz-42"):
        job.result()


def test_map_array_over_four_items(executor: submitit.AutoExecutor) -> None:
    executor.update_parameters(slurm_array_parallelism=4)
    jobs = executor.map_array(square, [1, 2, 3, 4])
    assert len(jobs) == 4
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one array job
    for job in jobs:
        wait_done(job, timeout_s=90)
    results = [job.result() for job in jobs]
    assert [r[0] for r in results] == [1, 4, 9, 16]
    assert [r[1] for r in results] == ["0", "1", "2", "3"]


def test_checkpointable_job_requeued_after_time_limit(executor: submitit.AutoExecutor) -> None:
    # --time=1 (Slurm's minimum); USR2 comes signal_delay_s before the limit (Slurm checks
    # limits periodically, so the exact moment varies); submitit checkpoints, requeues itself
    # with `scontrol requeue`, and the requeued job resumes from the pickled state.
    executor.update_parameters(timeout_min=1, slurm_signal_delay_s=15)
    t0 = time.monotonic()
    job = executor.submit(CountUntilRequeued(), 0.5)
    waited = wait_done(job, timeout_s=240)
    result = job.result()
    total = time.monotonic() - t0

    first, second = result["attempts"][0], result["attempts"][-1]
    print(
        f"\nrequeue timing: total {total:.1f}s (wait {waited:.1f}s); "
        f"first attempt ran {first['checkpointed'] - first['started']:.1f}s until USR2; "
        f"requeue gap {second['started'] - first['checkpointed']:.1f}s; "
        f"attempts {len(result['attempts'])}; steps at resume {second['steps_at_start']}"
    )
    assert len(result["attempts"]) >= 2
    assert result["steps"] > 0, "the resumed attempt did not get the checkpointed progress"
    assert second["steps_at_start"] == result["steps"]
    assert first["job_id"] == second["job_id"] == str(job.job_id)  # requeued, not resubmitted
    assert second["restart_count"] >= 1
    assert wait_sacct_state(job) == "COMPLETED"


def test_cancelled_job_raises_instead_of_hanging(executor: submitit.AutoExecutor) -> None:
    job = executor.submit(sleep_long, 600)
    deadline = time.monotonic() + 60
    while job.get_info(mode="force").get("State") != "RUNNING":
        assert time.monotonic() < deadline, f"job never started (state {job.state})"
        time.sleep(0.5)
    subprocess.run(["scancel", str(job.job_id)], check=True)
    wait_done(job, timeout_s=60)
    # submitit waits this long for a result file that a cancelled job never writes (15 s).
    job._results_timeout_s = 2
    with pytest.raises(UncompletedJobError, match=r"no.* output \(state: CANCELLED"):
        job.result()


# ------------------------------------------------------- the harness: one suite submitted twice

TWICE_SUITE = """
name: twice
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0, 1]
  methods: [single, {name: deep_ensemble, M: [2]}]
recipe: {epochs: 3, batch_size: 128, lr: 0.01}
evaluation: {cost: false}
"""


def test_suite_submitted_twice_trains_each_cell_once(slurm_env, tmp_path: Path) -> None:
    """The same suite submitted a second time, and run locally too, while the first array runs:
    the cell leases (harness.storage.lease, taken by the runner inside each task and each local run)
    make every other runner skip the cells one holds, so every cell is trained exactly once.

    Deterministic whatever the machine's speed: the first array's tasks are held after their
    first epoch checkpoint (HARNESS_FAULT_HOLD) until the second submission and the local run
    are over, so the local run always finds leased cells (on the 2-CPU test node two tasks run
    and two wait; the second array queues behind the first)."""
    import json
    import re

    from harness.storage.checkpoint import read_events

    suite = tmp_path / "twice.yaml"
    suite.write_text(TWICE_SUITE)
    results = tmp_path / "results"
    folder = results / "twice"
    flag = tmp_path / "hold"
    flag.touch()
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite), "--executor", "slurm",
           "--profile", "local", "--results", str(results)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    held_env = fault_env(env, HARNESS_FAULT_HOLD=f"checkpoint.pt:{flag}")
    try:
        first = subprocess.run(cmd, capture_output=True, text=True, env=held_env, timeout=300)
        assert first.returncode == 0, first.stderr
        deadline = time.monotonic() + 300
        while not list(folder.glob("*/checkpoint.pt")):  # a task of the first array is held
            assert time.monotonic() < deadline, "the first array never trained an epoch"
            time.sleep(0.5)
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert second.returncode == 0, second.stderr
        local_cmd = [*cmd[: cmd.index("--executor")], "--executor", "inprocess", "-q",
                     "--results", str(results)]  # fmt: skip
        local = subprocess.run(local_cmd, capture_output=True, text=True, env=env, timeout=900)
        # the first array's tasks still hold their cells (held until `finally`): the grid is
        # not complete when the local run returns, so status 1 and a last line naming them
        assert local.returncode == 1, local.stderr
        assert local.stdout.splitlines()[-1].startswith("not done here: "), local.stdout
    finally:
        flag.unlink()
    arrays = [re.search(r"submitted job array (\d+)", p.stdout) for p in (first, second)]
    ids = [m.group(1) for m in arrays if m]
    assert ids and ids[0] == re.search(r"submitted job array (\d+)", first.stdout).group(1)
    deadline = time.monotonic() + 900
    while True:
        queued = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i"],
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        if not queued:
            break
        assert time.monotonic() < deadline, f"arrays {ids} still queued/running: {queued}"
        time.sleep(2)
    recs = {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/record.json")}
    assert len(recs) == 4 and all(r["status"] == "done" for r in recs.values())
    for cell_id in recs:
        events = read_events(folder / cell_id)
        starts = [e for e in events if e["event"] == "train"]
        assert [e["from_epoch"] for e in starts] == [0], (cell_id, events)
        assert [e["event"] for e in events].count("done") == 1
    assert not list(folder.glob("*/lease.json"))
    # The local run found the held cells leased, and named their owner: host:pid (job N_i).
    assert re.search(r"skipped \S+: leased by \S+:\d+ \(job \d+_\d+\)", local.stdout), local.stdout
