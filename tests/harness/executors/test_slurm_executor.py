"""Integration tests of ``harness run --executor slurm`` against the real local Slurm.

They drive the real command line (``harness run/status/cancel`` in subprocesses) against the
single-node cluster of slurm/local_cluster (start.sh; ``. $SLURM_LOCAL_DIR/env.sh``), with the
``local`` profile: the acceptance of issue 7.

- the smoke grid as one job array gives the same cell results as an in-process run;
- a cell that raises shows as failed, with its error, in ``harness status``;
- a task killed by its time limit is requeued and resumes from its per-epoch checkpoint;
- a cancelled suite, re-submitted, completes only what was missing;
- ``--force`` resubmits a done cell and trains it again;
- a task whose cell meets a full disk fails that cell in one line, shown by ``harness status``.

Skipped with a one-line reason when no cluster answers, except under HARNESS_REQUIRE_SLURM=1
(CI), where they fail. About 4 minutes on 2 cores, most of it Slurm's time-limit and requeue
clocks (test 3) and the start-up of one Python process per task.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.machine_faults import fault_env

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "tests" / "suites" / "slurm_smoke.yaml"
DIGITS_RECIPE = REPO / "suites" / "common" / "digits_recipe.yaml"
# One digits_cnn `single` cell: the grid of the suites written by these tests.
ONE_CELL_GRID = "{datasets: [digits], backbones: [digits_cnn], M: [1], seeds: [0]"


def harness_cmd() -> list[str]:
    """The installed ``harness`` entry point of this interpreter's environment."""
    exe = Path(sys.executable).with_name("harness")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli"]


def cli_env(threads: int | None = None) -> dict[str, str]:
    """os.environ (with the cluster's variables: the slurm_env fixture sets them); the jobs
    inherit it (sbatch --export=ALL). OMP_NUM_THREADS is removed so that the array tasks take
    their thread count from cpus_per_task, as on a real cluster."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def cli(*args: object, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``harness ARGS``; return (exit code, stdout + stderr)."""
    cmd = [*harness_cmd(), *map(str, args)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=env or cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output
        pytest.fail(f"`harness {' '.join(map(str, args))}` ran over {timeout:.0f}s:\n{out}")
    return proc.returncode, proc.stdout


def status(results: Path) -> tuple[dict[str, str], str]:
    """``harness status``: (cell id → state, whole output)."""
    rc, out = cli("status", results, timeout=60)
    assert rc == 0, out
    states = {}
    for line in out.splitlines():
        m = re.match(r"^(done|failed|running|queued|pending|lost)\s+([0-9a-f]{16})\b", line)
        if m:
            states[m.group(2)] = m.group(1)
    return states, out


def records(results: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(results.glob("*/record.json"))}


def jobs_of(results: Path) -> dict[str, str]:
    path = results / "_slurm" / "jobs.json"
    return json.loads(path.read_text()) if path.exists() else {}


def task_logs(results: Path, job_id: str, kind: str) -> str:
    """All of one array task's submitit logs (``out`` or ``err``; attempts are appended)."""
    logs = sorted((results / "_slurm" / job_id).glob(f"{job_id}_*_log.{kind}"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


def sacct_attempts(job_id: str) -> list[str]:
    """States of every attempt of a job (``-D``: requeued attempts too), oldest first."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-D", "-o", "JobID,State", "-j", job_id],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return [
        line.split("|")[1].split()[0]
        for line in out.splitlines()
        if line.split("|")[0] == job_id and line.split("|")[1].strip()
    ]


@pytest.fixture
def results_root(slurm_env, tmp_path: Path):
    """A results root under tmp_path (on this machine: slurmd runs the tasks as this user);
    cancels whatever a failed or timed-out test left on the cluster."""
    root = tmp_path / "results"
    yield root
    arrays = {
        j.split("_")[0]
        for path in root.glob("*/_slurm/jobs.json")
        for j in jobs_of(path.parent.parent).values()
    }
    if arrays:
        subprocess.run(["scancel", *sorted(arrays)], capture_output=True, timeout=30)


def write_suite(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"include: {DIGITS_RECIPE}\nname: {name}\n{body}")
    return path


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


# ------------------------------------------------------------------------------------- tests


def test_smoke_grid_as_job_array_matches_inprocess_run(results_root: Path, tmp_path: Path):
    """The 10-cell smoke grid as one job array: same cells, same statuses, same metrics as
    ``harness run`` in-process (both run while the other does, to save time)."""
    inproc_root = tmp_path / "inprocess"
    slurm_log = tmp_path / "slurm_run.log"
    t0 = time.monotonic()
    with slurm_log.open("w") as log:
        cmd = [*harness_cmd(), "run", SMOKE, "--executor", "slurm", "--profile", "local"]
        submit = subprocess.Popen(
            [*map(str, cmd), "--results", str(results_root), "--wait", "-q"],
            cwd=REPO,
            env=cli_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            # The local profile gives each task cpus_per_task=1, hence one torch thread: the
            # in-process run uses one thread too, so that both sum in the same order.
            rc_local, out_local = cli(
                "run", SMOKE, "--results", inproc_root, "-q", env=cli_env(threads=1), timeout=240
            )
            rc_slurm = submit.wait(timeout=300)
        finally:
            if submit.poll() is None:
                submit.kill()
    out_slurm = slurm_log.read_text()
    print(f"\nsmoke grid via Slurm and in-process (concurrently): {time.monotonic() - t0:.0f}s")
    assert rc_local == 0, out_local
    assert rc_slurm == 0, out_slurm
    assert re.search(r"submitted job array \d+ with 10 tasks", out_slurm), out_slurm

    slurm_dir, local_dir = results_root / "slurm_smoke", inproc_root / "slurm_smoke"
    jobs = jobs_of(slurm_dir)
    assert len(jobs) == 10
    assert len({j.split("_")[0] for j in jobs.values()}) == 1, jobs  # one array
    assert sorted(int(j.split("_")[1]) for j in jobs.values()) == list(range(10))

    got, want = records(slurm_dir), records(local_dir)
    assert len(want) == 10
    assert set(got) == set(want) == set(jobs)
    for cid, rec in got.items():
        ref = want[cid]
        method = rec["config"]["method"]
        assert rec["status"] == ref["status"] == "done", (cid, rec.get("error"))
        assert rec["environment"]["device"].endswith(" 1 threads)"), rec["environment"]
        clean, clean_ref = rec["metrics"]["clean"], ref["metrics"]["clean"]
        if method == "masksembles":
            # torch-uncertainty draws Masksembles' masks from an unseeded
            # np.random.default_rng(): they differ in every process, so two runs of this
            # cell differ wherever they run. Only its status and sanity are comparable.
            assert 0 < clean["acc"] <= 1 and math.isfinite(clean["nll"])
            continue
        # Same machine, same seeds, same thread count: in practice bit-identical. A different
        # BLAS thread count would change the summation order (relative NLL differences ~1e-5
        # were seen with 2 threads against 1), which this tolerance does not hide.
        assert clean["acc"] == clean_ref["acc"], (cid, method)
        assert clean["nll"] == pytest.approx(clean_ref["nll"], rel=1e-6), (cid, method)

    states, out = status(slurm_dir)
    assert states == {cid: "done" for cid in want}, out
    assert out.strip().splitlines()[-1] == "10 done", out


def test_cell_that_raises_shows_failed_with_its_error(results_root: Path, tmp_path: Path):
    suite = write_suite(
        tmp_path,
        "diverges",
        f"grid: {ONE_CELL_GRID}, methods: [single]}}\n"
        "recipe: {epochs: 1, lr: 1.0e+6, max_loss: 50, warmup_epochs: 0}\n"
        "evaluation: {cost: false}\n",
    )
    t0 = time.monotonic()
    rc, out = cli(
        "run", suite, "--executor", "slurm", "--profile", "local", "--results", results_root,
        "--wait", "-q", timeout=180,
    )  # fmt: skip
    print(f"\nfailing cell via Slurm: {time.monotonic() - t0:.0f}s")
    assert rc == 1, out  # a failed cell makes the run's exit status 1
    assert re.search(r"FAILED [0-9a-f]{16} single seed 0: DivergenceError: training loss", out), out

    results = results_root / "diverges"
    ((cid, rec),) = records(results).items()
    assert rec["status"] == "failed"
    assert rec["error"]["type"] == "DivergenceError"
    job = jobs_of(results)[cid]

    states, out = status(results)
    assert states == {cid: "failed"}, out
    assert f"failed   {cid} job {job}" in out, out
    assert re.search(r"\| DivergenceError: training loss became \S+ at step \d+ .*limit 50", out), (
        out
    )
    # The tail of the task's log: the harness's own warning, written by the task.
    assert "failed: DivergenceError" in task_logs(results, job, "err")
    assert re.search(r"\| harness WARNING .* failed: DivergenceError", out), out
    assert out.strip().splitlines()[-1] == "1 failed", out


def test_task_killed_by_time_limit_is_requeued_and_resumes(results_root: Path, tmp_path: Path):
    # Deterministic whatever the machine's speed: the cell is held at its first epoch boundary
    # (HARNESS_FAULT_HOLD: after each write of checkpoint.pt it waits while a flag file exists),
    # so no attempt can finish before Slurm's time limit interrupts it (--time=1 with USR2 15 s
    # before; Slurm may signal up to 60 s early, sbatch(1)). submitit calls CellTask.checkpoint
    # and requeues the task; only once an attempt has logged that it resumed from the epoch
    # checkpoint does the test remove the flag, and the cell then trains to the end. An attempt
    # that a loaded machine starts too slowly to finish even one epoch is simply requeued again.
    epochs = 5
    flag = tmp_path / "hold"
    flag.touch()
    suite = write_suite(
        tmp_path,
        "requeue",
        f"grid: {ONE_CELL_GRID}, methods: [single]}}\n"
        f"recipe: {{epochs: {epochs}}}\nevaluation: {{cost: false}}\n",
    )
    env = fault_env(cli_env(), HARNESS_FAULT_HOLD=f"checkpoint.pt:{flag}")
    cmd = [
        *harness_cmd(), "run", str(suite), "--executor", "slurm", "--profile", "local",
        "--results", str(results_root), "--slurm", "timeout_min=1",
        "--slurm", "signal_delay_s=15", "--slurm", "max_num_timeout=20", "--wait", "-q",
    ]  # fmt: skip
    results = results_root / "requeue"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = t0 + 600
        while time.monotonic() < deadline and proc.poll() is None:
            jobs = jobs_of(results)
            if jobs and "resuming after epoch" in task_logs(
                results, next(iter(jobs.values())), "err"
            ):
                break
            time.sleep(1)
        held_s = time.monotonic() - t0
        flag.unlink()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, out
    assert held_s < 600, "no attempt resumed from its checkpoint within 10 minutes"

    ((cid, rec),) = records(results).items()
    job = jobs_of(results)[cid]
    err, log = task_logs(results, job, "err"), task_logs(results, job, "out")
    resumed = [int(n) for n in re.findall(r"resuming after epoch (\d+)", err)]
    attempts = sacct_attempts(job)
    print(
        f"\ntime-limit requeue: {elapsed:.0f}s (held {held_s:.0f}s), {len(resumed) + 1} "
        f"attempts, resumed after "
        f"epochs {resumed}; sacct attempts {attempts}"
    )
    assert rec["status"] == "done", rec.get("error")
    assert [h["epoch"] for h in rec["history"]] == list(range(1, epochs + 1))
    assert not (results / cid / "checkpoint.pt").exists()
    # Evidence of the time limit, the requeue and the resume, in submitit's and harness's logs
    # (attempts append to the same files) and in Slurm's accounting.
    assert "Caught signal SIGUSR2" in log and "timed-out" in log, log
    assert "Requeued job" in log, log
    assert resumed and resumed[0] >= 1, err
    assert resumed == sorted(resumed), err  # never back to an earlier epoch
    assert re.search(r"restart [1-9]", err), err
    # The final attempt's own state is not checked: a warning USR2 can still arrive while the
    # finished task's interpreter exits (its result already written) and Slurm then records
    # FAILED; the record, the result file and `harness status` are what count.
    assert "REQUEUED" in attempts[:-1], attempts
    states, out = status(results)
    assert states == {cid: "done"}, out


def test_cancelled_suite_resubmitted_completes_only_what_was_missing(
    results_root: Path, tmp_path: Path
):
    # One task at a time: the fast cell (task 0, 2 epochs: the recipe's warm-up needs more than
    # one) runs first; when its record appears, the slow cell (task 1) is starting and the other
    # slow cell (task 2) is still pending in the array. The slow cells are held after each epoch
    # checkpoint (HARNESS_FAULT_HOLD, a flag per cell) until the cancel, so neither can finish
    # first however fast the machine.
    from harness.config.parse import load_suite

    suite = write_suite(
        tmp_path,
        "cancel",
        f"grid: {ONE_CELL_GRID}, methods: [{{name: single, recipe: {{epochs: 2}}}}, "
        "{name: single, recipe: {epochs: 20}}, {name: single, recipe: {epochs: 21}}]}\n"
        "evaluation: {cost: false}\n",
    )
    holds = [tmp_path / f"hold-{c.cell_id}" for c in load_suite(suite).cells()
             if c.recipe.epochs > 2]  # fmt: skip
    assert len(holds) == 2
    for flag in holds:
        flag.touch()
    held_env = fault_env(cli_env(), HARNESS_FAULT_HOLD=f"checkpoint.pt:{tmp_path}/hold-{{cell}}")
    t0 = time.monotonic()
    rc, out = cli(
        "run", suite, "--executor", "slurm", "--profile", "local", "--results", results_root,
        "--slurm", "array_parallelism=1", "-q", timeout=120, env=held_env,
    )  # fmt: skip
    assert rc == 0, out
    results = results_root / "cancel"
    manifest = json.loads((results / "suite.json").read_text())
    by_epochs = {manifest["cells"][c]["cell"]["recipe"]["epochs"]: c for c in manifest["current"]}
    fast, slow = by_epochs[2], [by_epochs[20], by_epochs[21]]
    jobs = jobs_of(results)
    assert jobs[fast].endswith("_0")

    fast_record = results / fast / "record.json"
    wait_for(fast_record.exists, 120, f"the fast cell's record {fast_record}")
    rc, out = cli("cancel", results, timeout=60)
    assert rc == 0, out
    # The running task and the array's pending one (sacct lists it as ARRAY_[2-2%1]) both.
    listed = re.search(r"cancelled \d+ tasks: (.*)", out)
    assert listed, out
    cancelled = set(listed.group(1).split())
    assert {jobs[c] for c in slow} <= cancelled, out
    assert jobs[fast] not in cancelled, out

    def settled():
        states, out = status(results)
        return (states, out) if not {"running", "queued"} & set(states.values()) else None

    states, out = wait_for(settled, 60, "the cancelled tasks to leave the queue", poll_s=1)
    assert states[fast] == "done", out
    for c in slow:
        assert states[c] != "done", out
        assert states[c] == "lost" and "CANCELLED" in out, out
    assert not any((results / c / "record.json").exists() for c in slow)
    for flag in holds:
        flag.unlink()
    fast_bytes = fast_record.read_bytes()

    rc, out = cli(
        "run", suite, "--executor", "slurm", "--profile", "local", "--results", results_root,
        "--wait", "-q", timeout=180,
    )  # fmt: skip
    print(f"\ncancel and re-submit: {time.monotonic() - t0:.0f}s")
    assert rc == 0, out
    assert "3 cells, 1 already done, 2 to run" in out, out
    assert re.search(r"submitted job array \d+ with 2 tasks", out), out
    assert fast_record.read_bytes() == fast_bytes  # not redone
    recs = records(results)
    assert {c: r["status"] for c, r in recs.items()} == dict.fromkeys([fast, *slow], "done")
    new_jobs = jobs_of(results)
    assert new_jobs[fast] == jobs[fast]
    assert {new_jobs[c].split("_")[0] for c in slow} != {jobs[fast].split("_")[0]}
    states, out = status(results)
    assert states == dict.fromkeys([fast, *slow], "done"), out


def test_force_resubmits_and_retrains_a_done_cell(results_root: Path, tmp_path: Path):
    """``--force`` reaches the tasks: the done cell is submitted again and trained again (a
    new job, a new record started after the first one finished), not handed its old record."""
    suite = write_suite(
        tmp_path,
        "force",
        f"grid: {ONE_CELL_GRID}, methods: [{{name: single, recipe: {{epochs: 2}}}}]}}\n"
        "evaluation: {cost: false}\n",
    )
    argv = ("run", suite, "--executor", "slurm", "--profile", "local", "--results",
            results_root, "--wait", "-q")  # fmt: skip
    rc, out = cli(*argv, timeout=180)
    assert rc == 0, out
    results = results_root / "force"
    ((cid, first),) = records(results).items()
    first_job = jobs_of(results)[cid]
    rc, out = cli(*argv, timeout=60)
    assert rc == 0 and "nothing to submit: every cell is done" in out, out
    rc, out = cli(*argv, "--force", timeout=180)
    assert rc == 0, out
    assert re.search(r"submitted job array \d+ with 1 tasks", out), out
    second = records(results)[cid]
    assert second["status"] == "done", second.get("error")
    assert jobs_of(results)[cid] != first_job
    assert second["started_at"] >= first["finished_at"]
    assert "resuming" not in task_logs(results, jobs_of(results)[cid], "err").lower()


def test_task_out_of_space_fails_its_cell_with_one_line_shown_by_status(
    results_root: Path, tmp_path: Path
):
    """Issue 42: a task whose cell meets a full disk fails that one cell with the line naming the
    path and "no space left on device", and ``harness status`` shows it. The full disk is
    injected in the task by the test-only plugin ``tests.fixtures.full_disk_plugin``
    (``--plugin``, which the Slurm executor exports to its tasks): every ``checkpoint.pt`` write
    fails with ``ENOSPC``."""
    suite = write_suite(
        tmp_path,
        "fulldisk",
        f"grid: {ONE_CELL_GRID}, methods: [single]}}\n"
        "recipe: {epochs: 1, warmup_epochs: 0}\n"
        "evaluation: {cost: false}\n",
    )
    env = {**cli_env(), "PYTHONPATH": str(REPO)}  # the tasks import the plugin from the checkout
    rc, out = cli(
        "run", suite, "--executor", "slurm", "--profile", "local", "--results", results_root,
        "--plugin", "tests.fixtures.full_disk_plugin", "--wait", "-q", timeout=240, env=env,
    )  # fmt: skip
    assert rc == 1, out
    results = results_root / "fulldisk"
    ((cid, rec),) = records(results).items()
    ckpt = results.resolve() / cid / "checkpoint.pt"
    assert rec["status"] == "failed" and rec["error"]["type"] == "OutOfSpace", rec["error"]
    assert rec["error"]["message"].startswith(f"{ckpt}: no space left on device: the file "
                                              "system is full (")  # fmt: skip
    assert "\n" not in rec["error"]["message"]
    assert f"FAILED {cid} single seed 0: OutOfSpace: {ckpt}: no space left on device" in out
    states, shown = status(results)
    assert states == {cid: "failed"}, shown
    assert f"failed   {cid} job {jobs_of(results)[cid]}" in shown, shown
    assert re.search(rf"\| OutOfSpace: {re.escape(str(ckpt))}: no space left on device", shown), (
        shown
    )
    assert "Traceback" not in out + shown


def test_sacct_array_lines_expand_to_tasks():
    """sacct lists an array's tasks that never started on one line (no cluster needed)."""
    from harness.executors.status import expand_job_id

    assert expand_job_id("14_[1-2%1]") == ["14_1", "14_2"]
    assert expand_job_id("7_[0,3-5,9]") == ["7_0", "7_3", "7_4", "7_5", "7_9"]
    assert expand_job_id("7_[0-6:3%2]") == ["7_0", "7_3", "7_6"]
    assert expand_job_id("7_2") == ["7_2"]
    assert expand_job_id("13") == ["13"]
