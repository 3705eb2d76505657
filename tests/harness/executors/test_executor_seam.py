"""The executor seam: each executor declares the options it reads and whether its cells run
here, returns its records and its messages in a :class:`RunOutcome`, and owns ``force``; the
CLI picks one by name and prints. No cluster needed: the Slurm task's ``force`` is checked by
calling it with the runner stubbed (tests/harness/executors/test_slurm_executor.py runs it on the
local cluster).
"""

from __future__ import annotations

from typing import ClassVar

import pytest

import harness.executors as executors
from harness.cli import main
from harness.config.parse import load_suite
from harness.executors import options_read, runs_here
from harness.executors.base import ExecutorOptions, RunOutcome
from harness.session.checks import run_flag_problems

SUITE = """
name: seam
grid: {datasets: [digits], backbones: [digits_cnn], methods: [single], M: [1], seeds: [0, 1]}
recipe: {epochs: 1, batch_size: 64, lr: 0.05}
evaluation: {cost: false}
"""


class Scheduler:
    """An executor of a fake scheduler: reads only ``wait``, hands the cells over."""

    name = "scheduler"
    reads = ("wait", "progress")
    runs_here = False
    seen: ClassVar[dict] = {}

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options

    def describe(self, n_cells: int) -> str:
        return f"handing {n_cells} cells to the fake scheduler"

    def run(self, cells, results_dir, data_root, force) -> RunOutcome:
        Scheduler.seen = {"cells": len(cells), "force": force, "data_root": data_root}
        return RunOutcome(finished=False, messages=["queued as job 42"])


@pytest.fixture
def scheduler(monkeypatch):
    """``--executor scheduler``, registered the one way an executor is added: one table line."""
    import sys
    import types

    module = types.ModuleType("fake_scheduler_executor")
    module.Scheduler = Scheduler
    monkeypatch.setitem(sys.modules, "fake_scheduler_executor", module)
    executors.EXECUTORS.names()  # the built-ins loaded; the added one undone after the test
    monkeypatch.setattr(executors.EXECUTORS, "_items", dict(executors.EXECUTORS._items))
    executors.register_executor("scheduler", "fake_scheduler_executor:Scheduler")
    Scheduler.seen = {}
    return Scheduler


def test_each_executor_declares_the_options_it_reads():
    assert options_read("inprocess") == {"threads", "progress", "trackers"}
    assert options_read("local") == {
        "workers", "threads", "gpus", "cells_per_gpu", "progress", "trackers"
    }  # fmt: skip
    assert options_read("slurm") == {"profile", "slurm_overrides", "wait", "progress", "trackers"}
    assert options_read("auto") == options_read("inprocess") | options_read("local")
    assert runs_here("auto") and runs_here("local") and not runs_here("slurm")


def test_flag_problems_follow_the_declarations(scheduler):
    from harness.storage.tracker_options import TrackerOptions

    # --wait is the fake scheduler's (it declares it), --profile only the Slurm executor's.
    options = ExecutorOptions(profile="p.yaml", wait=True)
    assert run_flag_problems("scheduler", options) == [
        "--profile: only for --executor slurm; --executor scheduler does not use it"
    ]
    assert run_flag_problems("local", ExecutorOptions(wait=True)) == [
        "--wait: only for --executor slurm or scheduler; --executor local does not use it"
    ]
    # Trackers would be dropped by an executor that does not hand them to its cells.
    mlflow = ExecutorOptions(trackers=TrackerOptions(names=("mlflow",)))
    assert run_flag_problems("scheduler", mlflow) == [
        "--logger: only for --executor auto or inprocess or local or slurm; --executor "
        "scheduler does not use it"
    ]
    assert run_flag_problems("local", mlflow) == []


def test_the_cli_prints_what_the_executor_returns_and_passes_force(
    scheduler, write_suite, tmp_path, capsys
):
    path = write_suite(SUITE)
    argv = ["run", str(path), "--executor", "scheduler", "--wait", "--results", str(tmp_path)]
    assert main([*argv, "--force", "-q"]) == 0
    out = capsys.readouterr().out
    assert "handing 2 cells to the fake scheduler" in out
    assert "queued as job 42" in out
    assert "finished in" not in out  # handed over: no summary of cells still running
    assert scheduler.seen == {"cells": 2, "force": True, "data_root": None}
    assert main([*argv, "--data-root", str(tmp_path / "d"), "-q"]) == 0
    assert scheduler.seen["force"] is False
    assert scheduler.seen["data_root"] == (tmp_path / "d").resolve()


def test_slurm_task_forces_its_first_attempt_only(monkeypatch, write_suite, tmp_path):
    """``harness run --executor slurm --force``: each task redoes its cell, but an attempt after
    a requeue (restart count > 0, or the submission ``checkpoint`` makes) resumes instead."""
    import harness.engine.runner as runner
    from harness.executors.slurm.submit import CellTask

    forced: list[bool] = []

    def fake_run_cell(
        cell, results_dir, data_root, force=False, progress=True, shared=False, trackers=None
    ):
        forced.append(force)
        return {"cell_id": cell.cell_id, "status": "done"}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    cell = load_suite(write_suite(SUITE)).cells()[0]
    args = (cell.to_json(), str(tmp_path), None)
    task = CellTask(force=True)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert task(*args) == {"cell_id": cell.cell_id, "status": "done"}
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # Slurm requeued the same submission
    task(*args)
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    again = task.checkpoint(*args)  # submitit's requeue after a time limit or preemption
    again.function(*again.args, **again.kwargs)
    CellTask()(*args)
    assert forced == [True, False, False, False]


def test_an_installed_distributions_executor_is_found_by_its_entry_point(monkeypatch):
    """``[project.entry-points."harness.executors"] name = "module:Class"``: listed and picked
    by name, its module imported only when it is picked; a second registration of a name is
    refused."""
    import sys
    import types

    from harness.executors import executor_class, executor_listing, register_executor
    from harness.executors.devices import ExecutorError

    executors.EXECUTORS.names()  # the built-ins loaded, then a copy the test may change
    monkeypatch.setattr(executors.EXECUTORS, "_items", dict(executors.EXECUTORS._items))
    # an installed distribution's entry point: its value registered, its module not imported
    monkeypatch.setitem(executors.EXECUTORS._items, "faraway", "faraway_executor:Scheduler")
    monkeypatch.setattr(executors, "_entry_point_targets",
                        lambda: {"faraway": "faraway_executor:Scheduler"})  # fmt: skip
    assert ("faraway", "faraway_executor:Scheduler (entry point)") in executor_listing()
    assert "faraway_executor" not in sys.modules  # listed without importing it
    module = types.ModuleType("faraway_executor")
    module.Scheduler = Scheduler
    monkeypatch.setitem(sys.modules, "faraway_executor", module)
    assert executor_class("faraway") is Scheduler
    assert runs_here("faraway") is False and options_read("faraway") == {"wait", "progress"}
    with pytest.raises(ExecutorError, match="executor 'local' is already registered"):
        register_executor("local", Scheduler)
    register_executor("mine", Scheduler)
    register_executor("mine", Scheduler)  # the same class again (a module imported twice): fine
    with pytest.raises(ExecutorError, match="executor 'mine' is already registered"):
        register_executor("mine", "elsewhere:Other")
