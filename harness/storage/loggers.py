"""Experiment trackers: where a cell's configuration, epochs and final metrics go besides its files.

:class:`harness.storage.progress.ProgressLog` writes ``progress.csv`` (always) and hands every
epoch row's finite scalars to the trackers the run asked for: a
:class:`harness.storage.tracker_options.TrackerOptions` made where the run starts (``harness
run --logger NAME``, repeatable, or ``harness.api.run(loggers=...)``) and handed explicitly to
the runner of every cell, in this process, in local worker processes and in Slurm tasks:

=========== ==========================================================================
tensorboard TensorBoard events in ``<cell>/tensorboard/`` (``--tensorboard`` is the same), with
            an HParams session per cell (``tensorboard --logdir results/<suite>``)
wandb       Weights & Biases, offline unless ``WANDB_MODE`` says otherwise: ``<cell>/wandb/
            offline-run-*`` (``wandb sync`` uploads it later), in the project
            ``--wandb-project`` (else ``$WANDB_PROJECT``, else ``implicit-ensemble-harness``)
mlflow      MLflow: the tracking server of ``MLFLOW_TRACKING_URI`` when set (e.g.
            ``http://127.0.0.1:5000`` for ``mlflow server --backend-store-uri sqlite:///…``),
            else the local file store ``<results>/mlruns``; the experiment
            ``--mlflow-experiment`` (else ``$MLFLOW_EXPERIMENT_NAME``, else the suite's name)
=========== ==========================================================================

Every tracker gets what it needs to compare runs (:class:`harness.storage.tracked.TrackedCell`):

- the cell's configuration as flat, readable parameters (``tracked.cell_params``): ``dataset``,
  ``backbone``, ``method``, ``M``, ``seed``, every method hyper-parameter under its own name
  (``tau``, ``lam``), ``backbone.<kwarg>`` and ``recipe.<field>``;
- the run named by the cell's label (``digits/digits_cnn/sigma_ens(M=4,tau=0.5)/seed0``);
- the seeds of one configuration grouped: W&B's ``group``, the MLflow tag ``group``, the
  TensorBoard HParams session group — the label without its seed and 8 hex digits of the
  configuration's hash without the seed (``tracked.config_id``), so two configurations that
  share a label (another recipe in another results folder) are never one group;
- tags for the suite and the method (W&B ``suite:NAME``/``method:NAME``, MLflow tags), the
  user's ``--tag key=value`` tags, and the git commit the record's provenance names
  (``environment.git_commit``: MLflow tag ``git_commit``, W&B config, TensorBoard HParams);
- each epoch's numbers under one name per quantity (:data:`EPOCH_METRICS`): the task loss
  (``train.task_loss``) and the method's diversity term (``train.div_loss``: σN-Ens's λ·L_div)
  apart, beside the objective they sum to (``train.loss``); validation numbers under the names
  the record's final ``val`` block has (``val.acc``), so they are one series;
- at the end, every final number of the record (``tracked.final_metrics``, read generically
  from its ``metrics`` and ``cost`` blocks): W&B's run summary, MLflow metrics (and
  ``record.json`` as an artifact), TensorBoard scalars and the HParams session's end; with
  ``--log-model`` the cell's ``final.pt`` as an artifact too (MLflow, W&B).

A cell that resumes (from its epoch checkpoint, or only to redo the evaluation) continues its
tracker run instead of opening a second one: ``<cell>/trackers.json`` keeps each tracker's run
id (W&B's run id, MLflow's run id and tracking URI). A cell that starts training from epoch 0
opens a new run (the run of an earlier attempt keeps its own history).

A tracker is a factory ``(cell_dir, cell, resume_epoch, previous, options, commit) ->
TrackerRun`` registered in :data:`TRACKERS` (the built-in adapters: :mod:`harness.storage.trackers`)
with :func:`register_tracker`, the registry type and plugin route methods use: a ``--plugin
MODULE`` that calls it at import (worker processes and Slurm tasks import it too), or an
installed distribution's module in the entry-point group ``harness.trackers``. The optional
packages are imported only by the trackers asked for (``pip install .[wandb]`` / ``.[mlflow]``
/ ``.[tensorboard]``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.registry.core import Registry, UnknownNameError
from harness.storage.records import atomic_write_text
from harness.storage.tracked import TrackedCell, TrackerRun
from harness.storage.tracker_options import MLFLOW_URI_ENV, TrackerOptions, option_problems
from harness.storage.trackers import MLflowLogger, TensorBoardLogger, WandbLogger

log = logging.getLogger("harness")

TRACKERS_FILE = "trackers.json"  # each tracker's run id, so a resumed cell continues its run

#: A tracker adapter: ``(cell_dir, cell, resume_epoch, previous, options, commit) -> TrackerRun``.
Factory = Callable[[Path, TrackedCell, int, Mapping | None, TrackerOptions, str | None], TrackerRun]


@dataclass(frozen=True)
class Tracker:
    """A registered tracker: its factory, the package it needs (checked before anything runs;
    None: none) and the extra that installs it."""

    factory: Factory
    package: str | None = None
    extra: str | None = None


#: Tracker name → :class:`Tracker` (``--logger NAME``).
TRACKERS: Registry[Tracker] = Registry(
    "tracker", group="harness.trackers", modules=("harness.storage.loggers",)
)


def register_tracker(
    name: str, factory: Factory, package: str | None = None, extra: str | None = None
) -> Tracker:
    """Make ``--logger name`` send each cell to ``factory`` (what a plugin module calls at
    import). Raises ``DuplicateNameError`` when ``name`` is taken."""
    return TRACKERS.register(name, Tracker(factory, package, extra))


register_tracker("tensorboard", TensorBoardLogger, "tensorboard", "tensorboard")
register_tracker("wandb", WandbLogger, "wandb", "wandb")
register_tracker("mlflow", MLflowLogger, "mlflow", "mlflow")


def logger_problems(names: Sequence[str], mlflow_uri: str | None = None) -> list[str]:
    """An unknown name, a logger whose package is not installed, or an MLflow tracking server
    (``mlflow_uri``) that does not answer: one line each, before anything runs."""
    out = []
    for name in names:
        try:
            tracker = TRACKERS.get(name)
        except UnknownNameError as exc:
            out.append(f"--logger {name}: {exc}")
            continue
        if tracker.package and importlib.util.find_spec(tracker.package) is None:
            install = (
                f"pip install 'implicit-ensemble-harness[{tracker.extra}]'"
                if tracker.extra
                else f"pip install {tracker.package}"
            )
            out.append(
                f"--logger {name}: the {tracker.package} package is not installed; {install}"
            )
        elif name == "mlflow" and (problem := mlflow_server_problem(mlflow_uri)):
            out.append(f"--logger mlflow: {problem}")
    return out


def tracker_problems(options: TrackerOptions) -> list[str]:
    """Everything :func:`logger_problems` and
    :func:`harness.storage.tracker_options.option_problems` find in ``options``; reads the
    environment's fallbacks (``$MLFLOW_TRACKING_URI``), sets nothing."""
    return logger_problems(options.names, options.tracking_uri()) + option_problems(options)


def mlflow_server_problem(uri: str | None, timeout: float = 5.0) -> str | None:
    """Why the tracking server at ``uri`` cannot take runs (it does not answer ``/health``),
    or None (no server asked for, or it answers)."""
    import urllib.error
    import urllib.request

    uri = uri or ""
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


#: ``progress.csv`` column → the tracker metric's name. One name per quantity, in the record's
#: dotted style: the per-epoch validation numbers are named as the record's final ``val`` block
#: (``val.acc``), so the two are one series and not two metrics. ``train_loss`` is the objective
#: (task loss + the method's diversity term); :func:`epoch_metrics` adds ``train.task_loss``.
EPOCH_METRICS = {
    "train_loss": "train.loss",
    "train_reg": "train.div_loss",  # σN-Ens's λ·L_div (negative); 0 for methods without one
    "train_acc": "train.acc",
    "lr": "train.lr",
    "val_acc": "val.acc",
    "val_nll": "val.nll",
    "val_ece": "val.ece",
    "images_per_s": "train.images_per_s",
    "epoch_s": "train.epoch_s",
    "elapsed_s": "train.elapsed_s",
}


def epoch_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """An epoch row (as ``progress.csv`` writes it) as the trackers' metrics: the finite
    numbers under :data:`EPOCH_METRICS`' names, a method diagnostic ``diag_X`` as ``diag.X``,
    and the task loss ``train.task_loss`` = ``train_loss`` − ``train_reg`` (the objective less
    the diversity term: what the members' cross-entropy alone came to)."""
    out = {}
    for key, value in finite_scalars(row).items():
        if key in EPOCH_METRICS:
            out[EPOCH_METRICS[key]] = value
        elif key.startswith("diag_"):
            out[f"diag.{key[len('diag_') :]}"] = value
        else:
            out[key] = value
    if "train.loss" in out:
        out["train.task_loss"] = out["train.loss"] - out.get("train.div_loss", 0.0)
    return out


# --- one cell's trackers -----------------------------------------------------------------------


class CellTrackers:
    """The trackers of one cell attempt, opened once and kept from training to the record.

    :class:`harness.storage.progress.ProgressLog` opens them when training starts
    (:meth:`start`) and hands them every epoch; the runner calls :meth:`finish` with the record
    once it is written. When training was over before this attempt (only the evaluation is
    redone), :meth:`finish` opens them itself, continuing the earlier run.

    Args:
        cell_dir: the cell's folder.
        trackers: the run's :class:`TrackerOptions`, or only tracker names (default: none).
        cell: what the trackers are told (default: from the folder's ``cell.json``).
        commit: the git commit of the code that runs the cell, as the record's provenance
            names it (``environment.git_commit``); None: not told.
    """

    def __init__(
        self,
        cell_dir: Path,
        trackers: TrackerOptions | Sequence[str] = (),
        cell: TrackedCell | None = None,
        commit: str | None = None,
    ) -> None:
        self.cell_dir = Path(cell_dir)
        if not isinstance(trackers, TrackerOptions):
            trackers = TrackerOptions.of(trackers)
        self.options = trackers
        self.names = list(trackers.names)
        self.commit = commit
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
            run = TRACKERS.get(name).factory(
                self.cell_dir, cell, resume_epoch, before, self.options, self.commit
            )
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
