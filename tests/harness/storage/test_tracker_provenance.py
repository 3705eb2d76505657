"""Provenance in the trackers (issue 50, item 5), read back with each tracker's own client: a σN-Ens
cell run through :func:`harness.api.run` logs the git commit its record names, the user's tags,
the task loss and the diversity term as separate series (``train.task_loss``,
``train.div_loss``: σN-Ens's λ·L_div, negative), one name per quantity (the epochs' validation
accuracy and the record's final one are the series ``val.acc``; no ``val_acc`` beside it), the
final weights as an artifact when asked, in the experiment or project the run names.

MLflow against a live ``mlflow server`` (``tests/mlflow_server.py``: CI's, or one started here);
W&B offline, its transaction log decoded with wandb's own protobuf schema
(``tests/tracker_readers.py``); TensorBoard's HParams session with its ``EventAccumulator``.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

import harness.api as h
from harness.contract import read_record
from harness.storage import loggers as L
from harness.storage import tracked as T
from harness.storage.progress import ProgressLog
from harness.storage.tracker_options import MLFLOW_URI_ENV, TrackerOptions
from harness.storage.trackers import TENSORBOARD_DIR
from tests.mlflow_server import mlflow_server, tracker_package
from tests.record_factory import make_record
from tests.tracker_readers import _entries, tensorboard_hparams, wandb_run

TAGS = {"study": "provenance", "owner": "ci bot"}


def suite_text(name: str) -> str:
    """One σN-Ens cell with a diversity term (λ = 0.01), two epochs, a validation split."""
    return textwrap.dedent(f"""\
        name: {name}
        grid:
          datasets: [digits]
          backbones: [{{name: digits_cnn, kwargs: {{width: 8}}}}]
          M: [2]
          seeds: [0]
          methods:
            - {{name: sigma_ens, hparams: {{tau: 0.5, lam: 0.01}}}}
        recipe: {{epochs: 2, batch_size: 64, lr: 0.05, warmup_epochs: 0, validation: 200}}
        evaluation: {{cost: false}}
        """)


def run_one_cell(tmp_path: Path, name: str, **kwargs) -> tuple[Path, dict]:
    suite = tmp_path / f"{name}.yaml"
    suite.write_text(suite_text(name))
    out = h.run(suite, executor="inprocess", results=tmp_path / "results", **kwargs)
    assert out.exit_code == 0
    (cell_dir,) = [p for p in out.results_dir.iterdir() if (p / "record.json").exists()]
    return cell_dir, read_record(cell_dir)


def check_losses(series: dict[str, list[tuple[int, float]]], rec: dict) -> None:
    """``train.task_loss`` + ``train.div_loss`` = the objective, epoch by epoch, as the
    record's history has them (``train_loss`` is the objective, ``train_reg`` λ·L_div)."""
    history = rec["history"]
    assert [s for s, _ in series["train.div_loss"]] == [e["epoch"] for e in history]
    for (_, div), (_, task), e in zip(series["train.div_loss"], series["train.task_loss"], history):
        assert div == pytest.approx(e["train_reg"], rel=1e-6) and div < 0  # λ·L_div: negative
        assert task == pytest.approx(e["train_loss"] - e["train_reg"], rel=1e-6)
        assert task > e["train_loss"]  # the task loss alone is above the objective


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


@pytest.mark.slow  # a tracking server and a trained cell
def test_mlflow_run_carries_commit_tags_separate_losses_and_the_weights(
    mlflow_uri, tmp_path, monkeypatch
):
    tracker_package("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv(MLFLOW_URI_ENV, mlflow_uri)
    experiment = f"provenance-{uuid.uuid4().hex[:8]}"  # a shared server keeps earlier ones
    cell_dir, rec = run_one_cell(
        tmp_path, "prov_mlflow", loggers=["mlflow"], tags=TAGS, mlflow_experiment=experiment,
        log_model=True,
    )  # fmt: skip
    client = MlflowClient(tracking_uri=mlflow_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None and client.get_experiment_by_name("prov_mlflow") is None
    (run,) = client.search_runs([found.experiment_id])
    tags = run.data.tags
    commit = rec["environment"]["git_commit"]
    assert commit and tags["git_commit"] == commit
    if commit != "unknown":
        assert tags["mlflow.source.git.commit"] == commit.split("+")[0]
    assert tags["study"] == "provenance" and tags["owner"] == "ci bot"
    assert tags["cell_id"] == rec["cell_id"] and tags["suite"] == "prov_mlflow"
    series = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in ("train.div_loss", "train.task_loss", "train.loss", "val.acc")
    }
    check_losses(series, rec)
    # One name per quantity: the epochs' validation accuracy and the record's final one.
    metrics = run.data.metrics
    assert not {"val_acc", "train_loss", "train_reg"} & set(metrics)
    # The last epoch's point is the record's final value: written once, not twice.
    assert [s for s, _ in series["val.acc"]] == [1, 2]
    assert metrics["val.acc"] == series["val.acc"][-1][1] == rec["metrics"]["val"]["acc"]
    # The final weights, as the cell keeps them.
    paths = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert paths == {"record.json", "model"}
    (weights,) = client.list_artifacts(run.info.run_id, "model")
    assert weights.path == "model/final.pt"
    copy = client.download_artifacts(run.info.run_id, "model/final.pt", str(tmp_path))
    assert Path(copy).read_bytes() == (cell_dir / "final.pt").read_bytes()


@pytest.mark.slow  # a tracking server and a trained cell
def test_mlflow_sends_no_weights_unless_asked(mlflow_uri, tmp_path, monkeypatch):
    tracker_package("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv(MLFLOW_URI_ENV, mlflow_uri)
    experiment = f"env-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)  # the fallback of the option
    _, rec = run_one_cell(tmp_path, "prov_nomodel", loggers=["mlflow"])
    client = MlflowClient(tracking_uri=mlflow_uri)
    found = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([found.experiment_id])
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["record.json"]
    assert run.data.tags["git_commit"] == rec["environment"]["git_commit"]


def _wandb_records(run_dir: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("run-*.wandb")
    out = []
    for raw in _entries(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(raw)
        out.append(rec)
    return out


@pytest.mark.slow  # wandb starts its service process
def test_wandb_offline_run_carries_commit_tags_separate_losses_and_the_weights(
    tmp_path, monkeypatch
):
    tracker_package("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_PROJECT", "not-this-one")  # the option wins over the variable
    cell_dir, rec = run_one_cell(
        tmp_path, "prov_wandb", loggers=["wandb"], tags=TAGS, wandb_project="harness-provenance",
        log_model=True,
    )  # fmt: skip
    (folder,) = (cell_dir / "wandb").glob("offline-run-*")
    run = wandb_run(folder)
    assert run.run_id == rec["cell_id"]
    assert {"study:provenance", "owner:ci bot"} <= set(run.tags)
    assert run.config["git_commit"] == rec["environment"]["git_commit"]
    assert run.config["tag.study"] == "provenance" and run.config["tag.owner"] == "ci bot"
    records = _wandb_records(folder)
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert header.project == "harness-provenance"
    steps = [h for h in run.history if "train.loss" in h]
    series = {
        key: [(int(h["_step"]), h[key]) for h in steps]
        for key in ("train.div_loss", "train.task_loss")
    }
    check_losses(series, rec)
    assert not {"val_acc", "train_loss", "train_reg"} & {k for h in run.history for k in h}
    assert run.summary["val.acc"] == rec["metrics"]["val"]["acc"]
    (artifact,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert (artifact.name, artifact.type) == (f"model-{rec['cell_id']}", "model")
    entries = {e.path: e.size for e in artifact.manifest.contents}
    assert entries == {"final.pt": (cell_dir / "final.pt").stat().st_size}


def _tracked_cell(tmp_path: Path) -> tuple[Path, dict]:
    rec = make_record(suite="trk", method="sigma_ens", M=2, hparams={"tau": 0.5, "lam": 0.01})
    cell_dir = tmp_path / "trk" / rec["cell_id"]
    cell_dir.mkdir(parents=True)
    (cell_dir / "record.json").write_text(json.dumps(rec))
    return cell_dir, rec


def _log_one_epoch(cell_dir: Path, rec: dict, options: TrackerOptions) -> None:
    """What the runner does, for one epoch: trackers told the commit, the row, the record."""
    trackers = L.CellTrackers(cell_dir, options, T.TrackedCell.from_record(rec, cell_dir), "abc1")
    log = ProgressLog(cell_dir, 0, 1, "cpu", trackers=trackers)
    log.write({"epoch": 1, "train_loss": 1.5, "train_reg": -0.25, "val_acc": 0.5, "epoch_s": 1})
    log.close()
    trackers.finish(rec)


def test_mlflow_file_store_run_is_told_the_commit_tags_and_experiment(tmp_path, monkeypatch):
    """The same without a server or training (the default test run): MLflow's file store."""
    tracker_package("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv(MLFLOW_URI_ENV, raising=False)
    cell_dir, rec = _tracked_cell(tmp_path)
    (cell_dir / "final.pt").write_bytes(b"weights")
    options = TrackerOptions.of(["mlflow"], TAGS, mlflow_experiment="mine", log_model=True)
    _log_one_epoch(cell_dir, rec, options)
    client = MlflowClient(tracking_uri=(tmp_path / "trk" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("mine").experiment_id])
    assert run.data.tags["git_commit"] == "abc1" and run.data.tags["study"] == "provenance"
    assert run.data.metrics["train.task_loss"] == 1.75
    assert run.data.metrics["train.div_loss"] == -0.25
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"record.json", "model"}


def test_tensorboard_session_carries_commit_and_tags(tmp_path):
    tracker_package("tensorboard")
    cell_dir, rec = _tracked_cell(tmp_path)
    _log_one_epoch(cell_dir, rec, TrackerOptions.of(["tensorboard"], TAGS))
    session = tensorboard_hparams(cell_dir / TENSORBOARD_DIR)
    assert session.hparams["git_commit"] == "abc1"
    assert session.hparams["tag.study"] == "provenance" and session.hparams["tag.owner"] == "ci bot"
    assert session.scalars["train.task_loss"] == 1.75 and session.scalars["train.div_loss"] == -0.25
    assert "val.acc" in session.scalars and "val_acc" not in session.scalars


def test_epoch_rows_become_one_name_per_quantity():
    row = {"epoch": 3, "train_loss": 0.5, "train_reg": -0.1, "train_acc": 0.9, "lr": 0.01,
           "val_acc": 0.8, "val_nll": float("nan"), "epoch_s": 2.0, "diag_k_eff": 1.5}  # fmt: skip
    assert L.epoch_metrics(row) == {
        "train.loss": 0.5,
        "train.div_loss": -0.1,
        "train.task_loss": pytest.approx(0.6),
        "train.acc": 0.9,
        "train.lr": 0.01,
        "val.acc": 0.8,  # the name the record's final val block has; NaN left out
        "train.epoch_s": 2.0,
        "diag.k_eff": 1.5,
    }
    # A method without a diversity term: its task loss is the objective, its term 0.
    plain = L.epoch_metrics({"epoch": 1, "train_loss": 0.7, "train_reg": 0.0})
    assert plain == {"train.loss": 0.7, "train.div_loss": 0.0, "train.task_loss": 0.7}


def test_the_final_value_is_written_once_unless_it_differs_from_the_last_epochs():
    from harness.storage.trackers import finals_to_log

    rec = {"history": [{}, {}], "metrics": {"clean": {"acc": 0.9}, "val": {"acc": 0.8}}}
    assert finals_to_log(rec, 2, (2, {"val.acc": 0.8})) == {"acc": 0.9}  # the same point
    # A stochastic evaluation (MC Dropout) can differ: the record's value is written after it.
    assert finals_to_log(rec, 2, (2, {"val.acc": 0.79})) == {"acc": 0.9, "val.acc": 0.8}
    assert finals_to_log(rec, 2, None) == {"acc": 0.9, "val.acc": 0.8}  # evaluation redone only
