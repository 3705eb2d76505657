"""Columns a record yields beyond the basic flattening: per corruption, near/far OOD, conditions.

:func:`extra_columns` is called by :func:`reports.flatten.flatten_record` for every record, so
every row of the cell frame carries (NaN/empty when the record has no such data):

- ``corr/<corruption>/acc|nll|ece``: the mean over the severities evaluated of that corruption;
  ``corr_severity_acc``: JSON {corruption: {severity: acc}} (for the mCE's common severities);
- ``corruption_mean_over``: the record's sentence saying which corruptions cAcc/cNLL/cECE average
  (``metrics.corruption.corruption_mean_over``), and ``mce_over``: the corruptions that count in
  the mCE (the benchmark ones, ``metrics.corruption.mean_corruptions``, else all evaluated);
- ``ood_near/<score>/<metric>`` and ``ood_far/<score>/<metric>``: the mean over the near or far OOD
  sets of :mod:`reports.ood_groups` that the record has;
- ``cost_device``, ``cost_precision``: what the cost was measured on (``cost.device`` /
  ``cost.precision``, else ``environment.device``); ``shared_device``: 1.0 when other cells ran on
  the same device while this one measured its throughput, 0.0 when not, NaN when not recorded;
- ``train_device_h``: training wall time in device-hours (``cost.train_time_s`` / 3600, one device
  per cell), named by ``cost_device`` on the page ("GPU-hours" on a GPU).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from reports.ood_groups import ood_kind

# ... and "diagnostics_shown": the diagnostics the records declare, as JSON (reports.flatten),
# joined per configuration so reports.columns.diagnostic_columns reads them from the summary.
TEXT = ("cost_device", "cost_precision", "corruption_mean_over", "mce_over", "diagnostics_shown")


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def corruption_columns(corruption: Mapping[str, Any]) -> dict[str, Any]:
    """``corr/<name>/<metric>`` means over severities, and which corruptions the means cover."""
    row: dict[str, Any] = {}
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for cell in corruption.get("cells") or []:
        if isinstance(cell, Mapping) and isinstance(cell.get("corruption"), str):
            by_name.setdefault(cell["corruption"], []).append(cell)
    for name, cells in by_name.items():
        for k in ("acc", "nll", "ece"):
            row[f"corr/{name}/{k}"] = _mean([_num(c.get(k)) for c in cells])
    # Per severity, for the mCE over the severities a cell and its baseline share (JSON text:
    # one column, not corruptions × severities numeric columns in every export).
    row["corr_severity_acc"] = json.dumps(
        {n: {str(c.get("severity")): _num(c.get("acc")) for c in cs} for n, cs in by_name.items()},
        sort_keys=True,
    )
    row["corruption_mean_over"] = str(corruption.get("corruption_mean_over") or "")
    used = corruption.get("mean_corruptions") or list(by_name)
    row["mce_over"] = ", ".join(str(c) for c in used if c in by_name)
    return row


def ood_group_columns(rec: Mapping[str, Any]) -> dict[str, float]:
    """``ood_near/<score>/<metric>`` and ``ood_far/...``: means over each group's sets."""
    dataset = str((rec.get("config") or {}).get("dataset", ""))
    ood = (rec.get("metrics") or {}).get("ood") or {}
    values: dict[str, list[float]] = {}
    for ood_set, scores in ood.items():
        kind = ood_kind(dataset, str(ood_set), rec)
        if kind is None or not isinstance(scores, Mapping):
            continue
        for score, metrics in scores.items():
            for metric, v in (metrics or {}).items():
                values.setdefault(f"ood_{kind}/{score}/{metric}", []).append(_num(v))
    return {k: _mean(v) for k, v in values.items()}


def condition_columns(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Device, precision and contention of the cost numbers; training time in device-hours."""
    cost = rec.get("cost") or {}
    device = cost.get("device") or (rec.get("environment") or {}).get("device") or ""
    shared = cost.get("shared_device")
    return {
        "cost_device": str(device),
        "cost_precision": str(cost.get("precision") or ""),
        "shared_device": float(shared) if isinstance(shared, bool) else math.nan,
        "train_device_h": _num(cost.get("train_time_s")) / 3600,
    }


def extra_columns(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Every extra column of one record (see the module docstring)."""
    corruption = (rec.get("metrics") or {}).get("corruption") or {}
    return {
        **corruption_columns(corruption),
        **ood_group_columns(rec),
        **condition_columns(rec),
    }
