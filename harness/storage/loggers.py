"""Experiment trackers: where a cell's configuration, epochs and final metrics go besides its files.

:class:`harness.storage.progress.ProgressLog` writes ``progress.csv`` (always) and hands every
epoch row's finite scalars to each tracker named in ``$HARNESS_LOGGERS`` (comma-separated;
``harness run --logger NAME``, repeatable, sets it, and local workers and Slurm tasks inherit it):

=========== ==========================================================================
tensorboard TensorBoard events in ``<cell>/tensorboard/`` (``--tensorboard`` is the same), with
            an HParams session per cell (``tensorboard --logdir results/<suite>``)
wandb       Weights & Biases, offline unless ``WANDB_MODE`` says otherwise: ``<cell>/wandb/
            offline-run-*`` (``wandb sync`` uploads it later)
mlflow      MLflow: the tracking server of ``MLFLOW_TRACKING_URI`` when set (e.g.
            ``http://127.0.0.1:5000`` for ``mlflow server --backend-store-uri sqlite:///…``),
            else the local file store ``<results>/mlruns``; one experiment per suite
=========== ==========================================================================

Every tracker gets what it needs to compare runs (:class:`TrackedCell`):

- the cell's configuration as flat, readable parameters (:func:`cell_params`): ``dataset``,
  ``backbone``, ``method``, ``M``, ``seed``, every method hyper-parameter under its own name
  (``tau``, ``lam``), ``backbone.<kwarg>`` and ``recipe.<field>``;
- the run named by the cell's label (``digits/digits_cnn/sigma_ens(M=4,tau=0.5)/seed0``);
- the seeds of one configuration grouped: W&B's ``group``, the MLflow tag ``group``, the
  TensorBoard HParams session group — the label without its seed and 8 hex digits of the
  configuration's hash without the seed (:func:`config_id`), so two configurations that share a
  label (another recipe in another results folder) are never one group;
- tags for the suite and the method (W&B ``suite:NAME``/``method:NAME``, MLflow tags);
- at the end, every final number of the record (:func:`final_metrics`, read generically from its
  ``metrics`` and ``cost`` blocks): W&B's run summary, MLflow metrics (and ``record.json`` as an
  artifact), TensorBoard scalars and the HParams session's end.

A cell that resumes (from its epoch checkpoint, or only to redo the evaluation) continues its
tracker run instead of opening a second one: ``<cell>/trackers.json`` keeps each tracker's run
id (W&B's run id, MLflow's run id and tracking URI). A cell that starts training from epoch 0
opens a new run (the run of an earlier attempt keeps its own history).

A tracker is a factory ``(cell_dir, cell, resume_epoch, previous) -> TrackerRun`` in
:data:`LOGGERS`; adding one is an entry there. The optional packages are imported only by the
trackers asked for (``pip install .[wandb]`` / ``.[mlflow]`` / ``.[tensorboard]``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.contract import SPEED_ONLY_RECIPE, Cell, label_of
from harness.storage.records import atomic_write_text

log = logging.getLogger("harness")

LOGGERS_ENV = "HARNESS_LOGGERS"
TENSORBOARD_DIR = "tensorboard"
WANDB_PROJECT = "implicit-ensemble-harness"
TRACKERS_FILE = "trackers.json"  # each tracker's run id, so a resumed cell continues its run
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"


# --- what a tracker is told about a cell ------------------------------------------------------


def config_id(config: Mapping[str, Any]) -> str:
    """16 hex digits identifying a configuration whatever its seed: the SHA-256 of the canonical
    JSON of the record's ``config`` without ``seed`` and the speed-only recipe fields (the cell
    id's recipe, :data:`harness.contract.SPEED_ONLY_RECIPE`). Seeds of one configuration share it.
    """
    cfg = {k: v for k, v in config.items() if k != "seed"}
    recipe = cfg.get("recipe")
    if isinstance(recipe, Mapping):
        cfg["recipe"] = {k: v for k, v in recipe.items() if k not in SPEED_ONLY_RECIPE}
    blob = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cell_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration of a record (its ``config``) as flat parameters, in this order:
    ``dataset``, ``backbone``, ``method``, ``M``, ``seed``, each method hyper-parameter under its
    own name (``hparams.<name>`` if that name is one of the five before it),
    ``backbone.<kwarg>``, ``recipe.<field>``. Values keep their JSON types (None stays None)."""
    out: dict[str, Any] = {k: config.get(k) for k in ("dataset", "backbone", "method", "M", "seed")}
    for name, value in sorted((config.get("hparams") or {}).items()):
        out[f"hparams.{name}" if name in out else name] = value
    for name, value in sorted((config.get("backbone_kwargs") or {}).items()):
        out[f"backbone.{name}"] = value
    for name, value in (config.get("recipe") or {}).items():
        out[f"recipe.{name}"] = value
    return out


@dataclass(frozen=True)
class TrackedCell:
    """What a tracker is told about a cell before it trains.

    Attributes:
        suite: the suite's name (one tracker experiment / project grouping per suite).
        cell_id: the cell's 16-hex id (its folder's name).
        label: the cell's human name; the tracker run's name.
        group: the label without the seed, ``#`` and 8 hex digits of :func:`config_id`.
        config_id: :func:`config_id` of the cell's configuration (a tag, for exact filtering).
        method: the method's name.
        params: :func:`cell_params` of the configuration.
        results_dir: the suite's results folder (MLflow's file store lives there).
    """

    suite: str
    cell_id: str
    label: str
    group: str
    config_id: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    results_dir: Path = Path(".")

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], cell_dir: Path) -> TrackedCell:
        """From a record (or the header :func:`harness.contract.new_record` makes before the
        cell trains): its suite, id, label and ``config``."""
        config = rec.get("config") or {}
        cid = config_id(config)
        label = label_of(rec) if config else Path(cell_dir).name
        seed_suffix = f"/seed{config.get('seed')}"
        base = label[: -len(seed_suffix)] if label.endswith(seed_suffix) else label
        return cls(
            suite=str(rec.get("suite") or Path(cell_dir).parent.name),
            cell_id=str(rec.get("cell_id") or Path(cell_dir).name),
            label=label,
            group=f"{base}#{cid[:8]}",
            config_id=cid,
            method=str(config.get("method", "?")),
            params=cell_params(config),
            results_dir=Path(cell_dir).parent,
        )

    @classmethod
    def from_cell_dir(cls, cell_dir: Path) -> TrackedCell:
        """From the cell's ``cell.json`` (written before it trains); a folder without one (a
        logger used outside the runner) gets the folder's names and no parameters."""
        cell_dir = Path(cell_dir)
        try:
            cell = Cell.from_json(json.loads((cell_dir / "cell.json").read_text()))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return cls(
                suite=cell_dir.parent.name,
                cell_id=cell_dir.name,
                label=cell_dir.name,
                group=cell_dir.name,
                config_id="",
                method="?",
                results_dir=cell_dir.parent,
            )
        header = {
            "suite": cell.suite,
            "cell_id": cell.cell_id,
            "label": cell.label,
            "config": cell.config(),
        }
        return cls.from_record(header, cell_dir)

    @property
    def tags(self) -> dict[str, str]:
        """Tags every tracker that has them gets (MLflow tags; W&B has its own fields)."""
        return {
            "suite": self.suite,
            "method": self.method,
            "group": self.group,
            "config_id": self.config_id,
            "cell_id": self.cell_id,
            "label": self.label,
            "results": str(self.results_dir.resolve()),
        }


def _walk(value: Any, key: str, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        if math.isfinite(value):
            out[key] = float(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _walk(v, f"{key}.{k}" if key else str(k), out)
    elif isinstance(value, list | tuple) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):  # per-member numbers: members.acc.0 … members.acc.M-1
        for i, v in enumerate(value):
            _walk(v, f"{key}.{i}", out)
    # Lists of objects (corruption.cells: one entry per corruption × severity) are left to the
    # record (an artifact on MLflow): their means are the blocks beside them.


def final_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number of a record's ``metrics`` and ``cost`` blocks, flat.

    Walked generically, so a new block (a calibrated one, another OOD set) reaches the trackers
    without a change here: the ``clean`` block's numbers keep their names (``acc``, ``nll``,
    ``ece``, ``members.acc.0``…); every other block is a prefix (``val.acc``,
    ``corruption.mean.acc``, ``corruption.per_severity.3.ece``, ``ood.<set>.<score>.auroc``, …);
    the cost block's under ``cost.`` (``cost.params_total``). Booleans, NaN/inf (a diverged
    metric) and lists of objects are left out.
    """
    out: dict[str, float] = {}
    for block, value in (record.get("metrics") or {}).items():
        _walk(value, "" if block == "clean" else str(block), out)
    _walk(record.get("cost") or {}, "cost", out)
    return out


# --- the trackers ------------------------------------------------------------------------------


class TrackerRun(Protocol):
    """One tracker's run for one cell attempt."""

    #: What identifies the tracker's run (kept in ``trackers.json`` to continue it on resume).
    state: dict[str, Any]

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """``scalars``: an epoch row's finite numbers (train_loss, lr, val_acc, diag_*...)."""
        ...

    def finish(self, record: Mapping[str, Any] | None) -> None:
        """Send the record's final metrics and close: a failed record marks the run failed;
        None closes it as finished with nothing more to send (a log used outside the runner)."""
        ...


def _tb_value(value: Any) -> bool | float | str:
    """A parameter as the HParams plugin takes it: bool, number or text."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)
    return json.dumps(value, sort_keys=True)


class TensorBoardLogger:
    """TensorBoard events in ``<cell>/tensorboard/`` and one HParams session per cell attempt
    (its hyper-parameters: :func:`cell_params`; its group: the configuration, so the HParams
    dashboard groups the seeds). A resumed run hides the events a killed run wrote after its
    checkpoint, a fresh start every epoch of an earlier attempt (``purge_step``)."""

    def __init__(
        self, cell_dir: Path, cell: TrackedCell, resume_epoch: int, previous: Mapping | None
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the optional package

        self.cell = cell
        self.step = resume_epoch
        self.state: dict[str, Any] = {}
        self.writer = SummaryWriter(
            log_dir=str(Path(cell_dir) / TENSORBOARD_DIR), purge_step=resume_epoch + 1
        )
        from tensorboard.plugins.hparams import plugin_data_pb2

        start = plugin_data_pb2.SessionStartInfo(group_name=cell.group, start_time_secs=time.time())
        for key, value in {**cell.params, "suite": cell.suite}.items():
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
        self.step = step
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, record: Mapping[str, Any] | None) -> None:
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

        if record is not None:
            self.step = max(self.step, len(record.get("history") or []))
            for key, value in final_metrics(record).items():
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
    is ``$WANDB_PROJECT``, else ``implicit-ensemble-harness``.

    Its config is :func:`cell_params`; name: the label; group: the configuration; job type: the
    method; tags ``suite:NAME`` and ``method:NAME``; the summary gets :func:`final_metrics`. A
    resumed cell continues the run (same id, ``resume="allow"``: ``wandb sync`` appends the
    offline folders of one id in order)."""

    def __init__(
        self, cell_dir: Path, cell: TrackedCell, resume_epoch: int, previous: Mapping | None
    ) -> None:
        import wandb

        if previous and previous.get("id"):
            run_id, attempt = str(previous["id"]), int(previous.get("attempt", 1))
            if not resume_epoch and not previous.get("continue"):  # a fresh start: a new run
                attempt += 1
                run_id = f"{cell.cell_id}-{attempt}"
        else:
            run_id, attempt = cell.cell_id, 1
        self.state: dict[str, Any] = {"id": run_id, "attempt": attempt}
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or WANDB_PROJECT,
            id=run_id,
            resume="allow",
            name=cell.label,
            group=cell.group[:128],  # W&B's limit; the config id at the end is kept below
            job_type=cell.method,
            tags=[f"suite:{cell.suite}"[:64], f"method:{cell.method}"[:64]],
            dir=str(cell_dir),
            mode=os.environ.get("WANDB_MODE") or "offline",
            config={
                **cell.params,
                "suite": cell.suite,
                "cell_id": cell.cell_id,
                "config_id": cell.config_id,
                "resumed_after": resume_epoch,
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
        failed = record is not None and record.get("status") != "done"
        self.run.finish(exit_code=1 if failed else 0)
        # finish() returns once the service has the exit record, not once the run's .wandb
        # transaction log is written and closed (wandb 0.31 writes it later, seen as a header-only
        # file); teardown waits for that. A process trains one cell at a time, so no other run is
        # open, and wandb's own atexit teardown is unreliable in multiprocessing workers.
        wandb.teardown()


def mlflow_tracking_uri(results_dir: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` (a tracking server), else the file store ``<results>/mlruns``."""
    return os.environ.get(MLFLOW_URI_ENV) or (Path(results_dir) / "mlruns").resolve().as_uri()


class MLflowLogger:
    """An MLflow run in the experiment named by the suite, on the tracking server of
    ``$MLFLOW_TRACKING_URI`` or in the file store ``<results>/mlruns``.

    Parameters: :func:`cell_params`; run name: the label; tags: :attr:`TrackedCell.tags`
    (``group`` groups the seeds); metrics: each epoch's scalars by step, then
    :func:`final_metrics`; artifact: ``record.json``; status FINISHED or FAILED as the record.
    """

    def __init__(
        self, cell_dir: Path, cell: TrackedCell, resume_epoch: int, previous: Mapping | None
    ) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.cell_dir = Path(cell_dir)
        uri = mlflow_tracking_uri(cell.results_dir)
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode behind this switch; it is the
            # store that needs no server or database, what a cluster's results folder can hold.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        resumable = previous and previous.get("tracking_uri") == uri and previous.get("run_id")
        if resumable and (resume_epoch or previous.get("continue")):
            self.run_id = str(previous["run_id"])
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.set_tag(self.run_id, "resumed_after", str(resume_epoch))
        else:
            if resumable and self.client.get_run(previous["run_id"]).info.status == "RUNNING":
                self.client.set_terminated(previous["run_id"], "KILLED")  # a killed attempt's
            experiment = self._experiment(cell.suite)
            tags = {**cell.tags, "resumed_after": str(resume_epoch)}
            self.run_id = self.client.create_run(
                experiment, run_name=cell.label, tags=tags
            ).info.run_id
            params = [Param(k, _param_text(v)) for k, v in cell.params.items()]
            self.client.log_batch(self.run_id, params=params)
        self.state: dict[str, Any] = {"tracking_uri": uri, "run_id": self.run_id}

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

    def finish(self, record: Mapping[str, Any] | None) -> None:
        from mlflow.entities import Metric, RunTag

        status = "FINISHED"
        if record is not None:
            step = len(record.get("history") or [])
            now = int(time.time() * 1000)
            final = final_metrics(record)
            metrics = [Metric(_metric_key(k), v, now, step) for k, v in final.items()]
            self.client.log_batch(
                self.run_id, metrics=metrics, tags=[RunTag("status", str(record.get("status")))]
            )
            if (self.cell_dir / "record.json").is_file():
                self.client.log_artifact(self.run_id, str(self.cell_dir / "record.json"))
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


#: Tracker name → (factory, the module it needs, the extra that installs it).
LOGGERS: dict[str, tuple[Callable[[Path, TrackedCell, int, Mapping | None], TrackerRun], str, str]]
LOGGERS = {
    "tensorboard": (TensorBoardLogger, "tensorboard", "tensorboard"),
    "wandb": (WandbLogger, "wandb", "wandb"),
    "mlflow": (MLflowLogger, "mlflow", "mlflow"),
}


def requested(extra: tuple[str, ...] = ()) -> list[str]:
    """The logger names of ``$HARNESS_LOGGERS`` and ``extra``, in order, each once."""
    names = [n.strip() for n in os.environ.get(LOGGERS_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys([*names, *extra]))


def logger_problems(names: list[str]) -> list[str]:
    """An unknown name, a logger whose package is not installed, or an MLflow tracking server
    (``$MLFLOW_TRACKING_URI``) that does not answer: one line each, before anything runs."""
    out = []
    for name in names:
        if name not in LOGGERS:
            out.append(f"--logger {name}: unknown; valid: {', '.join(LOGGERS)}")
        elif importlib.util.find_spec(LOGGERS[name][1]) is None:
            extra = LOGGERS[name][2]
            out.append(
                f"--logger {name}: the {LOGGERS[name][1]} package is not installed; "
                f"pip install 'implicit-ensemble-harness[{extra}]'"
            )
        elif name == "mlflow" and (problem := mlflow_server_problem()):
            out.append(f"--logger mlflow: {problem}")
    return out


def mlflow_server_problem(timeout: float = 5.0) -> str | None:
    """Why the tracking server of ``$MLFLOW_TRACKING_URI`` cannot take runs (it does not answer
    ``/health``), or None (no server asked for, or it answers)."""
    import urllib.error
    import urllib.request

    uri = os.environ.get(MLFLOW_URI_ENV, "")
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as reply:
            if reply.status == 200:
                return None
            return f"{MLFLOW_URI_ENV}={uri}: /health answered {reply.status}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{MLFLOW_URI_ENV}={uri}: the tracking server does not answer ({reason})"


# --- one cell's trackers -----------------------------------------------------------------------


class CellTrackers:
    """The trackers of one cell attempt, opened once and kept from training to the record.

    :class:`harness.storage.progress.ProgressLog` opens them when training starts
    (:meth:`start`) and hands them every epoch; the runner calls :meth:`finish` with the record
    once it is written. When training was over before this attempt (only the evaluation is
    redone), :meth:`finish` opens them itself, continuing the earlier run.

    Args:
        cell_dir: the cell's folder.
        names: tracker names (default: ``$HARNESS_LOGGERS``).
        cell: what the trackers are told (default: from the folder's ``cell.json``).
    """

    def __init__(
        self,
        cell_dir: Path,
        names: list[str] | None = None,
        cell: TrackedCell | None = None,
    ) -> None:
        self.cell_dir = Path(cell_dir)
        self.names = requested() if names is None else list(names)
        self._cell = cell
        self.runs: dict[str, TrackerRun] = {}
        self.started = False

    def _previous(self) -> dict[str, Any]:
        try:
            found = json.loads((self.cell_dir / TRACKERS_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def start(self, resume_epoch: int, *, continues: bool = False) -> None:
        """Open every tracker's run (once): a new run when training starts at epoch 0, the
        earlier attempt's run when it resumes (``resume_epoch`` > 0 or ``continues``)."""
        if self.started or not self.names:
            self.started = True
            return
        self.started = True
        cell = self._cell or TrackedCell.from_cell_dir(self.cell_dir)
        previous = self._previous()
        for name in self.names:
            before = previous.get(name)
            if continues and isinstance(before, dict):
                before = {**before, "continue": True}
            run = LOGGERS[name][0](self.cell_dir, cell, resume_epoch, before)
            self.runs[name] = run
            previous[name] = run.state
        atomic_write_text(self.cell_dir / TRACKERS_FILE, json.dumps(previous, indent=1) + "\n")

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for run in self.runs.values():
            run.log(step, scalars)

    def finish(self, record: Mapping[str, Any] | None = None) -> None:
        """Final metrics of ``record`` (None: nothing more to send) and close.

        The record is already written when this runs, so a tracker that fails here is named
        in a warning and the cell stays done.
        """
        # A cell that never trained (it failed in setup: data missing) opens no tracker run.
        if not self.started and record is not None and record.get("history") and self.names:
            try:
                self.start(len(record.get("history") or []), continues=True)
            except Exception as exc:  # the record is written: the tracker is not the result
                name = self.cell_dir.name
                log.warning("%s: trackers could not open: %s: %s", name, type(exc).__name__, exc)
        runs, self.runs = self.runs, {}
        for name, run in runs.items():
            try:
                run.finish(record)
            except Exception as exc:  # as above: named, and the other trackers still finish
                why = f"{type(exc).__name__}: {exc}"
                log.warning("%s: tracker %s did not finish: %s", self.cell_dir.name, name, why)


def finite_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of an epoch row that a logger can plot (not the epoch itself, no NaN)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "epoch" and isinstance(v, int | float) and math.isfinite(v)
    }
