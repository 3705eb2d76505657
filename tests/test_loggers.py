"""The per-epoch logging seam: ``progress.csv`` always, and the loggers asked for — TensorBoard,
Weights & Biases in offline mode, MLflow's local file store — each receiving every epoch's
numbers. Offline: nothing here opens a network connection."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.storage import loggers as L
from harness.storage.progress import ProgressLog, read_progress

ROWS = [
    {"epoch": 1, "train_loss": 2.0, "train_acc": 0.25, "lr": 0.1, "epoch_s": 1.5},
    {"epoch": 2, "train_loss": 1.5, "train_acc": 0.5, "lr": 0.05, "epoch_s": 1.0},
]


def _train(cell_dir, names):
    log = ProgressLog(cell_dir, 0, 2, "cpu", loggers=names)
    for row in ROWS:
        log.write(row, diagnostics={"tau": 0.5, "k_eff": float("nan")}, images=30)
    log.close()


def test_mlflow_logger_writes_every_epoch_to_the_local_file_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    cell_dir = tmp_path / "suite_a" / "0123456789abcdef"
    cell_dir.mkdir(parents=True)
    _train(cell_dir, ["mlflow"])
    assert [r["train_loss"] for r in read_progress(cell_dir)] == [2.0, 1.5]  # the CSV as ever
    client = MlflowClient(tracking_uri=(tmp_path / "suite_a" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("suite_a")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "0123456789abcdef" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "diag_tau")] == [0.5, 0.5]
    assert client.get_metric_history(run.info.run_id, "diag_k_eff") == []  # NaN is not logged


@pytest.mark.slow  # wandb starts its service process
def test_wandb_logger_writes_an_offline_run_into_the_cell(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cell_dir = tmp_path / "suite_b" / "fedcba9876543210"
    cell_dir.mkdir(parents=True)
    log = ProgressLog(cell_dir, 0, 2, "cpu", loggers=["wandb"])
    for row in ROWS:
        log.write(row, diagnostics={"tau": 0.5}, images=30)
    (logger,) = log.loggers
    assert logger.run.settings.mode == "offline"
    log.close()  # finish: the last epoch's row is committed
    (run_file,) = (cell_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data = run_file.read_bytes()  # the records `wandb sync` uploads: each key and value is there
    assert b"train_loss" in data and b"diag_tau" in data and b"1.5" in data


def test_loggers_are_checked_before_a_run(tmp_path, monkeypatch, capsys, write_suite):
    monkeypatch.setitem(L.LOGGERS, "absent", (L.MLflowLogger, "no_such_package_xyz", "absent"))
    assert L.logger_problems(["nosuch", "absent"]) == [
        "--logger nosuch: unknown; valid: tensorboard, wandb, mlflow, absent",
        "--logger absent: the no_such_package_xyz package is not installed; "
        "pip install 'implicit-ensemble-harness[absent]'",
    ]
    suite = write_suite(
        "name: lg\ngrid: {datasets: [digits], backbones: [digits_cnn], methods: [single], "
        "M: [1]}\nrecipe: {epochs: 1, warmup_epochs: 0}\n"
    )
    assert main(["validate", str(suite), "--skip-data", "--logger", "nosuch"]) == 2
    assert "--logger nosuch: unknown" in capsys.readouterr().err
    monkeypatch.delenv(L.LOGGERS_ENV, raising=False)
    assert main(["validate", str(suite), "--skip-data", "--logger", "mlflow"]) == 0
    assert L.requested() == ["mlflow"]  # handed to the cells' processes through the environment
