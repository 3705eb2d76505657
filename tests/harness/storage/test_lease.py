"""Per-cell leases: exclusive, named owner, heartbeat, takeover of dead owners, shown by status."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from harness.storage import lease
from harness.storage.lease import LEASE_FILE, LeaseHeld, acquire, describe, live_leases, read_owner


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped) on this host."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout)


def fake_lease(cell_dir, age_s: float = 0.0, **owner) -> None:
    cell_dir.mkdir(parents=True, exist_ok=True)
    path = cell_dir / LEASE_FILE
    path.write_text(json.dumps({"started": "then", "token": "t0", **owner}))
    then = time.time() - age_s
    os.utime(path, (then, then))


def test_acquire_names_its_owner_and_excludes_others(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    held = acquire(tmp_path / "c")
    owner = read_owner(tmp_path / "c")
    assert owner["host"] == socket.gethostname() and owner["pid"] == os.getpid()
    assert owner["slurm_job_id"] == "77_3" and owner["token"] == held.owner["token"]
    with pytest.raises(
        LeaseHeld, match=rf"leased by {socket.gethostname()}:{os.getpid()} \(job 77_3\)"
    ):
        acquire(tmp_path / "c")
    held.release()
    assert not (tmp_path / "c" / LEASE_FILE).exists()
    acquire(tmp_path / "c").release()  # free again


def test_lease_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
    fake_lease(tmp_path / "c", host=socket.gethostname(), pid=dead_pid())
    with acquire(tmp_path / "c") as held:
        assert read_owner(tmp_path / "c")["token"] == held.owner["token"]


def test_lease_from_another_host_is_kept_until_its_heartbeat_is_old(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LEASE_TIMEOUT_S", "60")
    fake_lease(tmp_path / "c", age_s=30, host="node-7", pid=1234, slurm_job_id="9_1")
    with pytest.raises(LeaseHeld, match=r"leased by node-7:1234 \(job 9_1\)") as info:
        acquire(tmp_path / "c")
    assert info.value.owner["heartbeat_age_s"] == pytest.approx(30, abs=5)
    fake_lease(tmp_path / "c", age_s=120, host="node-7", pid=1234, slurm_job_id="9_1")
    with acquire(tmp_path / "c") as held:
        assert held.owner["host"] == socket.gethostname()


def test_heartbeat_refreshes_the_mtime(tmp_path):
    held = acquire(tmp_path / "c", heartbeat_s=0.05)
    path = tmp_path / "c" / LEASE_FILE
    os.utime(path, (time.time() - 500, time.time() - 500))
    deadline = time.monotonic() + 10
    while read_owner(tmp_path / "c")["heartbeat_age_s"] > 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_owner(tmp_path / "c")["heartbeat_age_s"] < 100
    held.release()


def test_release_leaves_a_lease_that_is_not_ours(tmp_path):
    held = acquire(tmp_path / "c")
    fake_lease(tmp_path / "c", host="node-2", pid=5, token="someone-else")  # broke ours, took it
    held.release()
    assert read_owner(tmp_path / "c")["token"] == "someone-else"


def test_break_serialises_takeovers(tmp_path, monkeypatch):
    """A competitor that breaks the stale lease and takes the cell first is not broken in turn."""
    fake_lease(tmp_path / "c", host=socket.gethostname(), pid=dead_pid(), token="stale")
    seen = read_owner(tmp_path / "c")
    fresh = acquire(tmp_path / "c")  # the competitor: broke "stale", holds a live lease
    lease._break_stale(tmp_path / "c" / LEASE_FILE, seen)  # ours, late, with the old view
    assert read_owner(tmp_path / "c")["token"] == fresh.owner["token"]
    assert not (tmp_path / "c" / (LEASE_FILE + lease.BREAK_SUFFIX)).exists()
    fresh.release()


def test_live_leases_and_describe(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LEASE_TIMEOUT_S", "60")
    fake_lease(tmp_path / "a", host="node-1", pid=1, slurm_job_id="5_0")
    fake_lease(tmp_path / "b", host="node-1", pid=2, age_s=600)  # abandoned
    fake_lease(tmp_path / "c", host=socket.gethostname(), pid=dead_pid())  # dead here
    live = live_leases(tmp_path)
    assert list(live) == ["a"]
    assert describe(live["a"]) == "node-1:1 (job 5_0)"
    assert describe({"host": "h", "pid": 3, "slurm_job_id": None}) == "h:3"


SUITE = """
name: leased
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0]
  methods: [single]
recipe: {epochs: 1, batch_size: 128, lr: 0.05}
evaluation: {cost: false}
"""


def test_run_cell_skips_a_cell_leased_elsewhere_and_status_shows_it(write_suite, tmp_path, capsys):
    from harness.config.parse import load_suite
    from harness.engine.runner import run_cell
    from harness.executors.base import write_manifest
    from harness.executors.status import print_status

    suite = load_suite(write_suite(textwrap.dedent(SUITE)))
    cell = suite.cells()[0]
    write_manifest(suite, tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_lease(
            tmp_path / cell.cell_id, host=socket.gethostname(), pid=sleeper.pid, slurm_job_id="41_2"
        )
        out = run_cell(cell, tmp_path, progress=False)
        assert out == {
            "cell_id": cell.cell_id,
            "status": "leased",
            "lease": {**out["lease"], "host": socket.gethostname(), "pid": sleeper.pid},
        }
        assert not (tmp_path / cell.cell_id / "record.json").exists()
        assert not (tmp_path / cell.cell_id / "events.jsonl").exists()  # never trained
        assert print_status(tmp_path) == 0
        shown = capsys.readouterr().out
        assert f"running  {cell.cell_id} job 41_2" in shown
        assert f"leased by {socket.gethostname()}:{sleeper.pid} (job 41_2)" in shown
    finally:
        sleeper.kill()
        sleeper.wait()
    rec = run_cell(cell, tmp_path, progress=False)  # owner gone: taken over and trained
    assert rec["status"] == "done"
    assert not (tmp_path / cell.cell_id / LEASE_FILE).exists()
