"""Live progress: progress.csv grows epoch by epoch while a cell trains, ``harness status`` shows
the epoch, executor, device, accuracy and ETA; a resumed cell never holds an epoch twice;
TensorBoard events on request, and a clear error when the package is missing."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.storage.progress import (
    COLUMNS,
    ProgressLog,
    epoch_images,
    eta_s,
    progress_summary,
    read_progress,
)
from tests.fixtures.machine_faults import fault_env

SLOW = """
name: slow
grid:
  datasets: [digits]
  backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
  seeds: [0]
  methods: [single]
recipe: {{epochs: {epochs}, batch_size: 16, lr: 0.05, validation: 100}}
evaluation: {{cost: false}}
"""


def row(epoch: int, epoch_s: float = 2.0, **extra: float) -> dict:
    return {"epoch": epoch, "train_loss": 1.0 / epoch, "train_reg": 0.0, "train_acc": 0.5,
            "lr": 0.1, "time_s": epoch_s, "elapsed_s": epoch * epoch_s, **extra}  # fmt: skip


def test_rows_flushed_with_diagnostics_and_images_per_s(tmp_path):
    log = ProgressLog(tmp_path, 0, 5, "cpu", tensorboard=False)
    log.write(row(1, val_acc=0.25), {"tau": 0.5, "lam": 0.1, "layers": {"a": 1}, "on": True}, 100)
    # Flushed: another reader sees the row before the writer closes the file.
    rows = read_progress(tmp_path)
    assert len(rows) == 1 and rows[0]["epoch"] == 1 and rows[0]["val_acc"] == 0.25
    assert rows[0]["images_per_s"] == pytest.approx(50.0) and rows[0]["epoch_s"] == 2.0
    assert rows[0]["diag_tau"] == 0.5 and rows[0]["diag_lam"] == 0.1
    assert rows[0]["val_nll"] is None  # no such value this epoch: an empty cell
    log.close()
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert header == [*COLUMNS, "diag_lam", "diag_tau"]  # nested and boolean values left out
    info = json.loads((tmp_path / "progress.json").read_text())
    assert info["executor"] == "inprocess" and info["device"] == "cpu" and info["epochs"] == 5


def test_resume_truncates_rows_after_the_checkpoint(tmp_path):
    log = ProgressLog(tmp_path, 0, 6, "cpu", tensorboard=False)
    for e in (1, 2, 3, 4):  # the run was killed after writing epoch 4, checkpoint after 2
        log.write(row(e), {"tau": float(e)})
    log.close()
    resumed = ProgressLog(tmp_path, 2, 6, "cpu", tensorboard=False)
    assert resumed.rows_kept == 2
    for e in (3, 4, 5):
        resumed.write(row(e), {"tau": 10.0 * e})
    resumed.close()
    rows = read_progress(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["diag_tau"] for r in rows] == [1.0, 2.0, 30.0, 40.0, 50.0]
    with (tmp_path / "progress.csv").open(newline="") as f:
        assert sum(1 for line in f if line.startswith("epoch,")) == 1  # one header
    ProgressLog(tmp_path, 0, 6, "cpu", tensorboard=False).close()  # a fresh start: no rows
    assert read_progress(tmp_path) == []


def test_half_written_last_line_is_ignored(tmp_path):
    log = ProgressLog(tmp_path, 0, 3, "cpu", tensorboard=False)
    log.write(row(1))
    log.close()
    with (tmp_path / "progress.csv").open("a") as f:
        f.write("2,0.7")  # a reader racing the writer sees part of a line
    assert [r["epoch"] for r in read_progress(tmp_path)] == [1]


def test_eta_from_mean_epoch_time():
    rows = [{"epoch": 1, "epoch_s": 4.0}, {"epoch": 2, "epoch_s": 6.0}]
    assert eta_s(rows, 10) == pytest.approx(40.0)  # mean 5 s × 8 epochs left
    assert eta_s(rows, 10, since_last_s=3.0) == pytest.approx(37.0)
    assert eta_s(rows, 10, since_last_s=100.0) == 0.0
    assert eta_s(rows, 2) == 0.0
    assert eta_s([], 10) is None


def test_summary_names_executor_device_epoch_accuracy_eta(tmp_path):
    log = ProgressLog(tmp_path, 0, 10, "cuda:1", tensorboard=False)
    log.write(row(1, epoch_s=30.0, val_acc=0.8125))
    log.write(row(2, epoch_s=30.0, val_acc=0.84375))
    log.close()
    past = time.time() - 10
    os.utime(tmp_path / "progress.csv", (past, past))
    text = progress_summary(tmp_path, running=True)
    assert text.startswith("inprocess cuda:1, epoch 2/10, val acc 0.844, ETA 3m")
    assert re.search(r"ETA 3m(4[5-9]|50)s$", text), text  # 8 × 30 s less the 10 s since
    assert (
        progress_summary(tmp_path, running=False) == "inprocess cuda:1, epoch 2/10, val acc 0.844"
    )
    assert progress_summary(tmp_path / "nothing", running=True) == ""


def test_summary_falls_back_to_train_accuracy_without_validation(tmp_path):
    log = ProgressLog(tmp_path, 0, 4, "cpu", tensorboard=False)
    log.write(row(1))  # train_acc 0.5, no val_acc: the recipe holds out nothing
    log.close()
    assert progress_summary(tmp_path, running=False) == "inprocess cpu, epoch 1/4, train acc 0.500"


def test_epoch_images_counts_streams_and_dropped_batches():
    class Loader:
        labels, batch_size, drop_last, streams = [0] * 100, 32, False, 1

    assert epoch_images(Loader, 4) == 100
    Loader.drop_last, Loader.streams = True, 3
    assert epoch_images(Loader, 3) == 3 * 96


def test_tensorboard_missing_is_a_validate_error(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    suite = tmp_path / "slow.yaml"
    suite.write_text(textwrap.dedent(SLOW).format(epochs=2))
    from harness.storage import loggers

    # The package the tensorboard tracker needs, as if it were not installed.
    loggers.TRACKERS.names()  # the built-ins registered, then one replaced for this test
    fake = loggers.Tracker(None, "no_such_package_xyz", "tb")
    monkeypatch.setitem(loggers.TRACKERS._items, "tensorboard", fake)
    assert main(["validate", str(suite), "--skip-data"]) == 0  # not asked for: fine
    assert main(["validate", str(suite), "--skip-data", "--tensorboard"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"--logger tensorboard: the no_such_package_xyz package is not installed", err)


def test_tensorboard_events_hold_the_epoch_scalars(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = ProgressLog(tmp_path, 0, 3, "cpu", tensorboard=True)
    for e in (1, 2):
        log.write(row(e, val_acc=0.5 + e / 10), {"tau": 0.25})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    val = [(s.step, round(s.value, 6)) for s in acc.Scalars("val.acc")]  # the record's name
    assert val == [(1, 0.6), (2, 0.7)]
    assert [s.value for s in acc.Scalars("diag.tau")] == [0.25, 0.25]
    assert "val.nll" not in acc.Tags()["scalars"]  # never written: no empty series


def harness(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *argv], capture_output=True,
                          text=True, timeout=120, **kw)  # fmt: skip


def wait_held(gate: Path, k: int, proc: subprocess.Popen) -> None:
    """Until the run holds inside its k-th checkpoint write (``HARNESS_FAULT_STEP``); a deadline
    only guards against a hang."""
    deadline = time.monotonic() + 240
    while not (gate / f"held-{k}").exists():
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before epoch {k}"
        assert time.monotonic() < deadline, f"the run never reached epoch {k}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "inprocess"])
def test_csv_grows_and_status_shows_the_epoch_while_a_cell_trains(tmp_path, executor):
    """Acceptance: a digits cell run by ``harness run``, stepped one epoch at a time by the test
    (held inside each epoch's checkpoint write, ``HARNESS_FAULT_STEP``) so that what status
    reads is known, not raced: a cell in a local worker process shows as running (from its
    lease), with the epoch from its CSV."""
    epochs = 6
    suite = tmp_path / "slow.yaml"
    suite.write_text(textwrap.dedent(SLOW).format(epochs=epochs))
    results = tmp_path / "results"
    gate = tmp_path / "gate"
    gate.mkdir()
    env = fault_env({**os.environ, "OMP_NUM_THREADS": "1"},
                    HARNESS_FAULT_STEP=f"checkpoint.pt:{gate}")  # fmt: skip
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(results),
           "-q", "--executor", executor, "--workers", "1", "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # The heartbeat (live.json) adds the epoch's step and loss: the epoch's last step, held in
    # its checkpoint write.
    line = (
        rf"^running .*\[{executor} cpu, epoch (\d+)/{epochs}, step (\d+)/(\d+), "
        + r"loss \d+\.\d{3}, val acc [01]\.\d{3}, ETA \d+m\d\ds\]$"
    )
    try:
        for k in (1, 2, 3):
            wait_held(gate, k, proc)
            (cell,) = [p.parent for p in (results / "slow").glob("*/progress.csv")]
            assert len(read_progress(cell)) == k  # the CSV grew by one row an epoch
            status = harness("status", str(results / "slow"), env=env)
            m = re.search(line, status.stdout, re.M)
            assert m, status.stdout
            assert int(m.group(1)) == k, status.stdout  # the epoch on disk at that moment
            assert m.group(2) == m.group(3), status.stdout  # every step of it done
            (gate / f"go-{k}").touch()
        (gate / "go").touch()  # the rest without stopping
        err = proc.communicate(timeout=120)[1]
    finally:
        (gate / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    cell = next((results / "slow").glob("*/progress.csv")).parent
    assert [r["epoch"] for r in read_progress(cell)] == list(range(1, epochs + 1))
    with (cell / "progress.csv").open(newline="") as f:
        assert next(csv.reader(f)) == list(COLUMNS)  # `single` has no diagnostics
    status = harness("status", str(results / "slow"), env=env)
    assert re.search(r"^done .*\n1 done$", status.stdout, re.M), status.stdout


def test_status_of_a_slurm_task_cell_shows_job_gpu_epoch_and_eta(tmp_path, monkeypatch, capsys):
    """A cell trained by a Slurm array task on another node: its lease names the job, its
    progress files the executor, the GPU and the epoch."""
    from harness.config.parse import load_suite
    from harness.executors.base import write_manifest
    from harness.executors.status import cell_states, print_status

    path = tmp_path / "slow.yaml"
    path.write_text(textwrap.dedent(SLOW).format(epochs=20))
    suite = load_suite(path)
    results = tmp_path / "results"
    write_manifest(suite, results)
    cell_dir = results / suite.cells()[0].cell_id
    cell_dir.mkdir(parents=True)
    owner = {"host": "gpu-node-7", "pid": 4242, "slurm_job_id": "77_3", "token": "t",
             "started": "2026-11-30T10:00:00+0000"}  # fmt: skip
    (cell_dir / "lease.json").write_text(json.dumps(owner))  # fresh heartbeat: live
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    log = ProgressLog(cell_dir, 0, 20, "cuda", tensorboard=False)
    for e in (1, 2, 3, 4, 5):
        log.write(row(e, epoch_s=60.0, val_acc=0.5))
    log.close()
    [state] = cell_states(results)
    assert (state.state, state.job_id) == ("running", "77_3")
    assert state.progress.startswith("slurm cuda (GPU 3), epoch 5/20, val acc 0.500, ETA 1")
    assert print_status(results) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"^running  \w{16} job 77_3  .*\[slurm cuda \(GPU 3\), epoch 5/20, ", out, re.M
    )
    (cell_dir / "lease.json").unlink()  # the task died: no lease, no record, resumable
    [state] = cell_states(results)
    assert state.state == "pending"
    assert state.progress == "slurm cuda (GPU 3), epoch 5/20, val acc 0.500"  # no ETA: not running


@pytest.mark.slurm
def test_status_follows_a_cell_in_a_slurm_array_task(tmp_path):
    """The same acceptance on the single-node Slurm cluster: the running task's cell shows its
    job id and epoch n/E from the task's progress files (skips where no cluster can start). The
    task is held inside each of its first two checkpoint writes (``HARNESS_FAULT_STEP``, which
    the Slurm executor exports to it with the plugin) while status is read."""
    try:
        from tests.slurm_cluster import slurm_environment
    except ImportError:  # pragma: no cover - depends on how pytest imported this module
        from slurm_cluster import slurm_environment

    epochs = 6
    suite = tmp_path / "slow.yaml"
    suite.write_text(textwrap.dedent(SLOW).format(epochs=epochs))
    results = tmp_path / "results"
    gate = tmp_path / "gate"
    gate.mkdir()
    with slurm_environment():
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        env = fault_env(env, HARNESS_FAULT_STEP=f"checkpoint.pt:{gate}")
        run = harness("run", str(suite), "--executor", "slurm", "--profile", "local",
                      "--results", str(results), "-q", env=env)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        # the task's heartbeat (live.json, in the shared results folder): the epoch's last step
        line = (
            rf"^running  \w{{16}} job ([\d_]+)  .*\[slurm cpu, epoch (\d+)/{epochs}, "
            r"step (\d+)/(\d+), loss \d+\.\d{3}, val acc"
        )
        shown = []
        try:
            for k in (1, 2):
                deadline = time.monotonic() + 240
                while not (gate / f"held-{k}").exists():
                    assert time.monotonic() < deadline, f"the task never reached epoch {k}"
                    time.sleep(0.2)
                status = harness("status", str(results / "slow"), env=env)
                m = re.search(line, status.stdout, re.M)
                assert m, status.stdout
                shown.append(int(m.group(2)))
                assert m.group(3) == m.group(4), status.stdout
                (gate / f"go-{k}").touch()
        finally:
            (gate / "go").touch()
            harness("cancel", str(results / "slow"), env=env)  # frees the cluster for other tests
    assert shown == [1, 2]


@pytest.mark.slow
def test_killed_run_resumes_the_csv_and_events_without_repeating_an_epoch(tmp_path):
    """SIGKILL mid-training, then the same command: epochs 1..E once each in progress.csv, and
    in the TensorBoard events asked for on the command line (workers inherit the request).

    The kill lands where a resume has something to drop, on every machine: inside epoch 3's
    checkpoint write (``HARNESS_FAULT_STEP`` holds the worker there), after its progress row and
    TensorBoard scalars were written, while the checkpoint on disk is still epoch 2's."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    epochs = 6
    suite = tmp_path / "slow.yaml"
    suite.write_text(textwrap.dedent(SLOW).format(epochs=epochs))
    results = tmp_path / "results"
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(results),
           "-q", "--executor", "local", "--workers", "1", "--threads", "1",
           "--tensorboard"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=fault_env(env, HARNESS_FAULT_STEP=f"checkpoint.pt:{gate}"),
                            start_new_session=True)  # fmt: skip
    try:
        for k in (1, 2):
            wait_held(gate, k, proc)
            (gate / f"go-{k}").touch()
        wait_held(gate, 3, proc)
    finally:
        os.killpg(proc.pid, 9)  # the run and its worker, at once, inside epoch 3's checkpoint
        proc.wait(timeout=30)
    cell = next((results / "slow").glob("*/progress.csv")).parent
    assert [r["epoch"] for r in read_progress(cell)] == [1, 2, 3]
    from harness.storage.checkpoint import load_checkpoint

    assert load_checkpoint(cell / "checkpoint.pt")["epoch"] == 1  # 0-based: epoch 2's
    again = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=env, start_new_session=True)  # fmt: skip
    try:
        err = again.communicate(timeout=400)[1]
    finally:
        if again.poll() is None:
            os.killpg(again.pid, 9)  # never leave a worker training behind
            again.wait(timeout=30)
    assert again.returncode == 0, err
    assert [r["epoch"] for r in read_progress(cell)] == list(range(1, epochs + 1))
    acc = EventAccumulator(str(cell / "tensorboard"))
    acc.Reload()
    assert [s.step for s in acc.Scalars("val.acc")] == list(range(1, epochs + 1))
