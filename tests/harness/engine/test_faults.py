"""Nothing lost, nothing done twice: concurrent runs, SIGKILL at random moments (some inside
record and checkpoint writes), evaluation failing after training, Ctrl-C of the local executor,
and the pre-flight checks and results-folder errors of the CLI.

Every cell writes ``events.jsonl`` (train / trained / evaluate_only / done / failed, with host,
pid and time): the tests count training starts from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.contract.record import validate_record
from harness.storage.checkpoint import read_events
from tests.fixtures.machine_faults import fault_env

GRID = """
name: {name}
grid:
  datasets: [digits]
  backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
  seeds: [0, 1]
  methods:
    - single
    - {{name: deep_ensemble, M: [2]}}
recipe: {{epochs: {epochs}, batch_size: 128, lr: 0.05}}
evaluation: {{cost: false}}
"""


def write_grid(tmp_path: Path, name: str, epochs: int = 2) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(GRID).format(name=name, epochs=epochs))
    return path


def harness_cmd(suite: Path, results: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(results),
            "-q", *extra]  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_FAULT")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def records(folder: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/record.json")}


def train_starts(cell_dir: Path) -> list[dict]:
    return [e for e in read_events(cell_dir) if e["event"] == "train"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    """Metrics of one uninterrupted run of the 4-cell grid (6 epochs), keyed by cell id."""
    tmp = tmp_path_factory.mktemp("reference")
    suite = write_grid(tmp, "faults", epochs=6)
    out = subprocess.run(harness_cmd(suite, tmp / "results", "--executor", "inprocess"),
                         capture_output=True, text=True, env=clean_env(), timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    recs = records(tmp / "results" / "faults")
    assert len(recs) == 4 and all(r["status"] == "done" for r in recs.values())
    return {cid: r["metrics"] for cid, r in recs.items()}


def _wait_for(path: Path, proc: subprocess.Popen, what: str) -> None:
    """Until ``path`` exists; fails at once if ``proc`` exits first (a deadline only guards
    against a hang, the order is made by the holds)."""
    deadline = time.monotonic() + 300
    while not path.exists():
        assert proc.poll() is None, f"{what}: the run exited ({proc.returncode}) first"
        assert time.monotonic() < deadline, f"{what}: {path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_concurrent_runs_train_each_cell_once(tmp_path, reference):
    """Two runs of one suite at once, in an order the test makes (each is held after every
    epoch checkpoint while its flag file exists, ``HARNESS_FAULT_HOLD``), not one the clock
    happens to give: A holds cell 0, B finds it leased and takes cell 1, A (released) finds
    cell 1 leased by B and trains cells 2 and 3, B (released) finds them done. Every cell is
    trained once, by the run that leased it, and each run names the other as the owner of the
    cell it skipped."""
    from harness.config.parse import load_suite

    suite = write_grid(tmp_path, "faults", epochs=6)
    cells = [c.cell_id for c in load_suite(suite).cells()]
    results = tmp_path / "results"
    folder = results / "faults"
    cmd = harness_cmd(suite, results, "--executor", "inprocess")
    flags = {"a": tmp_path / "hold-a", "b": tmp_path / "hold-b"}
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str) -> subprocess.Popen:
        flags[name].touch()
        env = fault_env(clean_env(), HARNESS_FAULT_HOLD=f"checkpoint.pt:{flags[name]}")
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env)  # fmt: skip
        return procs[name]

    try:
        _wait_for(folder / cells[0] / "checkpoint.pt", start("a"), "A's first epoch of cell 0")
        _wait_for(folder / cells[1] / "checkpoint.pt", start("b"), "B's first epoch of cell 1")
        flags["a"].unlink()  # A finishes cell 0, skips cell 1 (B holds it), trains 2 and 3
        out_a, err_a = procs["a"].communicate(timeout=600)
        # A returns while B still holds cell 1: the grid is not complete, so status 1 and a
        # last line naming B; B returns after A finished cell 0, which it had skipped: 0.
        assert procs["a"].returncode == 1, err_a[-2000:]
        assert out_a.splitlines()[-1].startswith(
            f"not done here: 1 cell(s) held by another live run ({socket.gethostname()}:"
            f"{procs['b'].pid})"
        ), out_a[-2000:]
        flags["b"].unlink()  # B finishes cell 1 and finds 2 and 3 done
        out_b, err_b = procs["b"].communicate(timeout=600)
        assert procs["b"].returncode == 0, err_b[-2000:]
        assert "not done here" not in out_b
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    pid = {name: proc.pid for name, proc in procs.items()}
    recs = records(folder)
    assert set(recs) == set(cells) and all(r["status"] == "done" for r in recs.values())
    trainer = {}
    for cell_id in cells:
        starts = train_starts(folder / cell_id)
        assert [s["from_epoch"] for s in starts] == [0], (cell_id, starts)
        assert [e["event"] for e in read_events(folder / cell_id)].count("trained") == 1
        trainer[cell_id] = starts[0]["pid"]
    assert trainer == {cells[0]: pid["a"], cells[1]: pid["b"], cells[2]: pid["a"],
                       cells[3]: pid["a"]}  # fmt: skip
    # Each run named the cell the other held, with its owner (host:pid), and no other.
    skipped = {name: [x for x in out.splitlines() if x.startswith("skipped ")]
               for name, out in (("a", out_a), ("b", out_b))}  # fmt: skip
    assert [x.split(":")[0] for x in skipped["a"]] == [f"skipped {cells[1]}"], out_a
    assert skipped["a"][0].endswith(f":{pid['b']}"), out_a
    assert [x.split(":")[0] for x in skipped["b"]] == [f"skipped {cells[0]}"], out_b
    assert skipped["b"][0].endswith(f": done by {socket.gethostname()}:{pid['a']}"), out_b
    assert {c: r["metrics"] for c, r in recs.items()} == reference
    assert not list(folder.glob("*/lease.json"))


def _progress_stamps(folder: Path) -> dict[str, int]:
    """mtime_ns of every cell's checkpoint and record: changes when a run finishes an epoch or
    a cell (a resume only reads them)."""
    stamps = {}
    for path in [*folder.glob("*/checkpoint.pt"), *folder.glob("*/record.json")]:
        with contextlib.suppress(FileNotFoundError):  # replaced or set aside meanwhile
            stamps[str(path)] = path.stat().st_mtime_ns
    return stamps


# Kill targets: the N-th atomic write of a file in one process (the hook truncates the temporary
# file to half, then SIGKILLs the process), or an outside SIGKILL a random fraction of a second
# after the run's next checkpoint or record while every write sleeps 0.2 s (so random kills land
# inside writes too). Each attempt gets at most one cell further, whatever the machine's speed.
TARGETS = ["checkpoint.pt:1", "checkpoint.pt:2", "checkpoint.pt:2", "record.json:1",
           "final.pt:1", "trained.json:1", "random", "random"]  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_redoes_nothing(tmp_path, reference):
    rng = random.Random(16)
    suite = write_grid(tmp_path, "faults", epochs=6)
    results = tmp_path / "results"
    folder = results / "faults"
    cmd = harness_cmd(suite, results, "--executor", "inprocess")
    kills, log = 0, []
    for _attempt in range(40):
        target = rng.choice(TARGETS)
        kept = {c: json.dumps(r, sort_keys=True) for c, r in records(folder).items()
                if r["status"] == "done"}  # fmt: skip
        if target == "random":
            env = fault_env(clean_env(), HARNESS_FAULT_WRITE_SLEEP_S="0.2")
            before = _progress_stamps(folder)
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env, start_new_session=True)  # fmt: skip
            # Kill once the run has made progress (a checkpoint or record written) plus a random
            # fraction of a write's 0.2 s sleep — never after a fixed wall time, which lets a fast
            # machine finish the grid before enough kills happened (and a slow one kill only in
            # start-up).
            deadline = time.monotonic() + 300
            while (proc.poll() is None and _progress_stamps(folder) == before
                   and time.monotonic() < deadline):  # fmt: skip
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            env = fault_env(clean_env(), HARNESS_FAULT_KILL_WRITE=target)
            proc = subprocess.run(cmd, capture_output=True, env=env, timeout=600)
        log.append((target, proc.returncode))
        kills += proc.returncode == -signal.SIGKILL
        for rec in records(folder).values():
            validate_record(rec)  # whole and valid, whatever the moment of the kill
        after = {c: json.dumps(r, sort_keys=True) for c, r in records(folder).items()}
        assert all(after[c] == text for c, text in kept.items()), "a finished cell was redone"
        if kills >= 12 or len(after) == 4:
            break
    assert kills >= 10, log
    final = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=600)
    assert final.returncode == 0, final.stderr
    recs = records(folder)
    assert {c: r["metrics"] for c, r in recs.items()} == reference, log
    for cell_id in recs:
        events = [e["event"] for e in read_events(folder / cell_id)]
        assert events.count("trained") == 1, (cell_id, events)
        # Once training finished, only evaluation was ever redone.
        assert "train" not in events[events.index("trained") :], (cell_id, events)
    assert not list(folder.glob("*/.*.tmp")) and not list(folder.glob("*/lease.json"))


def test_evaluation_failing_after_training_is_retried_without_training(tmp_path, monkeypatch):
    from harness.config.parse import load_suite
    from harness.contract.record import read_record
    from harness.data._machinery.base import DataMissingError
    from harness.engine import runner
    from harness.engine.runner import run_cell

    cell = load_suite(write_grid(tmp_path, "faults", epochs=3)).cells()[0]
    clean = run_cell(cell, tmp_path / "clean", progress=False)
    real = runner.evaluate_all

    def data_gone(*args, **kwargs):
        raise DataMissingError("digits: test split file removed between phases")

    monkeypatch.setattr(runner, "evaluate_all", data_gone)
    failed = run_cell(cell, tmp_path, progress=False)
    assert failed["status"] == "failed" and failed["error"]["phase"] == "evaluate"
    assert failed["error"]["data_missing"] is True
    cell_dir = tmp_path / cell.cell_id
    assert (cell_dir / "final.pt").exists() and (cell_dir / "trained.json").exists()
    monkeypatch.setattr(runner, "evaluate_all", real)
    monkeypatch.setattr(runner, "train_cell", lambda *a, **k: pytest.fail("trained again"))
    retried = run_cell(cell, tmp_path, progress=False)
    assert retried["status"] == "done"
    assert retried["metrics"] == clean["metrics"]
    assert [h["epoch"] for h in retried["history"]] == [1, 2, 3]
    assert [e["event"] for e in read_events(cell_dir)] == [
        "train", "trained", "failed", "evaluate_only", "done"
    ]  # fmt: skip
    assert read_record(cell_dir) == retried


def test_failure_during_training_resumes_unless_divergence(tmp_path, monkeypatch):
    from harness.config.parse import load_suite
    from harness.engine import runner
    from harness.engine.runner import run_cell
    from harness.engine.train import DivergenceError

    cell = load_suite(write_grid(tmp_path, "faults", epochs=2)).cells()[0]
    real, calls = runner.train_epoch, {"n": 0}

    def fail_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("CUDA error: an illegal memory access")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", fail_second)
    assert run_cell(cell, tmp_path, progress=False)["error"]["phase"] == "train"
    cell_dir = tmp_path / cell.cell_id
    assert (cell_dir / "checkpoint.pt").exists()  # kept for the retry
    monkeypatch.setattr(runner, "train_epoch", real)
    assert run_cell(cell, tmp_path, progress=False)["status"] == "done"
    assert [s["from_epoch"] for s in train_starts(cell_dir)] == [0, 1]  # resumed, not redone

    other = tmp_path / "diverged"

    def diverge_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise DivergenceError("training loss became nan at step 3 of this epoch")
        return real(*args, **kwargs)

    calls["n"] = 0
    monkeypatch.setattr(runner, "train_epoch", diverge_second)
    assert run_cell(cell, other, progress=False)["error"]["type"] == "DivergenceError"
    monkeypatch.setattr(runner, "train_epoch", real)
    assert run_cell(cell, other, progress=False)["status"] == "done"
    assert [s["from_epoch"] for s in train_starts(other / cell.cell_id)] == [0, 0]


@pytest.mark.slow
def test_ctrl_c_stops_the_local_executor(tmp_path):
    """SIGINT to the parent only (``kill -INT``, the harder case than a terminal's Ctrl-C, which
    reaches the workers too): no cell starts afterwards and the run exits 130 promptly."""
    suite = tmp_path / "ctrlc.yaml"
    suite.write_text(
        textwrap.dedent(GRID)
        .format(name="ctrlc", epochs=200)
        .replace("seeds: [0, 1]", "seeds: [0, 1, 2]")
    )
    results = tmp_path / "results"
    # Held after each epoch checkpoint while this file exists: no cell can finish before the
    # SIGINT, however fast the machine.
    hold = tmp_path / "hold"
    hold.touch()
    cmd = harness_cmd(suite, results, "--executor", "local", "--workers", "2", "--threads", "1")
    # PYTHONFAULTHANDLER: if the run hangs after SIGINT (seen in CI on a loaded machine, never
    # reproduced alone), SIGABRT to its process group makes the parent and the workers print
    # every thread's stack. Output goes to files, not pipes: workers inherit the descriptors,
    # and a pipe a live worker holds never reaches EOF, so the stacks would be lost.
    out_file, err_file = (tmp_path / "out.txt").open("w"), (tmp_path / "err.txt").open("w")
    proc = subprocess.Popen(cmd, stdout=out_file, stderr=err_file, text=True,
                            start_new_session=True,
                            env=fault_env({**clean_env(), "PYTHONFAULTHANDLER": "1"},
                                          HARNESS_FAULT_HOLD=f"checkpoint.pt:{hold}"))  # fmt: skip
    folder = results / "ctrlc"
    # Both workers held at their first epoch boundary: from here until SIGINT nothing can
    # start, finish or write, whatever the machine's speed (a deadline only guards a hang).
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(folder.glob("*/checkpoint.pt"))) < 2:
        assert proc.poll() is None, _tail(tmp_path)
        time.sleep(0.1)
    assert len(list(folder.glob("*/checkpoint.pt"))) == 2, "workers never held"
    started = {d.name: train_starts(d) for d in folder.iterdir() if d.is_dir()}
    assert sorted(len(s) for s in started.values()) == [1, 1], started
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    # Released now: were the interrupt not acted on, the workers would go on to finish their
    # cells and the third one would start.
    hold.unlink()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"no exit 60 s after SIGINT; the stacks:\n{_tail(tmp_path)}")
    out_file.close(), err_file.close()
    err = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 130, err[-2000:]
    assert time.monotonic() - sent < 30  # promptly: well inside the executor's 20 s grace
    assert "interrupted" in err
    # Nothing started after SIGINT: the same two cells, each started once, the third never.
    assert {d.name: train_starts(d) for d in folder.iterdir() if d.is_dir()} == started
    assert not list(folder.glob("*/record.json"))  # none finished, none half-written
    assert not list(folder.glob("*/.*.tmp")) and not list(folder.glob("*/lease.json"))


def _tail(folder: Path, n: int = 8000) -> str:
    return (folder / "err.txt").read_text()[-n:]


# ----------------------------------------------------------------- pre-flight and folder errors


def run_cli(*argv: str) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, "-m", "harness.cli", *argv], capture_output=True,
                         text=True, env=clean_env(), timeout=300)  # fmt: skip
    return out.returncode, out.stdout, out.stderr


@pytest.mark.slow
def test_preflight_rejects_bad_recipes_and_empty_grids(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        textwrap.dedent(GRID)
        .format(name="bad", epochs=4)
        .replace("lr: 0.05}", "lr: 0.05, schedule: multistep, milestones: [3, 2, 4]}")
        .replace(
            "{name: deep_ensemble, M: [2]}",
            "{name: deep_ensemble, M: [2], recipe: {epochs: 10, milestones: [5, 12]}}",
        )
    )
    rc, _, err = run_cli("validate", str(bad), "--skip-data")
    assert rc == 2
    assert f"{bad}: recipe.milestones: [4] not inside (0, epochs=4)" in err
    assert f"{bad}: recipe.milestones: [3, 2, 4] must be strictly increasing" in err
    assert f"{bad}: grid.methods[1].recipe.milestones: [12] not inside (0, epochs=10)" in err
    rc, out, err = run_cli("run", str(bad), "--results", str(tmp_path / "r"))
    assert rc == 2 and "must be strictly increasing" in err, (out, err)
    assert not (tmp_path / "r").exists()  # nothing started

    missing = tmp_path / "missing.yaml"
    missing.write_text(
        textwrap.dedent(GRID)
        .format(name="missing", epochs=1)
        .replace("- single", f"- {{name: sigma_ens, hparams: {{pretrained: {tmp_path}/no.pt}}}}")
    )
    rc, _, err = run_cli("validate", str(missing))
    assert rc == 2 and f"grid.methods[0].hparams.pretrained: no file {tmp_path}/no.pt" in err
    rc, _, err = run_cli("validate", str(missing), "--skip-data")  # weights are data too
    assert rc == 0, err


def test_empty_grid_is_an_error(tmp_path):
    from harness.config.includes import SuiteError
    from harness.config.parse import load_suite

    path = write_grid(tmp_path, "empty")
    text = path.read_text().replace("seeds: [0, 1]", "seeds: []")
    path.write_text(text)
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert info.value.problems == [f"{path}: grid.seeds: is empty, so the grid expands to 0 cells"]


@pytest.mark.slow
def test_commands_reading_a_results_folder_fail_clearly(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "suite.json").write_text(json.dumps({"current": [], "cells": {}}))
    for argv, needle in [
        (("report", str(tmp_path / "nope")), "no such results folder"),
        (("status", str(tmp_path / "nope")), "no such results folder"),
        (("evaluate", str(tmp_path / "nope")), "no such results folder"),
        (("report", str(empty)), "holds no records yet"),
        (("evaluate", str(empty)), "holds no records yet"),
        (("status", str(tmp_path)), "holds no suite.json"),
        (("validate", str(tmp_path)), "is a directory; give a suite YAML file"),
    ]:
        rc, out, err = run_cli(*argv)
        assert rc == 2, (argv, out, err)
        assert needle in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert "Traceback" not in err


def test_the_parent_defers_ctrl_c_to_a_safe_point():
    """While the local executor waits on its pools, SIGINT only sets a flag (the loop raises
    KeyboardInterrupt between waits, holding no pool lock); the handler before is restored."""
    from harness.executors.interrupt import deferred_stop

    before = signal.getsignal(signal.SIGINT)
    with deferred_stop() as interrupted:
        assert not interrupted.is_set()
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt here otherwise
        deadline = time.monotonic() + 5
        while not interrupted.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert interrupted.is_set()
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt, match="stop"), deferred_stop():
        raise KeyboardInterrupt("stop")  # still propagates, and the handler comes back
    assert signal.getsignal(signal.SIGINT) is before
