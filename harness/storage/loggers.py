"""Per-epoch loggers: where a cell's epoch rows go besides ``progress.csv``.

:class:`harness.storage.progress.ProgressLog` writes ``progress.csv`` (always) and hands every
row's finite scalars to each logger named in ``$HARNESS_LOGGERS`` (comma-separated; ``harness
run --logger NAME``, repeatable, sets it, and local workers and Slurm tasks inherit it):

=========== ==========================================================================
tensorboard TensorBoard events in ``<cell>/tensorboard/`` (``--tensorboard`` is the same)
wandb       Weights & Biases in offline mode: ``<cell>/wandb/offline-run-*`` (``wandb
            sync`` uploads it later); one run per cell attempt, its id the cell id
mlflow      MLflow's local file store ``<results>/mlruns`` (``mlflow ui --backend-store-uri
            file:<results>/mlruns``): one experiment per suite, one run per cell attempt
=========== ==========================================================================

A logger is a class with ``log(step, scalars)`` and ``close()``, made by
``factory(cell_dir, resume_epoch)``; adding one is an entry in :data:`LOGGERS`. The optional
packages are imported only by the loggers asked for (``pip install .[wandb]`` / ``.[mlflow]``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

LOGGERS_ENV = "HARNESS_LOGGERS"
TENSORBOARD_DIR = "tensorboard"
WANDB_PROJECT = "implicit-ensemble-harness"


class EpochLogger(Protocol):
    """Receives one call per finished epoch."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """``scalars``: the epoch row's finite numbers (train_loss, lr, val_acc, diag_*...)."""
        ...

    def close(self) -> None: ...


class TensorBoardLogger:
    """TensorBoard events in ``<cell>/tensorboard/``; a resumed run hides the events a killed
    run wrote after its checkpoint (``purge_step``)."""

    def __init__(self, cell_dir: Path, resume_epoch: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the optional package

        self.writer = SummaryWriter(
            log_dir=str(Path(cell_dir) / TENSORBOARD_DIR),
            purge_step=resume_epoch + 1 if resume_epoch else None,
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run in offline mode, written under ``<cell>/wandb/`` (nothing is sent:
    ``wandb sync`` uploads it when a network is there)."""

    def __init__(self, cell_dir: Path, resume_epoch: int) -> None:
        import wandb

        cell_dir = Path(cell_dir)
        self.run = wandb.init(
            project=WANDB_PROJECT,
            group=cell_dir.parent.name,  # the suite
            name=cell_dir.name,
            dir=str(cell_dir),
            mode="offline",
            config={"cell_id": cell_dir.name, "resumed_after": resume_epoch},
            reinit="create_new",  # one process may train several cells
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() returns once the service has the exit record, not once the run's .wandb
        # transaction log is written and closed (wandb 0.31 writes it later, seen as a header-only
        # file); teardown waits for that. A process trains one cell at a time, so no other run is
        # open, and wandb's own atexit teardown is unreliable in multiprocessing workers.
        wandb.teardown()


class MLflowLogger:
    """An MLflow run in the local file store ``<results>/mlruns`` (experiment: the suite)."""

    def __init__(self, cell_dir: Path, resume_epoch: int) -> None:
        # MLflow 3 keeps the file store in maintenance mode behind this switch; it is the store
        # that needs no server or database, which is what a cluster's results folder can hold.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        cell_dir = Path(cell_dir)
        self.client = MlflowClient(tracking_uri=(cell_dir.parent / "mlruns").resolve().as_uri())
        suite = cell_dir.parent.name
        found = self.client.get_experiment_by_name(suite)
        experiment = found.experiment_id if found else self.client.create_experiment(suite)
        tags = {"cell_id": cell_dir.name, "resumed_after": str(resume_epoch)}
        self.run_id = self.client.create_run(
            experiment, run_name=cell_dir.name, tags=tags
        ).info.run_id

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.client.log_metric(self.run_id, key, value, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


#: Logger name → (factory, the module it needs, the extra that installs it).
LOGGERS: dict[str, tuple[Callable[[Path, int], EpochLogger], str, str]] = {
    "tensorboard": (TensorBoardLogger, "tensorboard", "tensorboard"),
    "wandb": (WandbLogger, "wandb", "wandb"),
    "mlflow": (MLflowLogger, "mlflow", "mlflow"),
}


def requested(extra: tuple[str, ...] = ()) -> list[str]:
    """The logger names of ``$HARNESS_LOGGERS`` and ``extra``, in order, each once."""
    names = [n.strip() for n in os.environ.get(LOGGERS_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys([*names, *extra]))


def logger_problems(names: list[str]) -> list[str]:
    """An unknown name, or a logger whose package is not installed: one line each."""
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
    return out


def make_loggers(cell_dir: Path, resume_epoch: int, names: list[str]) -> list[EpochLogger]:
    """One logger per name (unknown names raise ``KeyError``: the CLI refuses them first)."""
    return [LOGGERS[name][0](cell_dir, resume_epoch) for name in names]


def finite_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of an epoch row that a logger can plot (not the epoch itself, no NaN)."""
    import math

    return {
        k: float(v)
        for k, v in row.items()
        if k != "epoch" and isinstance(v, int | float) and math.isfinite(v)
    }
