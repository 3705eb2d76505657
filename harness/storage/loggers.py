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

Every tracker gets what it needs to compare runs (:class:`harness.storage.tracked.TrackedCell`):

- the cell's configuration as flat, readable parameters (``tracked.cell_params``): ``dataset``,
  ``backbone``, ``method``, ``M``, ``seed``, every method hyper-parameter under its own name
  (``tau``, ``lam``), ``backbone.<kwarg>`` and ``recipe.<field>``;
- the run named by the cell's label (``digits/digits_cnn/sigma_ens(M=4,tau=0.5)/seed0``);
- the seeds of one configuration grouped: W&B's ``group``, the MLflow tag ``group``, the
  TensorBoard HParams session group — the label without its seed and 8 hex digits of the
  configuration's hash without the seed (``tracked.config_id``), so two configurations that
  share a label (another recipe in another results folder) are never one group;
- tags for the suite and the method (W&B ``suite:NAME``/``method:NAME``, MLflow tags);
- at the end, every final number of the record (``tracked.final_metrics``, read generically
  from its ``metrics`` and ``cost`` blocks): W&B's run summary, MLflow metrics (and
  ``record.json`` as an artifact), TensorBoard scalars and the HParams session's end.

A cell that resumes (from its epoch checkpoint, or only to redo the evaluation) continues its
tracker run instead of opening a second one: ``<cell>/trackers.json`` keeps each tracker's run
id (W&B's run id, MLflow's run id and tracking URI). A cell that starts training from epoch 0
opens a new run (the run of an earlier attempt keeps its own history).

A tracker is a factory ``(cell_dir, cell, resume_epoch, previous) -> TrackerRun`` in
:data:`LOGGERS` (the adapters: :mod:`harness.storage.trackers`); adding one is an entry there.
The optional packages are imported only by the trackers asked for (``pip install .[wandb]`` /
``.[mlflow]`` / ``.[tensorboard]``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.storage.records import atomic_write_text
from harness.storage.tracked import TrackedCell, TrackerRun
from harness.storage.trackers import (
    MLFLOW_URI_ENV,
    MLflowLogger,
    TensorBoardLogger,
    WandbLogger,
)

log = logging.getLogger("harness")

LOGGERS_ENV = "HARNESS_LOGGERS"
TRACKERS_FILE = "trackers.json"  # each tracker's run id, so a resumed cell continues its run


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
