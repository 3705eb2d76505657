"""The tracker adapters: TensorBoard (with an HParams session), Weights & Biases, MLflow.

Each takes ``(cell_dir, cell, resume_epoch, previous, options, commit)`` — the cell's folder,
what the tracker is told (:class:`harness.storage.tracked.TrackedCell`), the epochs already
trained, the state its run of an earlier attempt left in ``trackers.json`` (None: none), the
run's :class:`harness.storage.tracker_options.TrackerOptions` (user tags, experiment or project,
whether to send the weights) and the git commit of the record's provenance (None: unknown) —
and implements :class:`harness.storage.tracked.TrackerRun`: ``log`` per epoch, ``finish`` with
the record. The optional packages are imported only here, when a tracker is asked for.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.storage.tracked import TrackedCell, final_metrics
from harness.storage.tracker_options import TrackerOptions

TENSORBOARD_DIR = "tensorboard"
WEIGHTS_FILE = "final.pt"  # the cell's final weights (harness.engine.runner), sent by --log-model


def told(options: TrackerOptions, commit: str | None) -> dict[str, str]:
    """What every tracker is told beyond the cell: the commit (``git_commit``, when known) and
    the user's tags."""
    return {**({"git_commit": commit} if commit else {}), **options.user_tags}


def finals_to_log(
    record: Mapping, step: int, last: tuple[int, Mapping[str, float]] | None
) -> dict[str, float]:
    """The record's final metrics a series-keeping tracker logs at ``step``: all of them but
    those the last epoch row already logged at that step with the same value (the epochs'
    ``val.acc`` and the record's final one are one series: the point is not written twice)."""
    final = final_metrics(record)
    if last is None or last[0] != step:
        return final
    return {k: v for k, v in final.items() if last[1].get(k) != v}


def weights_to_send(cell_dir: Path, options: TrackerOptions, record: Mapping | None) -> Path | None:
    """The cell's ``final.pt`` when ``--log-model`` asked for it and the cell is done."""
    path = Path(cell_dir) / WEIGHTS_FILE
    wanted = options.log_model and record is not None and record.get("status") == "done"
    return path if wanted and path.is_file() else None


def _tb_value(value: Any) -> bool | float | str:
    """A parameter as the HParams plugin takes it: bool, number or text."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)
    return json.dumps(value, sort_keys=True)


class TensorBoardLogger:
    """TensorBoard events in ``<cell>/tensorboard/`` and one HParams session per cell attempt
    (its hyper-parameters: ``tracked.cell_params``; its group: the configuration, so the HParams
    dashboard groups the seeds; the commit and the user's tags as ``git_commit`` and
    ``tag.<key>``). A resumed run hides the events a killed run wrote after its checkpoint, a
    fresh start every epoch of an earlier attempt (``purge_step``). TensorBoard keeps no files:
    ``--log-model`` does not apply to it."""

    def __init__(
        self,
        cell_dir: Path,
        cell: TrackedCell,
        resume_epoch: int,
        previous: Mapping | None,
        options: TrackerOptions | None = None,
        commit: str | None = None,
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the optional package

        self.cell = cell
        self.step = resume_epoch
        self.last: tuple[int, Mapping[str, float]] | None = None  # the last epoch row logged
        self.state: dict[str, Any] = {}
        self.writer = SummaryWriter(
            log_dir=str(Path(cell_dir) / TENSORBOARD_DIR), purge_step=resume_epoch + 1
        )
        from tensorboard.plugins.hparams import plugin_data_pb2

        start = plugin_data_pb2.SessionStartInfo(group_name=cell.group, start_time_secs=time.time())
        extra = told(options or TrackerOptions(), commit)
        tags = {k if k == "git_commit" else f"tag.{k}": v for k, v in extra.items()}
        for key, value in {**cell.params, "suite": cell.suite, **tags}.items():
            v = _tb_value(value)
            if isinstance(v, bool):
                start.hparams[key].bool_value = v
            elif isinstance(v, float):
                start.hparams[key].number_value = v
            else:
                start.hparams[key].string_value = v
        self._hparams_summary("session_start_info", plugin_data_pb2.HParamsPluginData(
            session_start_info=start))  # fmt: skip

    def _hparams_summary(self, kind: str, data: Any) -> None:
        """One HParams plugin summary (``_hparams_/<kind>``), as TensorBoard's own
        ``hparams.summary`` writes it, without importing TensorFlow."""
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import metadata

        value = Summary.Value(
            tag=f"_hparams_/{kind}", metadata=metadata.create_summary_metadata(data)
        )
        self.writer.file_writer.add_summary(Summary(value=[value]), self.step)
        self.writer.flush()

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.step, self.last = step, (step, dict(scalars))
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, record: Mapping[str, Any] | None) -> None:
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

        if record is not None:
            self.step = max(self.step, len(record.get("history") or []))
            for key, value in finals_to_log(record, self.step, self.last).items():
                self.writer.add_scalar(key, value, self.step)
        failed = record is not None and record.get("status") != "done"
        status = "STATUS_FAILURE" if failed else "STATUS_SUCCESS"
        end = plugin_data_pb2.SessionEndInfo(
            status=api_pb2.Status.Value(status), end_time_secs=time.time()
        )
        self._hparams_summary("session_end_info", plugin_data_pb2.HParamsPluginData(
            session_end_info=end))  # fmt: skip
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run, written under ``<cell>/wandb/``: offline (nothing is sent;
    ``wandb sync`` uploads it when a network is there) unless ``WANDB_MODE`` is set; the project
    is ``--wandb-project``, else ``$WANDB_PROJECT``, else ``implicit-ensemble-harness``.

    Its config is ``tracked.cell_params`` with ``git_commit`` and each user tag as
    ``tag.<key>``; name: the label; group: the configuration; job type: the method; tags
    ``suite:NAME``, ``method:NAME`` and ``key:value`` per user tag (W&B cuts a tag at 64
    characters; the config keeps it whole); the summary gets ``tracked.final_metrics``; with
    ``--log-model``, ``final.pt`` as a ``model`` artifact. A resumed cell continues the run
    (same id, ``resume="allow"``: ``wandb sync`` appends the offline folders of one id in
    order)."""

    def __init__(
        self,
        cell_dir: Path,
        cell: TrackedCell,
        resume_epoch: int,
        previous: Mapping | None,
        options: TrackerOptions | None = None,
        commit: str | None = None,
    ) -> None:
        import wandb

        if previous and previous.get("id"):
            run_id, attempt = str(previous["id"]), int(previous.get("attempt", 1))
            if not resume_epoch and not previous.get("continue"):  # a fresh start: a new run
                attempt += 1
                run_id = f"{cell.cell_id}-{attempt}"
        else:
            run_id, attempt = cell.cell_id, 1
        self.options = options or TrackerOptions()
        self.cell_dir = Path(cell_dir)
        self.cell_id = cell.cell_id
        self.state: dict[str, Any] = {"id": run_id, "attempt": attempt}
        extra = told(self.options, commit)
        user = [f"{k}:{v}"[:64] for k, v in self.options.user_tags.items()]
        self.run = wandb.init(
            project=self.options.project(),
            id=run_id,
            resume="allow",
            name=cell.label,
            group=cell.group_within(128),  # W&B's limit
            job_type=cell.method,
            tags=[f"suite:{cell.suite}"[:64], f"method:{cell.method}"[:64], *user],
            dir=str(cell_dir),
            mode=os.environ.get("WANDB_MODE") or "offline",
            config={
                **cell.params,
                "suite": cell.suite,
                "cell_id": cell.cell_id,
                "config_id": cell.config_id,
                "resumed_after": resume_epoch,
                **{k if k == "git_commit" else f"tag.{k}": v for k, v in extra.items()},
            },
            allow_val_change=True,  # resumed_after changes when a resumed run continues
            reinit="create_new",  # one process may train several cells
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def finish(self, record: Mapping[str, Any] | None) -> None:
        import wandb

        if record is not None:
            self.run.summary.update({**final_metrics(record), "status": record.get("status")})
        weights = weights_to_send(self.cell_dir, self.options, record)
        if weights is not None:
            model = wandb.Artifact(f"model-{self.cell_id}", type="model")
            model.add_file(str(weights))
            self.run.log_artifact(model)
        failed = record is not None and record.get("status") != "done"
        self.run.finish(exit_code=1 if failed else 0)
        # finish() returns once the service has the exit record, not once the run's .wandb
        # transaction log is written and closed (wandb 0.31 writes it later, seen as a header-only
        # file); teardown waits for that. A process trains one cell at a time, so no other run is
        # open, and wandb's own atexit teardown is unreliable in multiprocessing workers.
        wandb.teardown()


def mlflow_tracking_uri(results_dir: Path, options: TrackerOptions | None = None) -> str:
    """The tracking server of ``options`` (else ``$MLFLOW_TRACKING_URI``), else the file store
    ``<results>/mlruns``."""
    given = (options or TrackerOptions()).tracking_uri()
    return given or (Path(results_dir) / "mlruns").resolve().as_uri()


class MLflowLogger:
    """An MLflow run on the tracking server of ``options`` (else ``$MLFLOW_TRACKING_URI``) or in
    the file store ``<results>/mlruns``, in the experiment ``--mlflow-experiment`` (else
    ``$MLFLOW_EXPERIMENT_NAME``, else the suite's name).

    Parameters: ``tracked.cell_params``; run name: the label; tags: ``TrackedCell.tags``
    (``group`` groups the seeds), the user's tags, ``git_commit`` (and MLflow's own
    ``mlflow.source.git.commit``, which its UI shows); metrics: each epoch's scalars by step,
    then ``tracked.final_metrics``; artifacts: ``record.json`` and, with ``--log-model``,
    ``model/final.pt``; status FINISHED or FAILED as the record. A resumed attempt sets the
    commit and tags again: the code that finished the cell is the one named.
    """

    def __init__(
        self,
        cell_dir: Path,
        cell: TrackedCell,
        resume_epoch: int,
        previous: Mapping | None,
        options: TrackerOptions | None = None,
        commit: str | None = None,
    ) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.cell_dir = Path(cell_dir)
        self.options = options or TrackerOptions()
        uri = mlflow_tracking_uri(cell.results_dir, self.options)
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode behind this switch; it is the
            # store that needs no server or database, what a cluster's results folder can hold.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        extra = told(self.options, commit)
        if commit and commit != "unknown":  # MLflow's own field wants the bare hash
            extra["mlflow.source.git.commit"] = commit.split("+")[0]
        resumable = previous and previous.get("tracking_uri") == uri and previous.get("run_id")
        if resumable and (resume_epoch or previous.get("continue")):
            self.run_id = str(previous["run_id"])
            self.client.update_run(self.run_id, status="RUNNING")
            tags = {**extra, "resumed_after": str(resume_epoch)}
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        else:
            if resumable and self.client.get_run(previous["run_id"]).info.status == "RUNNING":
                self.client.set_terminated(previous["run_id"], "KILLED")  # a killed attempt's
            experiment = self._experiment(self.options.experiment(cell.suite))
            tags = {**cell.tags, **extra, "resumed_after": str(resume_epoch)}
            self.run_id = self.client.create_run(
                experiment, run_name=cell.label, tags=tags
            ).info.run_id
            params = [Param(k, _param_text(v)) for k, v in cell.params.items()]
            self.client.log_batch(self.run_id, params=params)
        self.state: dict[str, Any] = {"tracking_uri": uri, "run_id": self.run_id}
        self.last: tuple[int, Mapping[str, float]] | None = None  # the last epoch row logged

    def _experiment(self, name: str) -> str:
        """The id of the experiment ``name``, created if absent. Worker processes and Slurm
        tasks start cells at once: the loser of a creation race reads the winner's."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_metric_key(k), v, now, step) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.last = (step, dict(scalars))

    def finish(self, record: Mapping[str, Any] | None) -> None:
        from mlflow.entities import Metric, RunTag

        status = "FINISHED"
        if record is not None:
            step = len(record.get("history") or [])
            now = int(time.time() * 1000)
            final = finals_to_log(record, step, self.last)
            metrics = [Metric(_metric_key(k), v, now, step) for k, v in final.items()]
            self.client.log_batch(
                self.run_id, metrics=metrics, tags=[RunTag("status", str(record.get("status")))]
            )
            if (self.cell_dir / "record.json").is_file():
                self.client.log_artifact(self.run_id, str(self.cell_dir / "record.json"))
            if (weights := weights_to_send(self.cell_dir, self.options, record)) is not None:
                self.client.log_artifact(self.run_id, str(weights), artifact_path="model")
            status = "FINISHED" if record.get("status") == "done" else "FAILED"
        self.client.set_terminated(self.run_id, status)


def _param_text(value: Any) -> str:
    """A parameter as MLflow stores it (text): strings as they are, None as ``None``, the rest
    as JSON (``0.5``, ``true``, ``[1, 2]``)."""
    if value is None:
        return "None"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _metric_key(key: str) -> str:
    """MLflow's metric names allow letters, digits, ``_ - . / `` and spaces."""
    return re.sub(r"[^\w\-. /]", "_", key)
