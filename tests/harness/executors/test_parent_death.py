"""Stopping the local executor from outside, and workers that never outlive their parent.

- SIGTERM (``kill``, ``timeout``, Slurm, systemd) stops a run as Ctrl-C does: in the parent it is
  deferred to a safe point and becomes :class:`harness.executors.interrupt.Terminated` (a
  ``KeyboardInterrupt``); in a process that runs its cells itself it interrupts the cell. Through
  the CLI with local workers: the workers stop, the "interrupted" line is printed, no lease is
  left, the epoch checkpoints are, and the same command resumes from them.
- A parent killed outright (SIGKILL): its workers, busy or idle, exit within seconds; the finished
  cell's record is kept, the busy cell's lease is not left live, and the next run resumes it.
- A script that calls ``harness.api.run`` at import, without the ``__main__`` guard: each spawned
  worker imports it again; the run ends with one line naming the cause, and no cell is recorded
  as failed (it used to be every cell, "killed its worker process 2 times ... lower its memory").

The real-process tests are ``slow`` (they start the CLI and workers, as pyproject.toml's marker
says); each takes 15–40 s on a loaded 2-core machine. Nothing here asserts wall time: deadlines
only keep a hang from eating the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.storage.checkpoint import read_events
from harness.storage.lease import live_leases
from tests.fixtures.machine_faults import REPO, fault_env

GRID = """
name: {name}
grid:
  datasets: [digits]
  backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
  seeds: [0]
  methods: [single, {{name: deep_ensemble, M: [2]}}]
recipe: {{epochs: 3, batch_size: 128, lr: 0.05}}
evaluation: {{cost: false}}
"""
DEADLINE_S = 120  # only against a hang: every wait below ends on an event, not on a clock

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)"
)


def write_grid(folder: Path, name: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(GRID).format(name=name))
    return path


def cell_ids(suite: Path) -> list[str]:
    from harness.config.parse import load_suite

    return [c.cell_id for c in load_suite(suite).cells()]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_FAULT")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run_cmd(suite: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(results),
            "-q", "--executor", "local", "--workers", "2", "--threads", "1"]  # fmt: skip


def train_starts(cell_dir: Path) -> list[int]:
    return [e["from_epoch"] for e in read_events(cell_dir) if e["event"] == "train"]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (exited, not yet reaped by whoever adopted it)
    holds no memory, no lease and no file, so it counts as gone."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (its workers, their ranks, the resource tracker)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.add(kid)
            todo.append(kid)
    return out


def wait_until(check, proc: subprocess.Popen | None, what: str, log: Path | None = None) -> None:
    """Poll ``check`` until true; fail at once if ``proc`` exits first."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            pytest.fail(f"{what}: the run exited ({proc.returncode}) first\n{tail}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {DEADLINE_S} s")
        time.sleep(0.1)


def gone_within_deadline(pids: set[int]) -> set[int]:
    """The processes of ``pids`` still running once they all exited or the deadline passed."""
    deadline = time.monotonic() + DEADLINE_S
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {p for p in pids if running(p)}


def kill_all(pids: set[int]) -> None:
    """A failed test leaves no worker training behind it."""
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def start_held_run(tmp_path: Path, suite: Path, held: list[str]) -> tuple[subprocess.Popen, Path]:
    """The CLI on two local workers, each cell of ``held`` stopped after its first epoch's
    checkpoint for as long as its hold file exists (``HARNESS_FAULT_HOLD``): whatever the
    machine's speed, it is mid-training when the test acts."""
    for cell_id in held:
        (tmp_path / f"hold-{cell_id}").touch()
    log = tmp_path / "run.log"
    env = fault_env(clean_env(), HARNESS_FAULT_HOLD=f"checkpoint.pt:{tmp_path}/hold-{{cell}}")
    # Output to a file, not a pipe: workers inherit the descriptors, and a pipe a live worker
    # holds would never reach EOF.
    with log.open("w") as out:
        proc = subprocess.Popen(run_cmd(suite, tmp_path / "results"), stdout=out, stderr=out,
                                env=env, start_new_session=True)  # fmt: skip
    return proc, log


def release(tmp_path: Path) -> None:
    for hold in tmp_path.glob("hold-*"):
        hold.unlink()


# ------------------------------------------------------------------------------ no processes


def test_sigterm_is_deferred_in_the_parent_like_ctrl_c():
    """While the local executor waits on its pools, SIGTERM only sets the flag (it used to end
    the parent at once, its workers training on); the run then stops with ``Terminated``."""
    from harness.executors.interrupt import Terminated, deferred_stop

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with deferred_stop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # would end this test process otherwise
        deadline = time.monotonic() + 5
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stop.is_set() and stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # a later signal does not change the first
        time.sleep(0.05)
        assert stop.signum == signal.SIGTERM
    exc = stop.interruption()
    assert isinstance(exc, Terminated) and isinstance(exc, KeyboardInterrupt)
    assert exc.signum == 15 and str(exc) == "terminated (SIGTERM)"
    assert {s: signal.getsignal(s) for s in before} == before


def test_sigterm_interrupts_a_cell_run_in_this_process():
    from harness.executors.interrupt import Terminated, sigterm_interrupts

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated, match=r"^terminated \(SIGTERM\)$"), sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here, in the main thread, long before this ends
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_worker_being_started_refuses_to_run_cells(tmp_path, monkeypatch):
    """In a process multiprocessing is still starting (the spawn method importing the parent's
    script again), either executor exits with the status the parent recognises, before any
    cell is run."""
    import multiprocessing as mp

    from harness.executors.base import ExecutorOptions
    from harness.executors.faults import MAIN_REIMPORTED_EXIT, MainReimported
    from harness.executors.local import InProcessExecutor, LocalWorkersExecutor

    suite = write_grid(tmp_path, "boot")
    from harness.config.parse import load_suite

    cells = load_suite(suite).cells()
    monkeypatch.setattr(mp.current_process(), "_inheriting", True, raising=False)
    for executor in (InProcessExecutor, LocalWorkersExecutor):
        with pytest.raises(SystemExit, match=rf"^{MAIN_REIMPORTED_EXIT}$"):
            executor(ExecutorOptions(workers=2, progress=False)).run(
                cells, tmp_path / "boot", None, force=False
            )
    assert not (tmp_path / "boot").exists()  # nothing run, nothing written

    monkeypatch.setattr(sys.modules["__main__"], "__file__", "/home/me/study.py", raising=False)
    assert str(MainReimported()) == (
        "/home/me/study.py calls harness.api.run when it is imported, and every worker process "
        "imports it again (workers are started with the spawn method), so the workers exited "
        'before running any cell: put the call under `if __name__ == "__main__":` and run the '
        "script again (no cell was run or recorded)"
    )


def test_a_worker_stops_its_cell_and_exits_once_its_parent_is_gone(monkeypatch):
    """The worker's side, signal by signal (the handler called as the signal would call it):
    under a live parent a stop signal interrupts the cell and no cell starts after it; once the
    parent is gone the worker exits, right after its cell stopped, or at once when idle."""
    from harness.executors import interrupt

    class Exited(Exception):
        pass

    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise Exited(f"exit {code}")

    monkeypatch.setattr(interrupt.os, "_exit", fake_exit)
    monkeypatch.setattr(interrupt, "_stopping", False)
    monkeypatch.setattr(interrupt, "_in_cell", False)
    monkeypatch.setattr(interrupt, "_parent_pid", os.getppid())
    terminated = pytest.raises(interrupt.Terminated, match=r"^terminated \(SIGTERM\)$")
    with terminated, interrupt.running_cell():
        interrupt._on_stop_signal(signal.SIGTERM, None)
    interrupt._on_stop_signal(signal.SIGINT, None)  # a second signal: ignored, cleanup goes on
    refused = pytest.raises(KeyboardInterrupt, match=r"^interrupted: no new cell starts$")
    with refused, interrupt.running_cell():
        pytest.fail("a cell started after a stop signal")
    assert exits == [] and not interrupt._in_cell

    monkeypatch.setattr(interrupt, "_stopping", False)
    interrupt._on_stop_signal(signal.SIGINT, None)  # idle: marks the worker, nothing to stop
    assert interrupt._stopping and exits == []

    monkeypatch.setattr(interrupt, "_stopping", False)
    monkeypatch.setattr(interrupt, "_parent_pid", os.getppid() + 1)  # re-parented: it died
    assert interrupt.parent_gone()
    with pytest.raises(Exited, match=r"^exit 143$"), interrupt.running_cell():
        interrupt._on_stop_signal(signal.SIGTERM, None)  # the kernel's, on the parent's death
    monkeypatch.setattr(interrupt, "_stopping", False)
    with pytest.raises(Exited, match=r"^exit 143$"):
        interrupt._on_stop_signal(signal.SIGTERM, None)  # idle: no one will hand it a cell
    assert exits == [143, 143]


# --------------------------------------------------------------------- slow: real processes


@pytest.mark.slow
@needs_proc
def test_sigterm_stops_the_local_workers_and_the_same_command_resumes(tmp_path):
    suite = write_grid(tmp_path, "term")
    ids = cell_ids(suite)
    folder = tmp_path / "results" / "term"
    proc, log = start_held_run(tmp_path, suite, held=ids)
    workers: set[int] = set()
    try:
        # Both cells held after their first epoch: training, leased, a checkpoint written.
        wait_until(lambda: all((folder / c / "checkpoint.pt").exists() for c in ids), proc,
                   "both workers at their first checkpoint", log)  # fmt: skip
        workers = {json.loads((folder / c / "lease.json").read_text())["pid"] for c in ids}
        assert workers <= descendants(proc.pid), (workers, descendants(proc.pid))
        family = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)  # the parent alone, as `kill PID` does
        release(tmp_path)  # were SIGTERM ignored, both cells would now finish
        try:
            rc = proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit after SIGTERM:\n{log.read_text()[-3000:]}")
        text = log.read_text()
        # The CLI's status for a stopped run (it reports Terminated as a KeyboardInterrupt).
        assert rc == 143, text  # 128 + SIGTERM, as a shell reports it
        assert text.rstrip().splitlines()[-1] == (
            "interrupted: finished cells are kept; re-run the same command to resume"
        ), text
        assert "Traceback" not in text
        # stop_pool joined them before the parent exited: none left, nothing leased.
        assert {p for p in family if running(p)} == set()
        assert not list(folder.glob("*/lease.json")) and live_leases(folder) == {}
        assert not list(folder.glob("*/record.json"))  # none finished, none half-written
        assert not list(folder.glob("*/.*.tmp"))
        assert {c: train_starts(folder / c) for c in ids} == {c: [0] for c in ids}

        rerun = subprocess.run(run_cmd(suite, tmp_path / "results"), capture_output=True,
                               text=True, env=clean_env(), timeout=600)  # fmt: skip
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert "leased by" not in rerun.stdout + rerun.stderr
        # Each cell resumed after its epoch-0 checkpoint, not from scratch.
        assert {c: train_starts(folder / c) for c in ids} == {c: [0, 1] for c in ids}
        assert {c: json.loads((folder / c / "record.json").read_text())["status"]
                for c in ids} == dict.fromkeys(ids, "done")  # fmt: skip
    finally:
        release(tmp_path)
        if proc.poll() is None:
            proc.kill()
        kill_all(workers)


@pytest.mark.slow
@needs_proc
def test_workers_stop_when_the_parent_is_sigkilled(tmp_path):
    """One cell held mid-training, the other finished (its worker idle, waiting for a cell
    that never comes): SIGKILL of the parent leaves neither worker running."""
    suite = write_grid(tmp_path, "orphans")
    held, free = cell_ids(suite)
    folder = tmp_path / "results" / "orphans"
    proc, log = start_held_run(tmp_path, suite, held=[held])
    family: set[int] = set()
    try:
        wait_until(lambda: (folder / free / "record.json").exists()
                   and (folder / held / "checkpoint.pt").exists(), proc,
                   "one cell done, the other at its first checkpoint", log)  # fmt: skip
        busy = json.loads((folder / held / "lease.json").read_text())["pid"]
        family = descendants(proc.pid)
        assert busy in family and len(family) >= 3, family  # 2 workers, the resource tracker
        done_before = (folder / free / "record.json").read_bytes()

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=DEADLINE_S)
        assert proc.returncode == -signal.SIGKILL
        # Busy and idle workers alike: none outlives the parent (they used to train on, then
        # wait forever on the pool's pipe, holding their leases).
        assert gone_within_deadline(family) == set(), log.read_text()[-3000:]
        assert live_leases(folder) == {}  # released, or its dead owner's is stale at once
        assert not list(folder.glob("*/.*.tmp"))
        assert not (folder / held / "record.json").exists()
        assert train_starts(folder / held) == [0]

        release(tmp_path)
        rerun = subprocess.run(run_cmd(suite, tmp_path / "results"), capture_output=True,
                               text=True, env=clean_env(), timeout=600)  # fmt: skip
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert "leased by" not in rerun.stdout + rerun.stderr
        assert train_starts(folder / held) == [0, 1]  # resumed from its epoch-0 checkpoint
        assert json.loads((folder / held / "record.json").read_text())["status"] == "done"
        assert (folder / free / "record.json").read_bytes() == done_before  # kept, not redone
    finally:
        release(tmp_path)
        if proc.poll() is None:
            proc.kill()
        kill_all(family)


SCRIPT = """
import harness.api as h

result = h.run({suite!r}, results={results!r}, executor="local", workers=2, threads=1)
print("finished", result.exit_code)
"""


@pytest.mark.slow
@needs_proc
def test_a_script_that_runs_at_import_is_told_to_guard_the_call(tmp_path):
    suite = write_grid(tmp_path, "unguarded")
    results = tmp_path / "results"
    script = tmp_path / "study.py"
    script.write_text(SCRIPT.format(suite=str(suite), results=str(results)))
    # This checkout first on the path (the script's folder is, not the current directory).
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=600)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "finished" not in out.stdout
    assert out.stderr.rstrip().splitlines()[-1] == (
        f"harness.api._common.HarnessError: {script} calls harness.api.run when it is imported, "
        "and every worker process imports it again (workers are started with the spawn "
        "method), so the workers exited before running any cell: put the call under "
        '`if __name__ == "__main__":` and run the script again (no cell was run or recorded)'
    ), out.stderr
    # Not multiprocessing's bootstrapping error, nor the memory advice of a killed worker.
    assert "WorkerKilled" not in out.stderr and "bootstrapping" not in out.stderr
    assert "lower its memory" not in out.stderr
    assert not list((results / "unguarded").glob("*/record.json"))
    assert not list((results / "unguarded").glob("*/events.jsonl"))  # no cell ever started


WATCHED = """
import multiprocessing as mp, os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor


def init():
    from harness.executors import interrupt

    interrupt._signal_on_parent_death = lambda signum: None  # no prctl: the watcher alone
    interrupt.install_worker_handler()


def busy(flag):
    from harness.executors.interrupt import running_cell

    with running_cell():
        try:
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            open(flag, "w").write("stopped at a safe point")
            raise


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    pools = [ProcessPoolExecutor(1, mp_context=ctx, initializer=init) for _ in range(2)]
    pools[0].submit(busy, sys.argv[1])
    pools[1].submit(os.getpid).result()  # started and idle
    pids = [p.pid for pool in pools for p in pool._processes.values()]
    print(*pids, flush=True)
    while not any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)
    time.sleep(0.5)  # the busy one in its loop
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@needs_proc
def test_without_the_kernels_signal_workers_notice_their_parent_is_gone(tmp_path):
    """Where ``PR_SET_PDEATHSIG`` is missing (not Linux, or refused), the watcher thread alone
    stops the busy worker's cell as Ctrl-C would and ends the idle one."""
    script, flag = tmp_path / "watched.py", tmp_path / "flag"
    script.write_text(WATCHED)
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "out.txt"
    with log.open("w") as out:  # a file: surviving workers would hold a pipe open
        proc = subprocess.Popen([sys.executable, str(script), str(flag)], stdout=out,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip
    proc.wait(timeout=DEADLINE_S)
    text = log.read_text()
    assert proc.returncode == -signal.SIGKILL, text
    pids = {int(p) for p in text.splitlines()[0].split()}
    assert len(pids) == 2, text
    try:
        assert gone_within_deadline(pids) == set()
        assert flag.read_text() == "stopped at a safe point"
    finally:
        kill_all(pids)
