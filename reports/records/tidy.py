"""Results as a reader keeps them: one row per cell with the columns docs/results.md lists
(:func:`tidy_cells`), and long tables of what a cell has many of — per corruption and severity,
per OOD set and score, per reliability bin, per epoch, per conformal predictor.

The reporter's own per-cell frame (:class:`reports.records.results.Results`' ``cells``: 400+
columns, the leaderboard's and the figures' inputs, with ``single+TS`` as a method) stays the
reporter's; :func:`tidy_cells` selects and renames from it, so every number here is the one the
leaderboard averages. What the wide frame has only as a text label comes from each row's config
(the ``_config`` column of :func:`reports.records.results.record_row`): every hyper-parameter
with its default (``hparams_all``, ``hp_<name>``) and the number of epochs.

The long tables read the records themselves (:func:`long_table` and the ``*_rows`` functions),
keyed by the cells of :func:`tidy_cells` (a duplicate record the leaderboard does not count is
left out), so they join with it on ``suite`` and ``cell_id``. :func:`leaderboard_table` is the
mean, std and n per configuration of a documented set of those columns, long, by the
reporter's own :func:`reports.stats.summary.aggregate`. No torch, no engine; no reading either:
the rows come from one scan of the records (:class:`reports.records.index.Scan`, whose
:meth:`~reports.records.index.Scan.tidy` is :func:`tidy_cells` of it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.contract import format_hparams
from reports.columns import collapsed, declared_metrics
from reports.records.flatten import SINGLE_TS, _num, _set_stats, conformal_predictor
from reports.stats.summary import aggregate

#: The configuration columns, in order (``hp_<name>`` columns follow them).
CONFIG = (
    "suite", "cell_id", "status", "dataset", "backbone", "method", "M", "seed", "hparams",
    "variant", "hparams_all", "epochs", "calibration",
)  # fmt: skip
#: Metric, diversity and cost columns: tidy name → the reporter's column (same name: same key).
RENAMED = {
    "acc": "acc",
    "nll": "nll",
    "ece": "ece",
    "aece": "aece",
    "brier": "brier",
    "aurc": "aurc",
    "temperature": "ts/temperature",
    "nll_ts": "ts/nll",
    "ece_ts": "ts/ece",
    "brier_ts": "ts/brier",
    "cAcc": "cAcc",
    "cNLL": "cNLL",
    "cECE": "cECE",
    "cNLL_ts": "ts/cNLL",
    "cECE_ts": "ts/cECE",
    "mCE": "mCE",
    "ood_auroc": "",  # mean over the OOD sets: _ood_means
    "ood_fpr95": "",
    "member_acc": "member_acc",
    "disagreement": "disagreement",
    "mi": "mi",
    "k_eff": "k_eff",
    "k_eff_scale": "k_eff_scale",
    "collapsed": "",  # reports.columns.collapsed
    "params": "params",
    "flops": "flops",
    "train_ips": "train_ips",
    "eval_ips": "eval_ips",
    "train_mem_mib": "train_mem_mib",
    "eval_mem_mib": "eval_mem_mib",
    "train_time_s": "train_time_s",
    "total_time_s": "total_time_s",
    "cost_device": "cost_device",
    "shared_device": "",  # as a boolean
    "finished_at": "finished_at",
    "error": "",  # "<type>: <message>" of a failed cell
}
#: In a temperature-scaled row (``calibration == "ts"``): metric ← the calibrated column.
TS_ROW = {
    "nll": "ts/nll",
    "ece": "ts/ece",
    "brier": "ts/brier",
    "aece": "ts/aece",
    "aurc": "ts/aurc",
    "cNLL": "ts/cNLL",
    "cECE": "ts/cECE",
}
#: The key columns of every long table (what joins it with :func:`tidy_cells`).
KEYS = ("suite", "cell_id", "dataset", "backbone", "method", "M", "hparams", "variant", "seed")


def _config_columns(
    cells: pd.DataFrame, configs: Mapping[tuple[str, str], tuple[dict, list]]
) -> pd.DataFrame:
    """``hparams_all``, ``epochs`` and one ``hp_<name>`` per hyper-parameter that any cell set
    away from its default, from each cell's config (defaults included, as the record holds
    them)."""
    found = [configs.get((str(s), str(c)), ({}, [])) for s, c in zip(cells["suite"],
                                                                     cells["cell_id"])]  # fmt: skip
    hparams = [cfg.get("hparams") or {} for cfg, _ in found]
    out = pd.DataFrame(index=cells.index)
    out["hparams_all"] = [format_hparams(hp) for hp in hparams]
    epochs = [(cfg.get("recipe") or {}).get("epochs") for cfg, _ in found]
    out["epochs"] = pd.array([e if isinstance(e, int) else None for e in epochs], dtype="Int64")
    names = sorted({name for _, shown in found for name in shown})
    for name in names:
        out[f"hp_{name}"] = [hp.get(name) for hp in hparams]
    return out


def _ood_means(cells: pd.DataFrame, prefix: str, metric: str) -> pd.Series:
    """The mean over OOD sets of ``<prefix>/<set>/msp/<metric>`` (NaN where a cell has none)."""
    cols = [c for c in cells.columns if c.startswith(f"{prefix}/") and c.endswith(f"/msp/{metric}")]
    if not cols:
        return pd.Series(math.nan, index=cells.index)
    values = cells[cols].apply(pd.to_numeric, errors="coerce")
    return values.mean(axis=1, skipna=True)


def _column(cells: pd.DataFrame, key: str) -> pd.Series:
    return cells[key] if key in cells else pd.Series(math.nan, index=cells.index)


def tidy_cells(
    cells: pd.DataFrame,
    configs: Mapping[tuple[str, str], tuple[dict, list]],
    *,
    calibrated: bool = False,
) -> pd.DataFrame:
    """One row per cell of the reporter's per-cell frame ``cells`` (done and failed; the derived
    ``single+TS`` rows left out), with the columns of docs/results.md.

    Args:
        cells: :class:`reports.records.results.Results`' ``cells``.
        configs: per ``(suite, cell_id)``: the cell's config and the names of the
            hyper-parameters it set away from their defaults (its record's ``hparams_shown``).
        calibrated: add, after each cell with a temperature, a row with ``calibration == "ts"``
            whose metrics are the temperature-scaled ones (accuracy, cAcc and mCE unchanged: one
            temperature does not move the top class).
    """
    cells = cells[cells["method"] != SINGLE_TS].reset_index(drop=True) if len(cells) else cells
    extra = _config_columns(cells, configs)
    out = pd.DataFrame(index=cells.index)
    for key in CONFIG:
        out[key] = extra[key] if key in extra else _column(cells, key)
    out["calibration"] = "raw"
    for key in [c for c in extra.columns if c.startswith("hp_")]:
        out[key] = extra[key]
    for name, source in RENAMED.items():
        if source:
            out[name] = _column(cells, source)
    out["ood_auroc"] = _ood_means(cells, "ood", "auroc")
    out["ood_fpr95"] = _ood_means(cells, "ood", "fpr95")
    out["collapsed"] = collapsed(out["disagreement"], out["M"])
    shared = _column(cells, "shared_device")
    out["shared_device"] = pd.array([None if pd.isna(v) else bool(v) for v in shared],
                                    dtype="boolean")  # fmt: skip
    failed = _column(cells, "status") == "failed"
    kind, message = _column(cells, "error_type"), _column(cells, "error_message")
    out["error"] = [f"{k}: {m}" if f else "" for f, k, m in zip(failed, kind, message)]
    # Plugins' metric columns (docs/results.md, `<metric>`): only those the records declare, so
    # a folder without them has exactly the columns above.
    plugin = [d["key"] for d in declared_metrics(cells) if d["key"] not in out]
    for key in plugin:
        out[key] = _column(cells, key)
    out = out[[*CONFIG, *[c for c in out.columns if c.startswith("hp_")], *RENAMED, *plugin]]
    if calibrated and len(out):
        out = _with_ts_rows(out, cells, plugin)
    return out.reset_index(drop=True)


def _with_ts_rows(
    out: pd.DataFrame, cells: pd.DataFrame, plugin: Iterable[str] = ()
) -> pd.DataFrame:
    """``out`` with a temperature-scaled row after each done cell that has a temperature
    (``plugin``: metric columns measured on the raw prediction only, empty in those rows)."""
    pick = (out["status"] == "done") & pd.to_numeric(out["temperature"], errors="coerce").notna()
    ts = out[pick].copy()
    ts["calibration"] = "ts"
    for key in plugin:
        ts[key] = math.nan
    for name, source in TS_ROW.items():
        ts[name] = _column(cells, source)[pick]
    ts["ood_auroc"] = _ood_means(cells, "ood_ts", "auroc")[pick]
    ts["ood_fpr95"] = _ood_means(cells, "ood_ts", "fpr95")[pick]
    both = pd.concat([out, ts])
    order = np.lexsort(((both["calibration"] == "ts").to_numpy(), both.index.to_numpy()))
    return both.iloc[order]


# --- long tables, from the records ---------------------------------------------------------


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def long_table(
    cells: pd.DataFrame,
    records: Iterable[Mapping[str, Any]],
    rows_of: Callable[[Mapping[str, Any]], Iterator[dict[str, Any]]],
    columns: tuple[str, ...],
) -> pd.DataFrame:
    """The rows ``rows_of`` gives for each record of a cell of ``cells`` (the raw rows of
    :func:`tidy_cells`), each with the cell's :data:`KEYS` first; ``columns`` name the rest (an
    empty table has them too)."""
    raw = cells[cells["calibration"] == "raw"] if "calibration" in cells else cells
    rows = raw[list(KEYS)].itertuples(index=False, name=None)
    keys = {(str(row[0]), str(row[1])): row for row in rows}  # suite, cell_id first
    out = []
    for rec in records:
        key = keys.get((str(rec.get("suite", "")), str(rec.get("cell_id", ""))))
        if key is None:
            continue
        ident = dict(zip(KEYS, key))
        out += [{**ident, **row} for row in rows_of(rec)]
    return pd.DataFrame(out, columns=[*KEYS, *columns])


CORRUPTION_COLUMNS = ("calibration", "corruption", "severity", "metric", "value")


def corruption_rows(rec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Per corruption × severity × metric of ``metrics.corruption.cells`` (raw) and of the
    temperature-scaled ``metrics.calibration.ts.corruption.cells`` (ts)."""
    metrics = rec.get("metrics") or {}
    sources = (
        ("raw", (metrics.get("corruption") or {}).get("cells")),
        ("ts", (((metrics.get("calibration") or {}).get("ts") or {}).get("corruption") or {})
         .get("cells")),
    )  # fmt: skip
    for calibration, entries in sources:
        for entry in entries or []:
            if not isinstance(entry, Mapping):
                continue
            for metric, value in entry.items():
                if metric not in ("corruption", "severity") and _numeric(value):
                    yield {"calibration": calibration, "corruption": entry.get("corruption"),
                           "severity": entry.get("severity"), "metric": metric,
                           "value": float(value)}  # fmt: skip


OOD_COLUMNS = ("calibration", "ood_set", "score", "metric", "value")


def ood_rows(rec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Per OOD set × score × metric of ``metrics.ood`` (raw) and of
    ``metrics.calibration.ts.ood`` (ts)."""
    metrics = rec.get("metrics") or {}
    ts = ((metrics.get("calibration") or {}).get("ts") or {}).get("ood")
    for calibration, sets in (("raw", metrics.get("ood")), ("ts", ts)):
        for ood_set, scores in (sets or {}).items():
            for score, values in (scores or {}).items():
                for metric, value in (values or {}).items():
                    if _numeric(value):
                        yield {"calibration": calibration, "ood_set": ood_set, "score": score,
                               "metric": metric, "value": float(value)}  # fmt: skip


RELIABILITY_COLUMNS = (
    "calibration", "member", "bin", "lower", "upper", "count", "confidence", "accuracy",
)  # fmt: skip


def _bins(bins: Any) -> Iterator[dict[str, Any]]:
    """The rows of one reliability-bin dict (equal-width bins over [0, 1])."""
    if not isinstance(bins, Mapping):
        return
    count = bins.get("count") or []
    conf, acc = bins.get("confidence") or [], bins.get("accuracy") or []
    n = len(count)
    for i, c in enumerate(count):
        count_i = _num(c)
        yield {"bin": i, "lower": i / n, "upper": (i + 1) / n,
               "count": int(count_i) if math.isfinite(count_i) else 0,
               "confidence": _num(conf[i]) if i < len(conf) else math.nan,
               "accuracy": _num(acc[i]) if i < len(acc) else math.nan}  # fmt: skip


def reliability_rows(rec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Per bin: the ensemble's ``metrics.clean.reliability`` (raw), its temperature-scaled one
    (ts) and each member's ``reliability_members`` (raw, ``member`` its index)."""
    metrics = rec.get("metrics") or {}
    clean = metrics.get("clean") or {}
    ts = ((metrics.get("calibration") or {}).get("ts") or {}).get("clean") or {}
    for calibration, bins in (("raw", clean.get("reliability")), ("ts", ts.get("reliability"))):
        for row in _bins(bins):
            yield {"calibration": calibration, "member": None, **row}
    for m, bins in enumerate(clean.get("reliability_members") or []):
        for row in _bins(bins):
            yield {"calibration": "raw", "member": m, **row}


HISTORY_COLUMNS = ("source", "epoch", "metric", "value")


def history_rows(rec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Per epoch × metric: the training ``history`` (loss, accuracy, learning rate, time,
    validation metrics) and the method's ``diagnostics.per_epoch`` (σN-Ens's k_eff, …); numbers
    only."""
    sources = (
        ("history", rec.get("history")),
        ("diagnostics", (rec.get("diagnostics") or {}).get("per_epoch")),
    )
    for source, entries in sources:
        for entry in entries or []:
            epoch = entry.get("epoch") if isinstance(entry, Mapping) else None
            if not isinstance(epoch, int) or isinstance(epoch, bool):
                continue
            for metric, value in entry.items():
                if metric != "epoch" and _numeric(value):
                    yield {"source": source, "epoch": epoch, "metric": metric,
                           "value": float(value)}  # fmt: skip


CONFORMAL_COLUMNS = ("predictor", "alpha", "split", "stat", "value")


def conformal_rows(rec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Per conformal predictor (THR, APS, RAPS) × α × split (clean test set, mean over the
    corruptions) × statistic, read as the leaderboard reads them
    (:func:`reports.records.flatten._set_stats`: a record from before the sets were reported as
    defined gives the fallback numbers, the others NaN)."""
    cal = (rec.get("metrics") or {}).get("calibration")
    if not isinstance(cal, Mapping):
        return
    for name, block in (cal.get("conformal") or {}).items():
        predictor, _, alpha = conformal_predictor(name, cal.get("alpha")).partition("@")
        block = block or {}
        splits = (("clean", block.get("clean")),
                  ("corrupted", (block.get("corruption") or {}).get("mean")))  # fmt: skip
        for split, sets in splits:
            for stat, value in _set_stats(sets or {}).items():
                yield {"predictor": predictor, "alpha": float(alpha) if alpha else math.nan,
                       "split": split, "stat": stat, "value": value}  # fmt: skip


#: Each long table: its rows and its columns after :data:`KEYS`.
LONG_TABLES: dict[str, tuple[Callable[[Mapping[str, Any]], Iterator[dict]], tuple[str, ...]]] = {
    "corruption": (corruption_rows, CORRUPTION_COLUMNS),
    "ood": (ood_rows, OOD_COLUMNS),
    "reliability": (reliability_rows, RELIABILITY_COLUMNS),
    "history": (history_rows, HISTORY_COLUMNS),
    "conformal": (conformal_rows, CONFORMAL_COLUMNS),
}


def load_long(
    cells: pd.DataFrame, table: str, records: Iterable[Mapping[str, Any]]
) -> pd.DataFrame:
    """The long table ``table`` (a key of :data:`LONG_TABLES`) of the tidy cells ``cells``
    (:func:`tidy_cells`) and their folder's ``records``."""
    rows_of, columns = LONG_TABLES[table]
    frame = long_table(cells, records, rows_of, columns)
    if table == "reliability":
        frame["member"] = frame["member"].astype("Int64")
    return frame


# --- the leaderboard, tidy ------------------------------------------------------------------

#: The metrics of :func:`leaderboard_table` by default, in its order: columns of
#: :func:`tidy_cells` (docs/results.md, "leaderboard").
LEADERBOARD_METRICS = (
    "acc", "nll", "ece", "brier", "aurc", "cAcc", "cNLL", "cECE", "mCE", "ood_auroc",
    "ood_fpr95", "member_acc", "disagreement", "mi", "k_eff", "params", "flops", "train_time_s",
)  # fmt: skip
#: The configuration of a leaderboard row: the reporter's groups, and the calibration.
BOARD_KEYS = ("dataset", "backbone", "method", "M", "hparams", "variant", "calibration")
#: :func:`leaderboard_table`'s columns.
LEADERBOARD_COLUMNS = (*BOARD_KEYS, "n_cells", "n_failed", "metric", "mean", "std", "n", "ci")


def numeric_columns(cells: pd.DataFrame) -> list[str]:
    """The columns of :func:`tidy_cells` a leaderboard can average (numbers, not the
    configuration)."""
    keys = {*CONFIG, "collapsed", "shared_device"}
    return [c for c in cells.columns if c not in keys and not c.startswith("hp_")
            and pd.api.types.is_numeric_dtype(cells[c])]  # fmt: skip


def leaderboard_table(
    cells: pd.DataFrame, metrics: Sequence[str] = LEADERBOARD_METRICS
) -> pd.DataFrame:
    """Mean, std and n per configuration and metric, long: one row per configuration
    (:data:`BOARD_KEYS`) × metric with a value, in the configurations' order and ``metrics``'.

    The statistics are :func:`reports.stats.summary.aggregate`'s over the done cells of
    ``cells`` (:func:`tidy_cells`; with its temperature-scaled rows, ``calibration == "ts"``
    is a configuration of its own): ``mean``, ``std`` (ddof = 1), ``n`` (the finite values:
    fewer than ``n_cells`` when a cell lacks the metric or diverged), ``ci`` (the 95%
    t-interval's half-width); ``n_cells`` the done cells, ``n_failed`` the failed ones.
    """
    keep = ["suite", "cell_id", "status", *BOARD_KEYS, "seed"]
    frames = []
    for calibration, group in cells.groupby("calibration", sort=True):
        frame = group[keep].copy()
        for m in metrics:
            frame[m] = pd.to_numeric(group[m], errors="coerce").astype(float)
        summary = aggregate(frame.drop(columns="calibration"))
        if summary.empty:
            continue
        summary["calibration"] = calibration
        for m in metrics:
            part = summary[[*BOARD_KEYS, "n", "n_failed"]].rename(columns={"n": "n_cells"})
            part["metric"] = m
            for stat in ("mean", "std", "n", "ci"):
                part[stat] = summary[f"{m}_{stat}"].to_numpy()
            frames.append(part)
    if not frames:
        return pd.DataFrame(columns=list(LEADERBOARD_COLUMNS))
    board = pd.concat(frames, ignore_index=True)
    board = board[board["n"] > 0]
    order = {m: i for i, m in enumerate(metrics)}
    board = board.assign(_metric=board["metric"].map(order)).sort_values(
        [*[k for k in BOARD_KEYS if k != "calibration"], "calibration", "_metric"], kind="stable"
    )
    board["n"] = board["n"].astype(int)
    return board[list(LEADERBOARD_COLUMNS)].reset_index(drop=True)
