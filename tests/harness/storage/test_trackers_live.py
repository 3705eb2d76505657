"""Trackers end to end: cells run by the harness (in this process, in local worker processes, as
Slurm array tasks) log to MLflow — the file store by default, a live ``mlflow server`` with a
SQLite backend on 127.0.0.1 when ``MLFLOW_TRACKING_URI`` names it — and the runs are read back
with ``mlflow.search_runs``: filtered by a parameter, the final metrics equal to the records',
the seeds of one configuration sharing the group tag.

The server: ``.ci/run`` starts one and sets ``HARNESS_MLFLOW_URI`` and
``HARNESS_REQUIRE_TRACKERS=1`` (these tests then fail rather than skip); elsewhere one is started
for this module on a free port (``tests/mlflow_server.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from harness.storage.tracker_options import MLFLOW_URI_ENV, TrackerOptions

try:  # tests/ as a package or as a rootdir-inserted folder
    from tests.mlflow_server import mlflow_server, tracker_package
    from tests.slurm_cluster import slurm_environment
except ImportError:  # pragma: no cover - depends on how pytest imported this module
    from mlflow_server import mlflow_server, tracker_package
    from slurm_cluster import slurm_environment

REPO = Path(__file__).resolve().parents[3]
DIGITS_RECIPE = REPO / "suites" / "common" / "digits_recipe.yaml"


def suite_text(name: str) -> str:
    """2 methods × 2 seeds on the built-in digits, two short epochs, one corruption, one OOD set."""
    return textwrap.dedent(f"""\
        include: {DIGITS_RECIPE}
        name: {name}
        grid:
          datasets: [digits]
          backbones: [{{name: digits_cnn, kwargs: {{width: 8}}}}]
          M: [2]
          seeds: [0, 1]
          methods:
            - {{name: single, M: [1]}}
            - {{name: sigma_ens, hparams: {{tau: 0.5}}}}
        recipe: {{epochs: 2, warmup_epochs: 0}}
        evaluation:
          corruptions: [gaussian_noise]
          severities: [1]
          ood: [sklearn_photos]
          cost: false
        """)


def harness_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("harness")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli"]


def records(results: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in results.glob("*/record.json")}


def check_runs(uri: str, suite: str, results: Path) -> None:
    """The acceptance: ``params.method = 'sigma_ens'`` finds exactly the σN-Ens runs, each with
    ``metrics.acc`` equal to its record's clean accuracy; its seeds share the group tag."""
    import mlflow
    from mlflow.tracking import MlflowClient

    recs = records(results)
    assert len(recs) == 4 and {r["status"] for r in recs.values()} == {"done"}
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[suite], filter_string="params.method = 'sigma_ens'")
    sigma = {cid: r for cid, r in recs.items() if r["config"]["method"] == "sigma_ens"}
    assert sorted(runs["tags.cell_id"]) == sorted(sigma)
    for _, run in runs.iterrows():
        rec = sigma[run["tags.cell_id"]]
        assert run["metrics.acc"] == rec["metrics"]["clean"]["acc"]
        assert run["metrics.nll"] == rec["metrics"]["clean"]["nll"]
        assert run["metrics.corruption.mean.acc"] == rec["metrics"]["corruption"]["mean"]["acc"]
        ood = rec["metrics"]["ood"]["sklearn_photos"]["msp"]["auroc"]
        assert run["metrics.ood.sklearn_photos.msp.auroc"] == ood
        assert run["params.tau"] == "0.5" and run["params.seed"] == str(rec["config"]["seed"])
        assert run["tags.mlflow.runName"] == rec["label"] and run["status"] == "FINISHED"
        assert run["tags.suite"] == suite and run["tags.method"] == "sigma_ens"
    assert runs["tags.group"].nunique() == 1  # the two seeds: one configuration
    single = mlflow.search_runs(experiment_names=[suite], filter_string="params.method = 'single'")
    assert len(single) == 2 and single["tags.group"].nunique() == 1
    assert single["tags.group"].iloc[0] != runs["tags.group"].iloc[0]
    # The record itself travelled as an artifact (through the server's artifact proxy).
    client = MlflowClient(tracking_uri=uri)
    run_id = runs["run_id"].iloc[0]
    assert [a.path for a in client.list_artifacts(run_id)] == ["record.json"]
    copy = Path(client.download_artifacts(run_id, "record.json", str(results.parent)))
    assert json.loads(copy.read_text())["cell_id"] == runs["tags.cell_id"].iloc[0]


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


def test_a_cell_killed_and_resumed_in_process_keeps_one_file_store_run(
    tmp_path, monkeypatch, write_suite
):
    """The default store (no server): the runner's trackers get the epochs and the record; a
    cell interrupted after epoch 1 and resumed continues its run."""
    tracker_package("mlflow")
    from mlflow.tracking import MlflowClient

    from harness.config.parse import load_suite
    from harness.engine import runner

    monkeypatch.delenv(MLFLOW_URI_ENV, raising=False)
    mlflow_only = TrackerOptions(names=("mlflow",))
    # Evaluation on the clean test set only: the epochs and the record are what is checked.
    quick = ["evaluation.corruptions=[]", "evaluation.ood=[]"]
    suite = load_suite(write_suite(suite_text("trk_inproc")), quick)
    cell = next(c for c in suite.cells() if c.method == "sigma_ens")
    real, calls = runner.train_epoch, {"n": 0}

    def interrupt_second_epoch(*args, **kwargs):
        if calls["n"] == 1:
            raise KeyboardInterrupt("simulated Ctrl-C")
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", interrupt_second_epoch)
    with pytest.raises(KeyboardInterrupt, match="simulated Ctrl-C"):
        runner.run_cell(cell, tmp_path / "trk_inproc", progress=False, trackers=mlflow_only)
    monkeypatch.setattr(runner, "train_epoch", real)
    rec = runner.run_cell(cell, tmp_path / "trk_inproc", progress=False, trackers=mlflow_only)
    client = MlflowClient(tracking_uri=(tmp_path / "trk_inproc" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("trk_inproc").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == rec["label"]
    assert run.data.metrics["acc"] == rec["metrics"]["clean"]["acc"]
    assert run.data.params["method"] == "sigma_ens" and run.data.params["tau"] == "0.5"
    assert run.data.tags["resumed_after"] == "1"
    losses = client.get_metric_history(run.info.run_id, "train.loss")
    assert [(m.step, m.value) for m in losses] == [
        (h["epoch"], h["train_loss"]) for h in rec["history"]
    ]


@pytest.mark.slow  # a tracking server and worker processes
def test_worker_processes_log_to_a_live_mlflow_server(mlflow_uri, tmp_path, write_suite):
    suite = f"trk_local_{uuid.uuid4().hex[:8]}"  # a shared server keeps earlier experiments
    path = write_suite(suite_text(suite))
    env = {**os.environ, MLFLOW_URI_ENV: mlflow_uri, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*harness_cmd(), "run", str(path), "--executor", "local", "--workers", "2",
         "--threads", "1", "--logger", "mlflow", "--results", str(tmp_path / "results"), "-q"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "results" / suite / "mlruns").exists()  # the server, not the file store
    check_runs(mlflow_uri, suite, tmp_path / "results" / suite)


@pytest.mark.slurm
def test_slurm_tasks_log_to_a_live_mlflow_server(mlflow_uri, tmp_path, write_suite):
    """The array tasks get the trackers and the server's address (``MLFLOW_TRACKING_URI`` as
    ``harness run`` saw it) in their pickled payload and log to the same server."""
    with slurm_environment():
        suite = f"trk_slurm_{uuid.uuid4().hex[:8]}"
        path = write_suite(suite_text(suite))
        env = {**os.environ, MLFLOW_URI_ENV: mlflow_uri}
        env.pop("OMP_NUM_THREADS", None)
        proc = subprocess.run(
            [*harness_cmd(), "run", str(path), "--executor", "slurm", "--profile", "local",
             "--logger", "mlflow", "--results", str(tmp_path / "results"), "--wait", "-q"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        check_runs(mlflow_uri, suite, tmp_path / "results" / suite)
