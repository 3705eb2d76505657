"""Post-hoc calibration in the leaderboard: the calibrated columns, the conformal columns, the
reliability bins the figure draws, and ``single+TS`` as a configuration of its own.

A record's ``metrics.calibration`` (docs/records.md; :mod:`harness.metrics.posthoc`) becomes,
in its row:

- ``ts/<metric>``: the pool-then-calibrate metrics (``nll``, ``ece``, ``brier``, ``aece``,
  ``aurc`` on the clean test set; ``cNLL``, ``cECE`` over the corruptions) and ``ts/temperature``;
  ``ts_members/<metric>`` likewise for calibrate-then-pool when it was fitted;
- ``ood_ts/<set>/<score>/<metric>``: OOD detection by the calibrated MSP and entropy;
- ``cp/<thr|aps|raps>/<coverage|size>`` on the clean test set and ``cp/<name>/c_coverage`` /
  ``c_size`` averaged over the corruptions (coverage under shift);
- ``rel/<view>/<count|conf|correct>/<bin>``: per reliability bin, the number of samples and the
  sums of their confidences and correctness, for ``raw`` (the ensemble), ``members`` (all
  members pooled) and ``ts`` (the ensemble after scaling). Sums, so a configuration's diagram
  pools its seeds by adding them.

:func:`with_posthoc_rows` then adds, for every done ``single`` cell with a calibration, a row of
the configuration ``single+TS``: its quality columns are the calibrated ones. It is the baseline a
reader compares an ensemble against (Guo et al., 2017; Ovadia et al., 2019), so it gets its own
line in the leaderboard and in the paired table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

#: Clean-set metrics a temperature changes (accuracy does not: it is checked equal).
TS_CLEAN = ("nll", "ece", "brier", "aece", "aurc")
#: Corruption means a temperature changes, by the raw column they stand beside.
TS_CORRUPTION = {"cNLL": "nll", "cECE": "ece"}
CONFORMAL = ("thr", "aps", "raps")
VIEWS = ("ts", "ts_members")
N_BINS = 15
STATS = ("count", "conf", "correct")
#: The method name of the derived temperature-scaled single-model rows.
SINGLE_TS = "single+TS"


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _bins(prefix: str, bins: list[Mapping[str, Any]]) -> dict[str, float]:
    """``rel/<prefix>/<stat>/<b>`` sums over one or more reliability-bin dicts."""
    count = np.zeros(N_BINS)
    conf = np.zeros(N_BINS)
    correct = np.zeros(N_BINS)
    for b in bins:
        n = np.array([_num(v) for v in (b.get("count") or [])][:N_BINS], dtype=float)
        if len(n) != N_BINS:
            return {}
        c = np.array([_num(v) if v is not None else 0.0 for v in b.get("confidence") or []])
        a = np.array([_num(v) if v is not None else 0.0 for v in b.get("accuracy") or []])
        if len(c) != N_BINS or len(a) != N_BINS:
            return {}
        count += n
        conf += c * n
        correct += a * n
    out = {}
    for stat, values in zip(STATS, (count, conf, correct)):
        for i, v in enumerate(values):
            out[f"rel/{prefix}/{stat}/{i:02d}"] = float(v)
    return out


def calibration_columns(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The columns above of one record's ``metrics`` (none for a record without them)."""
    row: dict[str, float] = {}
    clean = metrics.get("clean") or {}
    if isinstance(clean.get("reliability"), Mapping):
        row.update(_bins("raw", [clean["reliability"]]))
    members = [b for b in clean.get("reliability_members") or [] if isinstance(b, Mapping)]
    if members:
        row.update(_bins("members", members))
    cal = metrics.get("calibration")
    if not isinstance(cal, Mapping):
        return row
    row["ts/temperature"] = _num(cal.get("temperature"))
    for view in VIEWS:
        block = cal.get(view) or {}
        if not isinstance(block, Mapping):
            continue
        view_clean = block.get("clean") or {}
        for k in TS_CLEAN:
            row[f"{view}/{k}"] = _num(view_clean.get(k))
        mean = (block.get("corruption") or {}).get("mean") or {}
        for col, k in TS_CORRUPTION.items():
            row[f"{view}/{col}"] = _num(mean.get(k))
        if view == "ts" and isinstance(view_clean.get("reliability"), Mapping):
            row.update(_bins("ts", [view_clean["reliability"]]))
        for ood_set, scores in (block.get("ood") or {}).items():
            for score, values in (scores or {}).items():
                for k, v in (values or {}).items():
                    row[f"ood_ts/{ood_set}/{score}/{k}"] = _num(v)
    for name, block in (cal.get("conformal") or {}).items():
        clean_sets = (block or {}).get("clean") or {}
        shifted = ((block or {}).get("corruption") or {}).get("mean") or {}
        for k in ("coverage", "size"):
            row[f"cp/{name}/{k}"] = _num(clean_sets.get(k))
            row[f"cp/{name}/c_{k}"] = _num(shifted.get(k))
    return row


def with_posthoc_rows(cells: pd.DataFrame) -> pd.DataFrame:
    """``cells`` plus a ``single+TS`` row for every done ``single`` cell with a calibration.

    The derived row keeps the cell's identity (dataset, backbone, M, seed, variant: it pairs with
    the same seeds of other methods), takes ``single+TS`` as its method and ``<cell_id>+ts`` as
    its id, and its raw quality columns are the calibrated ones (accuracy is the same by
    construction); OOD columns become the calibrated MSP and entropy scores, and the mutual
    information (zero for one model) is left out.
    """
    if cells.empty or "ts/nll" not in cells or "method" not in cells:
        return cells
    pick = (cells["method"] == "single") & (cells["status"] == "done") & cells["ts/nll"].notna()
    if not pick.any():
        return cells
    derived = cells[pick].copy()
    derived["method"] = SINGLE_TS
    derived["cell_id"] = derived["cell_id"].astype(str) + "+ts"
    for k in TS_CLEAN:
        derived[k] = derived[f"ts/{k}"]
    for col in TS_CORRUPTION:
        derived[col] = derived[f"ts/{col}"]
    for col in [c for c in cells.columns if c.startswith("ood/")]:
        ts_col = "ood_ts/" + col[len("ood/") :]
        derived[col] = derived.get(ts_col, math.nan)
    for col in [c for c in cells.columns if c.startswith(("ood_near/", "ood_far/"))]:
        derived[col] = math.nan  # the group means are of the raw scores
    for view in ("raw",):  # the diagram of single+TS: its scaled bins are its own
        for stat in STATS:
            for i in range(N_BINS):
                key, ts_key = f"rel/{view}/{stat}/{i:02d}", f"rel/ts/{stat}/{i:02d}"
                if key in derived and ts_key in derived:
                    derived[key] = derived[ts_key]
    return pd.concat([cells, derived], ignore_index=True)
