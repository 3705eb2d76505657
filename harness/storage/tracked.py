"""What a tracker is told about a cell, and what it is sent at the end.

:class:`TrackedCell` (from the record's header, before the cell trains): the suite, the cell's
id and label, its configuration as flat parameters (:func:`cell_params`) and its group — the
configuration without the seed (:func:`config_id`). :func:`final_metrics`: every final number of
a finished record, read generically. :class:`TrackerRun`: what each tracker adapter
(:mod:`harness.storage.trackers`) implements. The seam that opens them is
:mod:`harness.storage.loggers`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.contract import Cell, label_of
from harness.contract.config import identity_recipe


def config_id(config: Mapping[str, Any]) -> str:
    """16 hex digits identifying a configuration whatever its seed: the SHA-256 of the canonical
    JSON of the record's ``config`` without ``seed`` and the speed-only recipe fields (the cell
    id's recipe, :data:`harness.contract.SPEED_ONLY_RECIPE`). Seeds of one configuration share it.
    """
    cfg = {k: v for k, v in config.items() if k != "seed"}
    recipe = cfg.get("recipe")
    if isinstance(recipe, Mapping):  # as the cell id hashes it: records with and without
        cfg["recipe"] = identity_recipe(recipe)  # `processes: 1` are one configuration
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

    def group_within(self, limit: int) -> str:
        """:attr:`group` in at most ``limit`` characters (W&B allows 128): the readable part is
        cut, the configuration's hash after ``#`` is kept, so groups stay distinct."""
        if len(self.group) <= limit:
            return self.group
        base, _, digest = self.group.rpartition("#")
        return f"{base[: max(limit - len(digest) - 1, 0)]}#{digest}"[-limit:]

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
    # Lists — per-member values, one entry per corruption × severity, reliability bins — are
    # left to the record (an artifact on MLflow): the numbers beside them summarise them.


def final_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number of a record's ``metrics`` and ``cost`` blocks, flat.

    Walked generically, so a new block (a calibrated one, another OOD set) reaches the trackers
    without a change here: the ``clean`` block's numbers keep their names (``acc``, ``nll``,
    ``ece``…); every other block is a prefix (``val.acc``, ``corruption.mean.acc``,
    ``corruption.per_severity.3.ece``, ``ood.<set>.<score>.auroc``, ``calibration.ts.nll``…);
    the cost block's under ``cost.`` (``cost.params_total``). Booleans, NaN/inf (a diverged
    metric) and lists (per-member values, corruption cells, reliability bins) are left out.
    """
    out: dict[str, float] = {}
    for block, value in (record.get("metrics") or {}).items():
        _walk(value, "" if block == "clean" else str(block), out)
    _walk(record.get("cost") or {}, "cost", out)
    return out


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
