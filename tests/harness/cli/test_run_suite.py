"""One way to run a suite: ``harness run`` and :func:`harness.api.run` both call
:func:`harness.session.run_suite` and leave the same records; the trackers a run asks for are an
option handed to every cell's process (in this process, a local worker's task, a Slurm task's
pickled payload), never an environment variable; validating changes nothing; ``harness report``
without a folder says what it needs."""

from __future__ import annotations

import os
import pickle
import textwrap

import pytest

import harness.api as h
import harness.cli.run as cli_run
import harness.session.run as session_run
from harness.cli import main
from harness.config.parse import load_suite
from harness.contract import read_record
from harness.executors.base import ExecutorOptions
from harness.storage.tracker_options import TrackerOptions
from tests.conftest import REPO

# One σN-Ens cell and its single baseline, one short epoch: the records are compared, not timed.
TINY = textwrap.dedent("""\
    name: one_way
    grid:
      datasets: [digits]
      backbones: [{name: digits_cnn, kwargs: {width: 8}}]
      M: [2]
      seeds: [0]
      methods:
        - {name: single, M: [1]}
        - {name: sigma_ens, hparams: {tau: 0.5, lam: 0.01}}
    recipe: {epochs: 1, batch_size: 64, lr: 0.05, warmup_epochs: 0}
    evaluation: {cost: false}
    """)

MLFLOW_ONLY = TrackerOptions(names=("mlflow",), tags=(("study", "s1"),))


def _records(folder) -> dict[str, dict]:
    return {p.name: read_record(p) for p in folder.iterdir() if (p / "record.json").exists()}


def test_the_api_and_the_command_line_run_the_same_function_and_write_the_same_records(
    tmp_path, monkeypatch
):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    calls: list[tuple[str, session_run.RunOptions]] = []
    real = session_run.run_suite

    def spy(path, options, on_start=None):
        calls.append((str(path), options))
        return real(path, options, on_start)

    monkeypatch.setattr(session_run, "run_suite", spy)
    out = h.run(suite, executor="inprocess", results=tmp_path / "api")
    code = main(["run", str(suite), "--executor", "inprocess", "-q",
                 "--results", str(tmp_path / "cli")])  # fmt: skip
    assert out.exit_code == code == 0
    assert [path for path, _ in calls] == [str(suite)] * 2
    api_options, cli_options = (options for _, options in calls)
    # The same run, asked for two ways: only the results root differs.
    assert api_options.executor_options == cli_options.executor_options
    assert (api_options.executor, api_options.only) == (cli_options.executor, cli_options.only)
    api, cli = _records(tmp_path / "api" / "one_way"), _records(tmp_path / "cli" / "one_way")
    assert sorted(api) == sorted(cli) and len(api) == 2
    for cid, rec in api.items():
        other = cli[cid]
        assert rec["status"] == other["status"] == "done"
        assert rec["config"] == other["config"] and rec["label"] == other["label"]
        assert rec["metrics"] == other["metrics"]  # seeded CPU runs: the same numbers
        losses = [(e["train_loss"], e["train_reg"]) for e in rec["history"]]
        assert losses == [(e["train_loss"], e["train_reg"]) for e in other["history"]]


def test_validation_and_a_run_set_no_environment_variable(tmp_path, monkeypatch):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = dict(os.environ)
    flags = ["--logger", "mlflow", "--logger", "tensorboard", "--tensorboard"]
    assert main(["validate", str(suite), "--skip-data", *flags]) == 0
    assert main(["run", str(suite), "--dry-run", *flags, "--tag", "a=b"]) == 0
    assert h.validate(suite, check_data=False).suite == "one_way"
    assert dict(os.environ) == before
    for module in ("cli/validate.py", "session/validate.py", "session/checks.py"):
        source = (REPO / "harness" / module).read_text()
        assert "os.environ[" not in source and "environ.update" not in source


def test_tracker_flags_become_the_executors_options(tmp_path):
    from harness.cli.parser import build_parser

    args = build_parser().parse_args(
        ["run", "s.yaml", "--logger", "wandb", "--tensorboard", "--tag", "study=s1",
         "--tag", "note=a=b", "--wandb-project", "p", "--mlflow-experiment", "e", "--log-model"]
    )  # fmt: skip
    trackers = cli_run.run_options(args).executor_options.trackers
    assert trackers == TrackerOptions(
        names=("wandb", "tensorboard"),
        tags=(("study", "s1"), ("note", "a=b")),
        mlflow_experiment="e",
        wandb_project="p",
        log_model=True,
    )


def test_tracker_settings_are_resolved_where_the_run_starts(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    resolved = TrackerOptions(names=("mlflow",), wandb_project=None).resolved()
    assert resolved.mlflow_uri == "http://127.0.0.1:5999" and resolved.wandb_project == "from-env"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("WANDB_PROJECT")
    # The cells' processes see what the starting process saw, not their own environment.
    assert resolved.tracking_uri() == "http://127.0.0.1:5999"
    assert resolved.project() == "from-env" and resolved.experiment("suite") == "suite"
    given = TrackerOptions(names=("mlflow",), mlflow_experiment="mine", wandb_project="p")
    assert given.resolved().experiment("suite") == "mine" and given.resolved().project() == "p"
    assert TrackerOptions().resolved() == TrackerOptions()  # no tracker: nothing to look up


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--tag", "novalue"], "argument --tag: expected key=value, got 'novalue'"),
        (["--tag", "a=b"], "--tag: only with --logger (the tags go to the trackers)"),
        (["--logger", "mlflow", "--tag", "suite=x"], "'suite' is a tag the harness sets"),
        (["--wandb-project", "p"], "--wandb-project: only with --logger wandb"),
        (["--logger", "tensorboard", "--log-model"], "--log-model: only with --logger mlflow"),
    ],
)
def test_tracker_settings_nothing_would_take_are_refused_before_the_run(
    tmp_path, capsys, monkeypatch, flags, line
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    argv = ["run", str(suite), "--results", str(tmp_path / "r"), "-q", *flags]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of a flag's value
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing ran, nothing was written


def test_the_api_refuses_tags_without_a_tracker(tmp_path):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    with pytest.raises(h.HarnessError, match="--tag: only with --logger"):
        h.run(suite, tags={"a": "b"}, results=tmp_path / "r")


def test_a_slurm_task_carries_the_trackers_in_its_payload(tmp_path, monkeypatch, write_suite):
    """The task object is what submitit pickles into the job's payload: the trackers are in it,
    and in the requeued submission its ``checkpoint`` makes."""
    import harness.engine.runner as runner
    from harness.executors.slurm.submit import CellTask

    got: list = []

    def fake_run_cell(cell, results_dir, data_root, force, progress, shared, trackers=None):
        got.append(trackers)
        return {"cell_id": cell.cell_id, "status": "done"}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    cell = load_suite(write_suite(TINY)).cells()[0]
    task = pickle.loads(pickle.dumps(CellTask(force=False, trackers=MLFLOW_ONLY)))
    task(cell.to_json(), str(tmp_path), None)
    again = task.checkpoint(cell.to_json(), str(tmp_path), None)
    again = pickle.loads(pickle.dumps(again))
    again.function(*again.args, **again.kwargs)
    assert got == [MLFLOW_ONLY, MLFLOW_ONLY]


def test_the_in_process_executor_hands_the_trackers_to_each_cell(tmp_path, monkeypatch):
    import harness.engine.runner as runner
    from harness.executors.local import InProcessExecutor

    got: list = []

    def fake_run_cell(cell, results_dir, data_root, force, progress, shared, trackers=None):
        got.append(trackers)
        return {"cell_id": cell.cell_id, "status": "done"}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    cells = load_suite(str(suite)).cells()
    executor = InProcessExecutor(ExecutorOptions(progress=False, trackers=MLFLOW_ONLY))
    executor.run(cells, tmp_path, None, False)
    assert got == [MLFLOW_ONLY] * len(cells)


def report_trackers(cell_json, results_dir, data_root, force, threads, shared, trackers=None):
    """A local worker's task that reports what it was handed and what its environment says."""
    from harness.contract import Cell

    return {
        "cell_id": Cell.from_json(cell_json).cell_id,
        "status": "done",
        "trackers": trackers,
        "env": {k: v for k, v in os.environ.items() if k.startswith("HARNESS_")},
    }


@pytest.mark.slow  # spawns a worker process
def test_a_local_worker_is_handed_the_trackers_not_an_environment_variable(tmp_path):
    from harness.executors.local import LocalWorkersExecutor

    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    cells = load_suite(str(suite)).cells()
    options = ExecutorOptions(workers=1, threads=1, progress=False, trackers=MLFLOW_ONLY)
    executor = LocalWorkersExecutor(options, discover=lambda: [], task=report_trackers)
    outcome = executor.run(cells, tmp_path, None, False)
    assert [r["trackers"] for r in outcome.records] == [MLFLOW_ONLY] * len(cells)
    for rec in outcome.records:  # no variable carried the choice into the worker
        assert "HARNESS_LOGGERS" not in rec["env"] and "HARNESS_TENSORBOARD" not in rec["env"]


def test_report_without_a_folder_says_what_it_needs(capsys):
    assert main(["report"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "give the results folder" in err and "harness report results/smoke" in err
    assert "KEY=VALUE" not in err
