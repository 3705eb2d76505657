"""What a run asks of its experiment trackers: which ones, the user's tags, where they log.

:class:`TrackerOptions` is made once, where the run is started (``harness run``'s ``--logger``,
``--tensorboard``, ``--tag``, ``--mlflow-experiment``, ``--wandb-project``, ``--log-model``, or
:func:`harness.api.run`'s arguments), and travels explicitly with the executor's options to
every process that runs a cell: the in-process runner, local worker processes (an argument of
each worker's task) and Slurm array tasks (a field of the pickled task, so in the job's payload).
No environment variable carries the choice.

A setting left unset falls back to the variable its library reads, looked up by
:meth:`TrackerOptions.resolved` in the process that starts the run (so a Slurm task uses what
the command line saw, whatever the cluster exports): ``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``, ``WANDB_PROJECT``. Without either, MLflow logs to the file store
``<results>/<suite>/mlruns`` in the experiment named by the suite, W&B to the project
:data:`WANDB_PROJECT`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
WANDB_PROJECT_ENV = "WANDB_PROJECT"
WANDB_PROJECT = "implicit-ensemble-harness"

#: Tags the harness sets itself (MLflow tags; the W&B and TensorBoard equivalents): a user tag of
#: one of these names would overwrite what the comparison of runs relies on.
RESERVED_TAGS = frozenset(
    {"suite", "method", "group", "config_id", "cell_id", "label", "results", "resumed_after",
     "status", "git_commit"}
)  # fmt: skip
#: MLflow's tag keys: letters, digits, ``_ - . /`` and spaces (W&B and TensorBoard take them too).
_TAG_KEY = re.compile(r"^[\w\-./ ]{1,250}$")


@dataclass(frozen=True)
class TrackerOptions:
    """The trackers a run's cells log to, and what every tracker is told beyond the cell.

    Attributes:
        names: tracker names (``tensorboard``, ``wandb``, ``mlflow``), each once, in order.
        tags: the user's ``(key, value)`` tags (``--tag key=value``), in order: MLflow tags, W&B
            tags ``key:value`` (and config ``tag.<key>``), TensorBoard HParams ``tag.<key>``.
        mlflow_experiment: the MLflow experiment (None: ``$MLFLOW_EXPERIMENT_NAME``, else the
            suite's name).
        mlflow_uri: the MLflow tracking server (None: ``$MLFLOW_TRACKING_URI``, else the file
            store ``<results>/<suite>/mlruns``).
        wandb_project: the W&B project (None: ``$WANDB_PROJECT``, else
            :data:`WANDB_PROJECT`).
        log_model: send each finished cell's ``final.pt`` as an artifact (MLflow, W&B).
    """

    names: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    mlflow_experiment: str | None = None
    mlflow_uri: str | None = None
    wandb_project: str | None = None
    log_model: bool = False

    @classmethod
    def of(
        cls,
        names: Iterable[str] = (),
        tags: Mapping[str, object] | Iterable[tuple[str, object]] = (),
        *,
        tensorboard: bool = False,
        mlflow_experiment: str | None = None,
        wandb_project: str | None = None,
        log_model: bool = False,
    ) -> TrackerOptions:
        """From loose arguments: names in order, each once (``tensorboard`` added for
        ``--tensorboard``); tags from a dict or pairs, values as text."""
        listed = [*names, *(["tensorboard"] if tensorboard else [])]
        pairs = tags.items() if isinstance(tags, Mapping) else tags
        return cls(
            names=tuple(dict.fromkeys(str(n).strip() for n in listed if str(n).strip())),
            tags=tuple((str(k), str(v)) for k, v in pairs),
            mlflow_experiment=mlflow_experiment,
            wandb_project=wandb_project,
            log_model=log_model,
        )

    @property
    def user_tags(self) -> dict[str, str]:
        """The user's tags as a dict (a later ``--tag`` of a key wins)."""
        return dict(self.tags)

    def resolved(self) -> TrackerOptions:
        """These options with every unset location filled from the environment of this
        process (the one that starts the run), so the cells' processes need none of it."""
        if not self.names:
            return self
        return replace(
            self,
            mlflow_uri=self.tracking_uri(),
            mlflow_experiment=self.mlflow_experiment or os.environ.get(MLFLOW_EXPERIMENT_ENV),
            wandb_project=self.project(),
        )

    def tracking_uri(self) -> str | None:
        """The MLflow tracking server asked for, or None (the results folder's file store)."""
        return self.mlflow_uri or os.environ.get(MLFLOW_URI_ENV) or None

    def experiment(self, suite: str) -> str:
        """The MLflow experiment a cell of ``suite`` logs to."""
        return self.mlflow_experiment or os.environ.get(MLFLOW_EXPERIMENT_ENV) or suite

    def project(self) -> str:
        """The W&B project."""
        return self.wandb_project or os.environ.get(WANDB_PROJECT_ENV) or WANDB_PROJECT


def parse_tag(text: str) -> tuple[str, str]:
    """``key=value`` → ``(key, value)`` (the value may be empty and may hold ``=``).

    Raises:
        ValueError: no ``=``, or a key MLflow would refuse (empty, other characters).
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep:
        raise ValueError(f"expected key=value, got {text!r}")
    if not _TAG_KEY.match(key):
        raise ValueError(
            f"tag key {key!r}: use 1-250 letters, digits, spaces and _ - . / (got {text!r})"
        )
    return key, value


def option_problems(options: TrackerOptions) -> list[str]:
    """Settings that would be ignored or would overwrite the harness's own: tags and tracker
    settings without a tracker to take them, a tag key the harness sets, a bad tag key."""
    out = []
    names = set(options.names)
    if options.tags and not names:
        out.append("--tag: only with --logger (the tags go to the trackers)")
    for flag, value, needs in (
        ("--mlflow-experiment", options.mlflow_experiment, {"mlflow"}),
        ("--wandb-project", options.wandb_project, {"wandb"}),
        ("--log-model", options.log_model, {"mlflow", "wandb"}),
    ):
        if value and not names & needs:
            out.append(f"{flag}: only with --logger {' or '.join(sorted(needs))}")
    for key, _ in options.tags:
        if key in RESERVED_TAGS or key.startswith("mlflow."):
            out.append(f"--tag {key}=…: {key!r} is a tag the harness sets; pick another key")
        elif not _TAG_KEY.match(key):
            out.append(f"--tag {key}=…: use 1-250 letters, digits, spaces and _ - . /")
    return out
