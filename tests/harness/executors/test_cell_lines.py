"""Progress inside every cell, in every executor (issue 60, item 5): the process that trains a
cell keeps its heartbeat (``live.json``) and its ``progress.csv``; the executor's loop shows
one line per running cell beneath the bar over cells, a live line on a terminal, a line per
finished epoch elsewhere, none with ``-q``; ``harness status`` shows the heartbeat of a running
cell."""

from __future__ import annotations

import json
import os
import re
import socket
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.parse import load_suite
from harness.executors.live import CellLines, line_mode
from harness.storage.live import Heartbeat
from harness.storage.progress import ProgressLog

SUITE = """
name: lines
grid:
  datasets: [digits]
  backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
  methods: [single]
  M: [1]
  seeds: [0, 1]
recipe: {{epochs: {epochs}, batch_size: 64, lr: 0.05}}
evaluation: {{cost: false}}
"""


def prefix(cell) -> str:
    return f"  {cell.cell_id[:6]} {cell.label}"


def test_worker_executor_shows_each_cells_epochs_in_the_parents_output(
    tmp_path, monkeypatch, capsys
):
    """Two cells in two worker processes: the parent's standard error holds a line per epoch of
    each (read from the cells' progress.csv, so none is missed however short the epoch), the
    workers none of their own."""
    suite = tmp_path / "lines.yaml"
    suite.write_text(textwrap.dedent(SUITE).format(epochs=3))
    monkeypatch.setenv("HARNESS_PROGRESS", "epochs")  # the lines wherever the output goes
    args = ["run", str(suite), "--results", str(tmp_path / "results"), "--executor", "local",
            "--workers", "2", "--threads", "1"]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err.replace("\r", "\n")  # the bar over cells redrawn between
    cells = load_suite(suite).cells()
    assert len(cells) == 2
    for cell in cells:
        line = rf"^{re.escape(prefix(cell))}  epoch (\d)/3  loss \d+\.\d{{3}}  train acc [01]\."
        shown = re.findall(line, err, re.M)
        assert shown == ["1", "2", "3"], err  # each epoch once, in order
    assert "step " not in err  # never a line per step off a terminal
    # Once the record is written, nothing works on the cell: its heartbeat is gone.
    assert not list((tmp_path / "results" / "lines").glob("*/live.json"))


def test_quiet_shows_no_cell_lines(tmp_path, monkeypatch, capsys):
    suite = tmp_path / "lines.yaml"
    suite.write_text(textwrap.dedent(SUITE).format(epochs=1))
    monkeypatch.setenv("HARNESS_PROGRESS", "live")
    args = ["run", str(suite), "--results", str(tmp_path / "results"), "--executor", "inprocess",
            "--threads", "1", "-q", "--only", "seed=0"]  # fmt: skip
    assert main(args) == 0
    assert "epoch" not in capsys.readouterr().err


def test_line_mode_follows_the_terminal_the_variable_and_quiet(monkeypatch):
    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    monkeypatch.delenv("HARNESS_PROGRESS", raising=False)
    assert line_mode(True, Stream(True)) == "live"
    assert line_mode(True, Stream(False)) == "epochs"  # a CI log: a line per epoch
    assert line_mode(False, Stream(True)) is None  # -q, or the Python face's default
    for value, tty, mode in [("live", False, "live"), ("epochs", True, "epochs"),
                             ("off", True, None), ("auto", True, "live")]:  # fmt: skip
        monkeypatch.setenv("HARNESS_PROGRESS", value)
        assert line_mode(True, Stream(tty)) == mode, value
    assert line_mode(False, Stream(False)) is None
    monkeypatch.setenv("HARNESS_PROGRESS", "loud")
    from harness.contract.env import EnvError

    with pytest.raises(EnvError, match=r"HARNESS_PROGRESS='loud': not a known value; allowed: "
                       r"auto, live, epochs, off"):  # fmt: skip
        line_mode(True, Stream(True))


def fabricated(tmp_path: Path, epochs: int = 5) -> tuple[Path, list]:
    """A results folder of two cells, neither run."""
    path = tmp_path / "lines.yaml"
    path.write_text(textwrap.dedent(SUITE).format(epochs=epochs))
    suite = load_suite(path)
    from harness.executors.base import write_manifest

    results = tmp_path / "results"
    write_manifest(suite, results)
    for cell in suite.cells():
        (results / cell.cell_id).mkdir()
    return results, suite.cells()


def test_live_lines_show_epoch_step_loss_eta_and_the_evaluations_batches(
    tmp_path, monkeypatch, capsys
):
    """The terminal's lines, from the heartbeats a worker writes: one per running cell, cut to
    the terminal's width (a wrapped line would break the lines below it)."""
    monkeypatch.setenv("COLUMNS", "150")  # standard error is no terminal here
    results, (a, b) = fabricated(tmp_path)
    clock = iter(float(t) for t in range(100))
    beat = Heartbeat(results / a.cell_id, every_s=1.0, clock=lambda: next(clock))
    beat.training(0, 5, 40)
    beat.begin_epoch(1)
    for _ in range(12):
        beat.update(1)
    beat.set_postfix(loss="0.500")
    beat.update(0)  # written: the clock moves a second a call
    other = Heartbeat(results / b.cell_id, every_s=1.0)
    other.evaluating("clean", 3, 10, 1, 5)
    lines = CellLines(results, "live")
    lines.show([a, b])
    lines.close()
    err = capsys.readouterr().err
    assert re.search(
        rf"{re.escape(prefix(a))}  epoch 2/5  step 12/40  loss 0\.500  ETA \dm\d\ds", err
    ), err
    assert f"{prefix(b)}  evaluating: clean 3/10 batches (pass 2/5)" in err, err
    monkeypatch.setenv("COLUMNS", "60")
    lines = CellLines(results, "live")
    lines.show([a])
    lines.close()
    err = capsys.readouterr().err
    full = f"{prefix(a)}  epoch 2/5  step 12/40  loss 0.500"
    assert full[:59] + "\x1b[A" in err and full[:60] not in err, err  # 59 columns, the cursor's


def test_epoch_lines_skip_a_resumed_cells_earlier_epochs(tmp_path):
    results, (a, _) = fabricated(tmp_path)
    folder = results / a.cell_id
    log = ProgressLog(folder, 0, 5, "cpu")
    log.write({"epoch": 1, "train_loss": 2.0, "train_acc": 0.25, "time_s": 1.0})
    said: list[str] = []
    lines = CellLines(results, "epochs", write=said.append)
    lines.started(a)  # resumed after epoch 1: that line was shown by the run that trained it
    log.write({"epoch": 2, "train_loss": 1.5, "train_acc": 0.5, "time_s": 1.0, "val_acc": 0.625})
    lines.show([a])
    lines.show([a])  # nothing new: nothing said
    log.write({"epoch": 3, "train_loss": 1.0, "train_acc": 0.75, "time_s": 1.0})
    log.close()
    Heartbeat(folder).evaluating("calibration fit", 0, None, 0, 3)
    lines.finished(a)
    lines.show([a])  # a redraw racing the cell's end says nothing more
    assert said == [
        f"{prefix(a)}  epoch 2/5  loss 1.500  val acc 0.625  ETA 0m03s",
        f"{prefix(a)}  epoch 3/5  loss 1.000  train acc 0.750  ETA 0m02s",
        f"{prefix(a)}  evaluating",
    ]


def test_status_shows_a_running_cells_heartbeat(tmp_path, capsys):
    """``harness status`` on a folder with a running cell (a live lease of this host's, as a
    local worker holds) whose heartbeat is fresh: its epoch, step, loss and ETA; then, while it
    evaluates, its pass and batch."""
    results, (a, _) = fabricated(tmp_path)
    folder = results / a.cell_id
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "token": "t",
             "started": "2026-12-01T10:00:00+0000"}  # fmt: skip
    (folder / "lease.json").write_text(json.dumps(owner))
    log = ProgressLog(folder, 0, 5, "cpu")
    log.write({"epoch": 1, "train_loss": 2.0, "train_acc": 0.25, "time_s": 30.0, "val_acc": 0.5})
    log.close()
    clock = iter(float(t) for t in range(100))
    beat = Heartbeat(folder, every_s=1.0, clock=lambda: next(clock))
    beat.training(1, 5, 40)
    beat.begin_epoch(1)
    beat.set_postfix(loss=0.412)
    beat.update(12)
    assert main(["status", str(results)]) == 0
    out = capsys.readouterr().out
    assert re.search(
        rf"^running  {a.cell_id}  {re.escape(a.label)}  \[inprocess cpu, epoch 2/5, step 12/40, "
        r"loss 0\.412, val acc 0\.500, ETA \dm\d\ds\]$",
        out,
        re.M,
    ), out
    beat.evaluating("OOD: digits_hard_heldout", 7, 9, 4, 6)
    assert main(["status", str(results)]) == 0
    out = capsys.readouterr().out
    assert (
        "[inprocess cpu, epoch 1/5, val acc 0.500, evaluating: OOD: digits_hard_heldout "
        "7/9 batches (pass 5/6)]" in out
    ), out
    (folder / "lease.json").unlink()  # the process is gone: its heartbeat is not shown
    assert main(["status", str(results)]) == 0
    assert "step" not in capsys.readouterr().out


def test_in_process_executor_shows_the_same_lines(tmp_path, monkeypatch, capsys):
    suite = tmp_path / "lines.yaml"
    suite.write_text(textwrap.dedent(SUITE).format(epochs=2))
    monkeypatch.setenv("HARNESS_PROGRESS", "epochs")
    args = ["run", str(suite), "--results", str(tmp_path / "results"), "--executor", "inprocess",
            "--threads", "1", "--only", "seed=0"]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    (cell,) = [c for c in load_suite(suite).cells() if c.seed == 0]
    assert re.findall(rf"^{re.escape(prefix(cell))}  epoch (\d)/2", err, re.M) == ["1", "2"], err
    assert "step/s" not in err  # the cell's own step bar is not drawn


def test_slurm_wait_shows_the_epochs_of_the_tasks_that_run(tmp_path, monkeypatch, capsys):
    """``--executor slurm --wait``: between two polls, the cells whose task works on them (a
    lease or a heartbeat in the shared folder) show their epochs; a queued task's cell none."""
    from harness.executors.slurm import submit

    results, (a, b) = fabricated(tmp_path, epochs=2)
    monkeypatch.setenv("HARNESS_PROGRESS", "epochs")
    monkeypatch.setattr("harness.executors.live.REFRESH_S", 0.0)

    class Job:
        def __init__(self, polls: int) -> None:
            self.polls = polls

        def done(self, force_check: bool = False) -> bool:
            self.polls -= 1
            return self.polls < 0

    (results / a.cell_id / "lease.json").write_text("{}")  # a's task has started
    log = ProgressLog(results / a.cell_id, 0, 2, "cpu")
    sleeps = []

    def sleep(s: float) -> None:  # a's epochs land between two polls, then its evaluation
        sleeps.append(s)
        if len(sleeps) == 1:
            log.write({"epoch": 1, "train_loss": 1.0, "train_acc": 0.5, "time_s": 1.0})
        if len(sleeps) == 2:
            log.write({"epoch": 2, "train_loss": 0.5, "train_acc": 0.75, "time_s": 1.0})
            Heartbeat(results / a.cell_id).evaluating("clean", 1, 2, 0, 1)

    monkeypatch.setattr(submit.time, "sleep", sleep)
    submit.wait_jobs([Job(3), Job(1)], poll_s=0.0, cells=[a, b], results_dir=results)
    log.close()
    err = capsys.readouterr().err.replace("\r", "\n")
    assert re.findall(rf"^{re.escape(prefix(a))}  (epoch \d/2|evaluating)", err, re.M) == [
        "epoch 1/2", "epoch 2/2", "evaluating"
    ], err  # fmt: skip
    assert prefix(b) not in err  # queued, then done without a row: nothing to say
