"""The tracker seam: ``progress.csv`` always, and the trackers asked for — TensorBoard (with an
HParams session), Weights & Biases offline, MLflow — each receiving the cell's configuration as
parameters, its group (the configuration without the seed), every epoch, and the record's final
metrics. Each tracker's output is read back with that tracker's own reader. Offline: MLflow's
file store here; the live tracking server is ``tests/harness/storage/test_trackers_live.py``."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.contract import label_of
from harness.storage import loggers as L
from harness.storage import tracked as T
from harness.storage import trackers as TR
from harness.storage.progress import ProgressLog, read_progress
from harness.storage.tracker_options import MLFLOW_URI_ENV
from tests.mlflow_server import REQUIRE_ENV, URI_ENV, mlflow_server, tracker_package
from tests.record_factory import make_record
from tests.tracker_readers import tensorboard_hparams, wandb_run

ROWS = [
    {"epoch": 1, "train_loss": 2.0, "train_acc": 0.25, "lr": 0.1, "epoch_s": 1.5},
    {"epoch": 2, "train_loss": 1.5, "train_acc": 0.5, "lr": 0.05, "epoch_s": 1.0},
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """The file store and offline W&B, whatever the developer's environment points at."""
    for var in (MLFLOW_URI_ENV, "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)


def _record(seed: int = 0, acc: float = 0.9, **extra) -> dict:
    """A σN-Ens record (τ = 0.5) with two epochs of history and a calibrated block the tracker
    code has never heard of (it must flow through by itself)."""
    rec = make_record(
        suite="trk",
        method="sigma_ens",
        M=2,
        hparams={"tau": 0.5, "lam": 0.01},
        seed=seed,
        acc=acc,
        overrides={
            "history": [dict(r) for r in ROWS],
            "metrics": {
                "calibration": {
                    "ts": {
                        "nll": 0.25,
                        "ece": 0.011,
                        "reliability": {"count": [3, 0, 7], "confidence": [0.1, None, 0.9]},
                    }
                }
            },
            **extra,
        },
    )
    return rec


def _cell_dir(tmp_path, rec):
    cell_dir = tmp_path / rec["suite"] / rec["cell_id"]
    cell_dir.mkdir(parents=True)
    (cell_dir / "record.json").write_text(json.dumps(rec))
    return cell_dir


def _train(cell_dir, rec, names, resume_epoch=0):
    """What the runner does: trackers opened with the record's header, epochs, then the record."""
    trackers = L.CellTrackers(cell_dir, names, T.TrackedCell.from_record(rec, cell_dir))
    log = ProgressLog(cell_dir, resume_epoch, 2, "cpu", trackers=trackers)
    for row in ROWS[resume_epoch:]:
        log.write(row, diagnostics={"tau": 0.5, "k_eff": float("nan")}, images=30)
    log.close()
    trackers.finish(rec)
    return trackers


def test_final_metrics_walk_every_block_of_the_record():
    rec = _record()
    final = T.final_metrics(rec)
    clean = rec["metrics"]["clean"]
    assert final["acc"] == clean["acc"] and final["nll"] == clean["nll"]
    assert not [k for k in final if k.startswith("members")]  # lists: left to record.json
    assert final["val.acc"] == rec["metrics"]["val"]["acc"]
    assert final["calibration.ts.nll"] == 0.25  # a block no code here names
    assert not [k for k in final if "reliability" in k]  # bins are lists
    mean = rec["metrics"]["corruption"]["mean"]
    assert {final[f"corruption.mean.{k}"] for k in mean} == set(mean.values())
    assert (
        final["corruption.per_severity.3.ece"]
        == rec["metrics"]["corruption"]["per_severity"]["3"]["ece"]
    )
    ood = rec["metrics"]["ood"]["svhn"]
    assert final["ood.svhn.msp.auroc"] == ood["msp"]["auroc"]
    assert final["ood.svhn.entropy.fpr95"] == ood["entropy"]["fpr95"]
    assert final["cost.params_total"] == rec["cost"]["params_total"]
    assert not [k for k in final if k.startswith("corruption.cells")]  # left to record.json


def test_params_are_flat_and_seeds_share_the_group():
    a, b = _record(seed=0), _record(seed=1)
    ta, tb = (T.TrackedCell.from_record(r, f"/r/trk/{r['cell_id']}") for r in (a, b))
    assert ta.params["method"] == "sigma_ens" and ta.params["tau"] == 0.5
    assert ta.params["M"] == 2 and ta.params["seed"] == 0 and ta.params["recipe.epochs"] == 2
    assert ta.group == tb.group and ta.config_id == tb.config_id and ta.cell_id != tb.cell_id
    assert ta.group.startswith("digits/mlp/sigma_ens(M=2,") and "/seed" not in ta.group
    assert ta.label.endswith("/seed0") and tb.label.endswith("/seed1")
    lr = make_record(suite="trk", method="sigma_ens", M=2, hparams={"tau": 0.5, "lam": 0.01})
    lr["config"]["recipe"]["lr"] = 0.2  # another recipe: another configuration, same label
    t_lr = T.TrackedCell.from_record(lr, "/r/trk/y")
    assert t_lr.group != ta.group and t_lr.group.split("#")[0] == ta.group.split("#")[0]
    short = ta.group_within(20)  # W&B's group limit: the readable part is cut, the hash kept
    assert len(short) == 20 and short.endswith("#" + ta.config_id[:8])
    assert ta.group_within(500) == ta.group


def test_mlflow_file_store_gets_params_group_epochs_final_metrics_and_the_record(tmp_path):
    tracker_package("mlflow")
    from mlflow.tracking import MlflowClient

    recs = [_record(seed=0, acc=0.91), _record(seed=1, acc=0.87)]
    dirs = [_cell_dir(tmp_path, r) for r in recs]
    for d, r in zip(dirs, recs):
        _train(d, r, ["mlflow"])
    assert [r["train_loss"] for r in read_progress(dirs[0])] == [2.0, 1.5]  # the CSV as ever
    client = MlflowClient(tracking_uri=(tmp_path / "trk" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("trk")
    runs = client.search_runs([experiment.experiment_id], "params.method = 'sigma_ens'")
    by_seed = {int(r.data.params["seed"]): r for r in runs}
    assert sorted(by_seed) == [0, 1]
    for seed, rec in enumerate(recs):
        run = by_seed[seed]
        assert run.info.run_name == label_of(rec)  # digits/mlp/sigma_ens(M=2,…)/seed0
        assert run.info.status == "FINISHED"
        assert run.data.params["tau"] == "0.5" and run.data.params["M"] == "2"
        assert run.data.metrics["acc"] == rec["metrics"]["clean"]["acc"]
        assert run.data.metrics["calibration.ts.ece"] == 0.011
        assert run.data.tags["suite"] == "trk" and run.data.tags["method"] == "sigma_ens"
        assert run.data.tags["cell_id"] == rec["cell_id"]
        history = client.get_metric_history(run.info.run_id, "train.loss")
        assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5)]
        assert client.get_metric_history(run.info.run_id, "diag.k_eff") == []  # NaN: not logged
        (artifact,) = client.list_artifacts(run.info.run_id)
        assert artifact.path == "record.json"
    assert by_seed[0].data.tags["group"] == by_seed[1].data.tags["group"]


def test_a_resumed_cell_continues_its_mlflow_run_and_a_fresh_start_opens_a_new_one(tmp_path):
    tracker_package("mlflow")
    from mlflow.tracking import MlflowClient

    rec = _record()
    cell_dir = _cell_dir(tmp_path, rec)
    header = T.TrackedCell.from_record(rec, cell_dir)
    killed = L.CellTrackers(cell_dir, ["mlflow"], header)  # epoch 1, then the process dies
    log = ProgressLog(cell_dir, 0, 2, "cpu", trackers=killed)
    log.write(ROWS[0], images=30)
    first = killed.runs["mlflow"].run_id
    _train(cell_dir, rec, ["mlflow"], resume_epoch=1)  # resumes from the epoch-1 checkpoint
    client = MlflowClient(tracking_uri=(tmp_path / "trk" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    assert run.info.run_id == first and run.info.status == "FINISHED"
    history = client.get_metric_history(first, "train.loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5)]
    assert run.data.tags["resumed_after"] == "1"
    assert json.loads((cell_dir / L.TRACKERS_FILE).read_text())["mlflow"]["run_id"] == first

    # Only the evaluation redone (training was over): the same run gets the final metrics.
    evaluate_only = L.CellTrackers(cell_dir, ["mlflow"], header)
    evaluate_only.finish({**rec, "metrics": {"clean": {"acc": 0.5}}})
    assert client.get_run(first).data.metrics["acc"] == 0.5
    # --force: training from epoch 0 is a new run.
    _train(cell_dir, rec, ["mlflow"])
    runs = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}


def test_tensorboard_hparams_session_groups_the_seeds(tmp_path):
    tracker_package("tensorboard")
    recs = [_record(seed=0, acc=0.91), _record(seed=1, acc=0.87)]
    sessions = []
    for rec in recs:
        cell_dir = _cell_dir(tmp_path, rec)
        _train(cell_dir, rec, ["tensorboard"])
        sessions.append(tensorboard_hparams(cell_dir / TR.TENSORBOARD_DIR))
    for rec, s in zip(recs, sessions):
        assert s.hparams["method"] == "sigma_ens" and s.hparams["tau"] == 0.5
        assert s.hparams["seed"] == rec["config"]["seed"] and s.hparams["suite"] == "trk"
        assert s.end_status == "STATUS_SUCCESS"
        assert s.scalars["acc"] == pytest.approx(rec["metrics"]["clean"]["acc"], abs=1e-7)
        assert s.scalars["ood.svhn.msp.auroc"] == pytest.approx(0.85, abs=1e-7)
        assert s.scalar_steps["train.loss"] == [1, 2] and s.scalar_steps["acc"] == [2]
    assert sessions[0].group_name == sessions[1].group_name != ""
    assert sessions[0].group_name == T.TrackedCell.from_record(recs[0], tmp_path).group


@pytest.mark.slow  # wandb starts its service process
def test_wandb_offline_run_has_config_group_and_final_summary(tmp_path, monkeypatch):
    tracker_package("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    recs = [_record(seed=0, acc=0.91), _record(seed=1, acc=0.87)]
    runs = []
    for rec in recs:
        cell_dir = _cell_dir(tmp_path, rec)
        trackers = _train(cell_dir, rec, ["wandb"])
        assert trackers.started
        (folder,) = (cell_dir / "wandb").glob("offline-run-*")
        runs.append(wandb_run(folder))
    for rec, run in zip(recs, runs):
        assert run.run_id == rec["cell_id"] and run.job_type == "sigma_ens"
        assert run.config["method"] == "sigma_ens" and run.config["tau"] == 0.5
        assert run.config["seed"] == rec["config"]["seed"]
        assert run.summary["nll"] == rec["metrics"]["clean"]["nll"]
        assert run.summary["calibration.ts.nll"] == 0.25
        assert set(run.tags) == {"suite:trk", "method:sigma_ens"}
        assert [h["train.loss"] for h in run.history] == [2.0, 1.5]
    assert runs[0].group == runs[1].group and runs[0].name != runs[1].name


@pytest.mark.slow  # wandb starts its service process
def test_a_resumed_cell_continues_its_wandb_run(tmp_path, monkeypatch):
    tracker_package("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    rec = _record()
    cell_dir = _cell_dir(tmp_path, rec)
    header = T.TrackedCell.from_record(rec, cell_dir)
    first = L.CellTrackers(cell_dir, ["wandb"], header)
    log = ProgressLog(cell_dir, 0, 2, "cpu", trackers=first)
    log.write(ROWS[0], images=30)
    log.close()
    first.finish(None)  # the attempt ends after epoch 1 (in the real case: killed)
    _train(cell_dir, rec, ["wandb"], resume_epoch=1)
    folders = sorted((cell_dir / "wandb").glob("offline-run-*"))
    ids = [wandb_run(f).run_id for f in folders]
    assert ids == [rec["cell_id"]] * 2  # one run in two offline folders: `wandb sync` appends
    assert wandb_run(folders[-1]).summary["acc"] == rec["metrics"]["clean"]["acc"]


def test_a_tracker_that_fails_at_the_end_leaves_the_result_alone(tmp_path, caplog):
    class Broken:
        def __init__(self, *args):
            self.state = {}

        def log(self, step, scalars):
            pass

        def finish(self, record):
            raise ConnectionError("server went away")

    rec = _record()
    cell_dir = _cell_dir(tmp_path, rec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(L.TRACKERS._items, "broken", L.Tracker(Broken, "json", "broken"))
        trackers = L.CellTrackers(cell_dir, ["broken"], T.TrackedCell.from_record(rec, cell_dir))
        trackers.start(0)
        trackers.finish(rec)
    assert "tracker broken did not finish: ConnectionError: server went away" in caplog.text


def test_loggers_are_checked_before_a_run(tmp_path, monkeypatch, capsys, write_suite):
    absent = L.Tracker(TR.MLflowLogger, "no_such_package_xyz", "absent")
    monkeypatch.setitem(L.TRACKERS._items, "absent", absent)
    assert L.logger_problems(["nosuch", "absent"]) == [
        "--logger nosuch: unknown tracker 'nosuch'. Valid choices: absent, mlflow, tensorboard, "
        "wandb",
        "--logger absent: the no_such_package_xyz package is not installed; "
        "pip install 'implicit-ensemble-harness[absent]'",
    ]
    suite = write_suite(
        "name: lg\ngrid: {datasets: [digits], backbones: [digits_cnn], methods: [single], "
        "M: [1]}\nrecipe: {epochs: 1, warmup_epochs: 0}\n"
    )
    assert main(["validate", str(suite), "--skip-data", "--logger", "nosuch"]) == 2
    assert "--logger nosuch: unknown" in capsys.readouterr().err
    monkeypatch.delenv(MLFLOW_URI_ENV, raising=False)
    assert main(["validate", str(suite), "--skip-data", "--logger", "mlflow"]) == 0
    # A tracking server that does not answer is named before anything runs.
    tracker_package("mlflow")
    monkeypatch.setenv(MLFLOW_URI_ENV, "http://127.0.0.1:9")  # discard port: nothing listens
    assert main(["validate", str(suite), "--skip-data", "--logger", "mlflow"]) == 2
    err = capsys.readouterr().err
    assert "--logger mlflow: MLFLOW_TRACKING_URI=http://127.0.0.1:9: the tracking server" in err


def test_ci_fails_rather_than_skips_without_a_tracking_server(tmp_path, monkeypatch):
    monkeypatch.setenv(URI_ENV, "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="MLflow server not available"):
        mlflow_server(tmp_path).__enter__()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="HARNESS_REQUIRE_TRACKERS=1"):
        mlflow_server(tmp_path).__enter__()
    with pytest.raises(pytest.fail.Exception, match="no_such_tracker_xyz cannot be imported"):
        tracker_package("no_such_tracker_xyz")
