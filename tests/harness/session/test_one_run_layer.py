"""One run layer below both faces (issue 60, item 1): ``harness run`` and :func:`harness.api.run`
call :func:`harness.session.run_suite`, which parses the suite once, prints nothing and returns
a :class:`harness.session.RunResult`; both faces leave identical records (less the times and
the machine's description, which differ between any two runs)."""

from __future__ import annotations

import json
import os
import socket
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.api as h
import harness.config.parse as parse
import harness.session.run as session_run
from harness.cli import main
from harness.contract import read_record
from harness.session import CellFailure, RunOptions, RunResult, SkippedCell, Validation
from tests.misuse import TINY_SUITE

#: Record keys that differ between two runs of the same cell: when it ran, how long each part
#: took (any key ending in ``_s``), and the machine it ran on.
VARYING = {"started_at", "finished_at", "timings", "environment"}


def _stable(value):
    """``value`` less :data:`VARYING` and every ``*_s`` duration, at any depth."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()
                if k not in VARYING and not k.endswith("_s")}  # fmt: skip
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _records(folder) -> dict[str, dict]:
    return {p.name: read_record(p) for p in folder.iterdir() if (p / "record.json").exists()}


@pytest.fixture
def spies(monkeypatch):
    """Counts the suite parses and keeps each run's result."""
    seen = SimpleNamespace(parses=0, results=[])
    real_load, real_run = parse.load_suite, session_run.run_suite

    def load(*args, **kwargs):
        seen.parses += 1
        return real_load(*args, **kwargs)

    def run(suite, options, on_start=None):
        seen.results.append(real_run(suite, options, on_start))
        return seen.results[-1]

    monkeypatch.setattr(parse, "load_suite", load)
    monkeypatch.setattr(session_run, "run_suite", run)
    return seen


@pytest.mark.slow  # trains a grid twice (~14 s): CI runs it, the default run stays fast
def test_the_api_and_the_command_line_leave_identical_records(tmp_path, capsys, spies):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(textwrap.dedent(TINY_SUITE))
    out = h.run(suite, executor="inprocess", results=tmp_path / "api")
    assert capsys.readouterr().out == ""  # the run layer prints nothing; h.run hands it back
    assert spies.parses == 1  # the suite is parsed once per call
    argv = ["run", str(suite), "--executor", "inprocess", "-q", "--results", str(tmp_path / "cli")]
    assert main(argv) == 0
    assert spies.parses == 2
    printed = capsys.readouterr().out  # the command line renders the same result
    assert printed.startswith(f"suite 'tiny': 2 cells, 0 already done, 2 to run → {tmp_path}")
    assert "running 2 cells in this process" in printed and "finished in" in printed
    api_result, cli_result = spies.results
    assert out is api_result and isinstance(out, RunResult) and out.exit_code == 0
    assert out.results_dir == tmp_path / "api" / "tiny"
    assert out.leaderboard == out.results_dir / "leaderboard.html"
    for result in (api_result, cli_result):
        assert sorted(result.done) == sorted(c.cell_id for c in result.cells)
        assert (result.skipped, result.failed, result.pending) == ([], [], [])
        assert result.finished and not result.halted and result.plan is None
    api, cli = _records(tmp_path / "api" / "tiny"), _records(tmp_path / "cli" / "tiny")
    assert sorted(api) == sorted(cli) == sorted(out.done)
    for cid, rec in api.items():
        assert rec["status"] == "done"
        assert _stable(rec) == _stable(cli[cid]), cid
        assert rec["timings"].keys() == cli[cid]["timings"].keys()
        for name in ("cell.json", "trained.json"):
            cell_dir = out.results_dir / cid
            other = tmp_path / "cli" / "tiny" / cid / name
            assert _stable(json.loads((cell_dir / name).read_text())) == _stable(
                json.loads(other.read_text())
            ), name

    # Again: nothing to train, every cell skipped as done; a dry run is a plan.
    again = h.run(suite, executor="inprocess", results=tmp_path / "api")
    assert again.done == [] and again.todo == [] and again.exit_code == 0
    assert [(s.kind, s.reason) for s in again.skipped] == [("done", "done")] * 2
    dry = RunOptions(executor="inprocess", results=tmp_path / "api", dry_run=True)
    plan = session_run.run_suite(suite, dry).plan  # the same layer, asked for a plan
    assert [(p.verdict, p.why) for p in plan] == [("skip", "done")] * 2
    assert capsys.readouterr().out == ""


def test_a_validation_parses_once_and_hands_the_suite_back(tmp_path, spies):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(textwrap.dedent(TINY_SUITE))
    checked = h.validate(suite, only=["method=single"], check_data=False)
    assert spies.parses == 1
    assert isinstance(checked, Validation) and checked.suite == "tiny"
    assert [c.method for c in checked.cells] == ["single"] and checked.grid_cells == 2
    assert list(checked.definition.grid.datasets) == ["digits"]


def _cells(*ids):
    return [SimpleNamespace(cell_id=i, label=f"label-{i}") for i in ids]


def test_the_result_says_what_became_of_each_cell():
    """From the executor's records: done, leased by another process, failed with the record's
    reason; a cell without a record is pending; the exit status both faces report."""
    from harness.executors.base import RunOutcome
    from harness.session.result import RunStart

    cells = _cells("a", "b", "c", "d", "e")
    start = RunStart("s", Path("/r/s"), cells, cells[1:], "x")
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    error = {"type": "DivergenceError", "message": "loss is nan", "phase": "train"}
    records = [
        {"cell_id": "b", "status": "done"},
        {"cell_id": "c", "status": "leased", "lease": owner},
        {"cell_id": "d", "status": "failed", "error": error},
    ]
    result = session_run._result(start, RunOutcome(finished=True, records=records), 1.5)
    assert result.results_dir == Path("/r/s") and result.seconds == 1.5
    assert result.done == ["b"] and result.pending == ["e"]
    assert result.skipped[0] == SkippedCell("a", "label-a", "done", "done")
    assert result.skipped[1].kind == "leased" and str(os.getpid()) in result.skipped[1].reason
    assert result.failed == [
        CellFailure("d", "label-d", "DivergenceError", "loss is nan", "train", False)
    ]
    assert result.exit_code == 1
    missing = dict(records[2], error=dict(error, type="DataMissingError", data_missing=True))
    data = session_run._result(start, RunOutcome(finished=True, records=[missing]), 0.0)
    assert data.exit_code == 2  # the user's to fix, as when found before the run
    metric = dict(records[2], error=dict(error, type="MetricError"))
    assert session_run._result(start, RunOutcome(True, [metric]), 0.0).exit_code == 2
    halted = session_run._result(start, RunOutcome(True, records[:1], halted=True), 0.0)
    assert halted.exit_code == 1 and halted.pending == ["c", "d", "e"]
    handed = session_run._result(start, RunOutcome(finished=False, messages=["job 7"]), 0.0)
    assert handed.exit_code == 0 and handed.messages == ["job 7"]


def test_the_command_line_renders_a_failed_cell_from_the_result(tmp_path, capsys, monkeypatch):
    """The exit status is the result's; the table and the FAILED lines are the summary's."""
    from harness.cli.run import render_result

    monkeypatch.setattr("harness.cli.run.summary_or_full_disk", lambda results: 0)
    failed = CellFailure("d", "label-d", "DivergenceError", "loss is nan", "train")
    leased = SkippedCell("c", "label-c", "leased", "leased by host:1")
    result = RunResult("s", tmp_path, _cells("c", "d"), _cells("c", "d"), "x",
                       failed=[failed], skipped=[leased], messages=["m"], seconds=2.0)  # fmt: skip
    assert render_result(result) == 1
    assert capsys.readouterr().out.splitlines() == [
        "m",
        "finished in 2.0 s",
        "skipped c: leased by host:1",
        "not done here: 1 cell(s) held by another live run (host:1); "
        f"`harness status {tmp_path}` follows them, and this command again prints the whole "
        "table once they are done",
    ]


def test_a_run_that_leaves_cells_to_another_live_run_exits_1_and_says_so_last(
    tmp_path, capsys, monkeypatch
):
    """Every cell this run reached is done, but another live process holds two: the grid is not
    complete when the command returns (`harness run && harness report` would report a partial
    grid), so the status is 1 and the last line names what is left and who holds it."""
    from harness.cli.run import render_result

    monkeypatch.setattr("harness.cli.run.summary_or_full_disk", lambda results: 0)
    cells = _cells("a", "b", "c")
    held = [SkippedCell(c, f"label-{c}", "leased", f"leased by gpu7:{pid}")
            for c, pid in (("b", 11), ("c", 12))]  # fmt: skip
    result = RunResult("s", tmp_path, cells, cells, "x", done=["a"], skipped=held)
    assert result.exit_code == 1 and [s.cell_id for s in result.leased] == ["b", "c"]
    assert render_result(result) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("not done here: 2 cell(s) held by another live run (gpu7:11, gpu7:12)")
    done_before = [SkippedCell("b", "label-b", "done", "done")]
    complete = RunResult("s", tmp_path, cells, cells[:1], "x", done=["a"], skipped=done_before)
    assert complete.exit_code == 0 and complete.leased == []
    assert render_result(complete) == 0
    assert "not done here" not in capsys.readouterr().out


def test_done_cells_evaluated_otherwise_than_the_suite_now_asks_get_a_note(tiny_finished):
    """A suite that gained an OOD set said "0 to run" and nothing else: the done cells keep
    their records (the evaluation is not part of a cell's id), and the note says which
    settings differ and the command that brings them to the suite's."""
    from harness.cli.run import evaluation_notes
    from harness.config.parse import load_suite
    from harness.session.result import RunStart

    suite, results = tiny_finished

    def notes(*overrides: str) -> list[str]:
        cells = load_suite(suite, list(overrides)).cells()
        return evaluation_notes(RunStart("tiny", results, cells, [], "x"), "tiny.yaml")

    assert notes() == []
    (ood,) = notes("evaluation.ood=[digits_heldout, sklearn_photos]")
    assert ood.startswith("note: 2 done cells (e.g. ")
    assert ood.endswith(
        "were evaluated with other settings than this suite's (evaluation: ood); left as they "
        f"are: harness evaluate {results} --suite tiny.yaml re-evaluates them from their saved "
        "weights (no retraining)"
    )
    (limit,) = notes("evaluation.limit=50")
    assert "were scored on the whole test set, this suite asks for evaluation.limit=50" in limit
