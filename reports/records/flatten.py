"""One result record → one flat leaderboard row (absent metrics NaN): the reporter's reading of a
record, through the contract layer only (no engine, methods or torch import here).

Beyond the identity, clean metrics and cost, a row carries (NaN/empty when the record has none):
``corr/<corruption>/acc|nll|ece`` (mean over its severities) and ``corr_severity_acc`` (JSON, for
the mCE); ``corruption_mean_over`` and ``mce_over`` (which corruptions cAcc and the mCE average);
``ood_near/…`` and ``ood_far/…`` (means over the near and far sets the record's
``evaluation.ood_groups`` names, :func:`ood_kind`);
``cost_device``, ``cost_precision``, ``shared_device`` and ``train_device_h``; the post-hoc
calibration of ``metrics.calibration`` (:func:`calibration_columns`: ``ts/…``, ``ts_members/…``,
``ood_ts/…``, conformal ``cp/<method>@<α>/<stat>`` (:data:`SET_STATS`; records from before the
sets were reported as defined give the fallback numbers alone) and the reliability bins
``rel/<view>/<stat>/<bin>``, sums so seeds pool by adding); the per-epoch curves
``curve/<key>/<epoch>`` (:func:`curve_columns`); and the declared diagnostics.
:func:`with_posthoc_rows` adds ``single+TS`` as a configuration of its own: the baseline a
reader compares an ensemble against (Guo et al., 2017; Ovadia et al., 2019).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np
import pandas as pd

from harness.contract import ENSEMBLE_METRIC_KEYS, label_of, shown_diagnostics
from harness.contract import format_hparams as _format_shown
from harness.contract import identity as _record_identity
from reports.columns import DIAGNOSTICS, METRICS_DECLARED

_CONFIG_IDENTITY = ("dataset", "backbone", "method", "M", "hparams", "seed")


@functools.lru_cache(maxsize=8)  # the same two dataclasses for every record
def _field_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return json.loads(json.dumps(out, default=list))  # tuples → lists, as records hold them


def _config_rest(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The non-identity part of a config, recipe and evaluation completed with today's defaults:
    a record written before a field existed (or by a version that leaves a default value out,
    as one-process cells leave out ``processes: 1``) compares equal to one that spells it."""
    from harness.contract.config import Evaluation, Recipe

    rest = {k: v for k, v in cfg.items() if k not in _CONFIG_IDENTITY}
    for key, cls in (("recipe", Recipe), ("evaluation", Evaluation)):
        if isinstance(rest.get(key), Mapping):
            rest[key] = {**_field_defaults(cls), **rest[key]}
    return rest


_json_str = json.encoder.encode_basestring_ascii  # json.dumps of a str, ensure_ascii=True

_COST_KEYS = {  # record cost key → column
    "params_total": "params",
    "params_trainable": "params_trainable",
    "params_single": "params_single",
    "params_overhead": "params_overhead",
    "flops_per_image": "flops",
    "train_images_per_s": "train_ips",
    "eval_images_per_s": "eval_ips",
    "peak_train_mem_mib": "train_mem_mib",
    "peak_eval_mem_mib": "eval_mem_mib",
    "train_time_s": "train_time_s",
    "epoch_time_s": "epoch_time_s",
}
_CLEAN_KEYS = ENSEMBLE_METRIC_KEYS  # the engine's list: it writes exactly these
_RESERVED = {*_CLEAN_KEYS, *_COST_KEYS.values(), "member_acc", "cAcc", "cNLL", "cECE", "M", "seed"}


def _num(value: Any) -> float:
    kind = type(value)  # exact types first: ~70 calls per record (bool is not a number here)
    if kind is float:
        return value
    if kind is int:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def format_hparams(hparams: Mapping[str, Any] | None) -> str:
    """A readable, order-independent hyper-parameter string: ``lam=0.1, tau=0.5``.

    Which hyper-parameters a cell shows is decided when it runs (``hparams_shown`` in its record,
    those differing from the method's defaults then); the reporter never asks the methods.
    """
    return _format_shown(hparams or {})


def _flatten(obj: Any, prefix: str = "", out: dict[str, str] | None = None) -> dict[str, str]:
    """Dotted key → the JSON text of each leaf (``json.dumps(v, sort_keys=True, default=str)``)."""
    out = {} if out is None else out
    if isinstance(obj, Mapping) and obj:
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, str):
        out[prefix] = _json_str(obj)  # the same text, without json.dumps' per-call setup
    elif obj is None or isinstance(obj, bool) or type(obj) is int:
        out[prefix] = (
            "null"
            if obj is None
            else ("true" if obj is True else "false" if obj is False else str(obj))
        )
    elif type(obj) is float and math.isfinite(obj):
        out[prefix] = repr(obj)  # json.dumps writes a finite float as its repr
    else:
        out[prefix] = json.dumps(obj, sort_keys=True, default=str)
    return out


def _as_record(item: Mapping[str, Any]) -> Mapping[str, Any]:
    return item if "config" in item else {"config": item}  # a bare config: all hparams shown


def flatten_record(rec: Mapping[str, Any], variant: Iterable[str] = ()) -> dict[str, Any]:
    """One leaderboard row for one record (absent metrics are NaN)."""
    cfg = rec.get("config") or {}
    dataset, backbone, method, M, hparams = _record_identity(rec)
    flat_cfg = _flatten(_config_rest(cfg)) if variant else {}
    row: dict[str, Any] = {
        "suite": str(rec.get("suite", "")),
        "cell_id": str(rec.get("cell_id", "")),
        "status": str(rec.get("status", "")),
        "dataset": dataset,
        "backbone": backbone,
        "method": method,
        "M": M if isinstance(M, int) and not isinstance(M, bool) else math.nan,
        "hparams": hparams,
        "variant": ", ".join(f"{k}={flat_cfg.get(k, '<absent>')}" for k in variant),
        "seed": cfg.get("seed"),
        "label": label_of(rec),
    }
    for k, v in (cfg.get("hparams") or {}).items():
        row[f"hp_{k}"] = (
            _num(v) if isinstance(v, int | float) and not isinstance(v, bool) else str(v)
        )
    metrics = rec.get("metrics") or {}
    clean = metrics.get("clean") or {}
    for k in _CLEAN_KEYS:
        row[k] = _num(clean.get(k))
    member_acc = [_num(a) for a in (clean.get("members") or {}).get("acc") or []]
    row["member_acc"] = float(np.mean(member_acc)) if member_acc else math.nan
    for k, v in (metrics.get("val") or {}).items():
        row[f"val_{k}"] = _num(v)
    corruption = metrics.get("corruption") or {}
    for k, name in (("acc", "cAcc"), ("nll", "cNLL"), ("ece", "cECE")):
        row[name] = _num((corruption.get("mean") or {}).get(k))
    for sev, values in sorted((corruption.get("per_severity") or {}).items()):
        for k, v in (values or {}).items():
            row[f"sev{sev}_{k}"] = _num(v)
    for ood_set, scores in (metrics.get("ood") or {}).items():
        for score, values in (scores or {}).items():
            for k, v in (values or {}).items():
                row[f"ood/{ood_set}/{score}/{k}"] = _num(v)
    cost = rec.get("cost") or {}
    for k, name in _COST_KEYS.items():
        row[name] = _num(cost.get(k))
    row["total_time_s"] = _num((rec.get("timings") or {}).get("total_s"))
    row.update(diagnostic_values(rec))
    row.update(extra_columns(rec))  # per corruption, near/far OOD, cost conditions
    row.update(calibration_columns(metrics))  # post-hoc calibration, conformal sets, bins
    row.update(curve_columns(rec))  # per-epoch validation metrics and k_eff
    error = rec.get("error") or {}
    row["error_type"] = str(error.get("type", "")) if error else ""
    row["error_message"] = str(error.get("message", "")) if error else ""
    row["error_traceback"] = str(error.get("traceback", "")) if error else ""
    row["started_at"] = str(rec.get("started_at", ""))
    row["finished_at"] = str(rec.get("finished_at", ""))
    # plugins' metric columns last: a declared key any column above took is left out (a
    # plugin never overwrites a measurement, nor is overwritten by one)
    row.update(declared_metric_values(metrics, row))
    return row


def declared_metric_values(metrics: Mapping[str, Any], taken: Iterable[str] = ()) -> dict[str, Any]:
    """The metric columns a record declares (``metrics.declared``: a plugin's metric, computed
    by the engine on the clean test set), each under its key, and the declarations as JSON in
    :data:`METRICS_DECLARED` (absent when none: the rows, and the CSVs written from them, of a
    record without plugin metrics are what they were before metric columns could be declared).
    A declared key a built-in column already uses, or one of ``taken`` (the row's identity
    columns: ``method``, ``seed``, ``hp_<name>``…), is left out: a plugin never overwrites a
    measurement nor what groups the rows."""
    skip = {*_RESERVED, *taken}
    declared = [
        d
        for d in metrics.get("declared") or []
        if isinstance(d, Mapping) and d.get("key") and d["key"] not in skip
    ]
    clean = metrics.get("clean") or {}
    out: dict[str, Any] = {str(d["key"]): _num(clean.get(d["key"])) for d in declared}
    if declared:
        out[METRICS_DECLARED] = json.dumps(declared, sort_keys=True)
    return out


UNDECLARED = "diagnostics_undeclared"  # "undeclared" for a record written before declarations


def diagnostic_values(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The diagnostics a record declares (or, for a record without declarations, every numeric
    key of its last epoch: :func:`harness.contract.shown_diagnostics`), each under its column at
    its declared epoch, and the declarations as JSON in :data:`DIAGNOSTICS`. A diagnostic whose
    column a metric already has is left out: a method never overwrites a measurement."""
    section = rec.get("diagnostics") or {}
    per_epoch = [e for e in section.get("per_epoch") or [] if isinstance(e, Mapping)]
    shown = [d for d in shown_diagnostics(section) if d.column_key not in _RESERVED]
    out: dict[str, Any] = {}
    for d in shown:
        entry = (per_epoch[0] if d.epoch == "first" else per_epoch[-1]) if per_epoch else {}
        out[d.column_key] = _num(entry.get(d.key))
    out[DIAGNOSTICS] = json.dumps([d.to_json() for d in shown], sort_keys=True) if shown else ""
    # Per-epoch diagnostics without declarations: a record of a harness before methods declared
    # them (`harness upgrade` adds them, and with them the figures they name).
    undeclared = bool(per_epoch) and not isinstance(section.get("declared"), list)
    out[UNDECLARED] = "undeclared" if undeclared else ""
    return out


#: Per-epoch values kept as ``curve/<key>/<epoch:03d>`` columns (the training-curves figure):
#: the validation metrics of ``history`` and the sharing of ``diagnostics.per_epoch``.
CURVE_HISTORY = ("val_acc", "val_nll")
CURVE_DIAGNOSTICS = ("k_eff", "k_eff_scale")


def curve_columns(rec: Mapping[str, Any]) -> dict[str, float]:
    """``curve/<key>/<epoch>`` of one record: validation accuracy and NLL after every epoch
    (records trained with a validation split) and σN-Ens's per-epoch k_eff on σ(γ) and on the
    effective scale (records whose method keeps them); none for a record without them."""
    out: dict[str, float] = {}
    sources = (
        (rec.get("history") or [], CURVE_HISTORY),
        ((rec.get("diagnostics") or {}).get("per_epoch") or [], CURVE_DIAGNOSTICS),
    )
    for entries, keys in sources:
        for entry in entries:
            epoch = entry.get("epoch") if isinstance(entry, Mapping) else None
            if not isinstance(epoch, int) or isinstance(epoch, bool):
                continue
            for k in keys:
                if k in entry:
                    out[f"curve/{k}/{epoch:03d}"] = _num(entry[k])
    return out


def describe_config(item: Mapping[str, Any]) -> str:
    """``dataset / backbone / method M=4 (tau=0.5) seed=0`` for the problem list.

    ``item``: a record (its shown hyper-parameters) or a bare config (all of them)."""
    rec = _as_record(item)
    cfg = rec.get("config") or {}
    dataset, backbone, method, M, hparams = _record_identity(rec)
    text = f"{dataset} / {backbone} / {method} M={M}"
    if hparams:
        text += f" ({hparams})"
    if "seed" in cfg:
        text += f" seed={cfg['seed']}"
    return text


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
    ood = (rec.get("metrics") or {}).get("ood") or {}
    values: dict[str, list[float]] = {}
    for ood_set, scores in ood.items():
        kind = ood_kind(str(ood_set), rec)
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


#: Clean-set metrics a temperature changes (accuracy does not: it is checked equal).
TS_CLEAN = ("nll", "ece", "brier", "aece", "aurc")
#: Corruption means a temperature changes, by the raw column they stand beside.
TS_CORRUPTION = {"cNLL": "nll", "cECE": "ece"}
CONFORMAL = ("thr", "aps", "raps")
#: The statistics of a conformal predictor (harness.metrics.posthoc.SetAccumulator), as columns
#: ``cp/<method>@<α>/<stat>`` (clean test set) and ``cp/<method>@<α>/c_<stat>`` (corruption mean).
SET_STATS = ("coverage", "size", "empty_rate", "coverage_fallback", "size_fallback")
VIEWS = ("ts", "ts_members")
N_BINS = 15
STATS = ("count", "conf", "correct")
#: The method name of the derived temperature-scaled single-model rows.
SINGLE_TS = "single+TS"


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
        prefix = f"cp/{conformal_predictor(name, cal.get('alpha'))}"
        for k, v in _set_stats(clean_sets).items():
            row[f"{prefix}/{k}"] = v
        for k, v in _set_stats(shifted).items():
            row[f"{prefix}/c_{k}"] = v
    return row


def conformal_predictor(name: str, alpha: Any) -> str:
    """A conformal record key with its α: ``aps@0.05`` as recorded when a suite gives several α,
    ``aps`` + the record's one ``alpha`` → ``aps@0.1``; ``aps`` when the record states none."""
    if "@" in name or not isinstance(alpha, int | float) or isinstance(alpha, bool):
        return name
    return f"{name}@{float(alpha)!r}"


def _set_stats(block: Mapping[str, Any]) -> dict[str, float]:
    """:data:`SET_STATS` of one conformal block. A block without ``coverage_fallback`` was
    written before the sets were reported as the methods define them (issue 50): its
    ``coverage`` and ``size`` are those of torch-uncertainty's sets (an empty set filled with the
    top class, threshold without the (n + 1) correction), so they are read as the fallback
    numbers, and the sets as defined are unknown (NaN)."""
    if not block:
        return {}
    if "coverage_fallback" not in block:
        block = {"coverage_fallback": block.get("coverage"), "size_fallback": block.get("size")}
    return {k: _num(block.get(k)) for k in SET_STATS}


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


# Which OOD sets are near- and which far-OOD: the in-distribution dataset declares it when it
# registers (``DatasetSpec.ood_groups``: OpenOOD v1.5's split, Zhang et al., 2023, Table 1), and
# the engine writes the evaluated sets' groups into the record (``evaluation.ood_groups``); the
# reporter reads them from there. A set in neither group counts in its own per-set columns only.
Kind = Literal["near", "far"]

CONVENTION = (
    "near-/far-OOD: the mean over the near (semantic shift) or far OOD sets evaluated, as the "
    "in-distribution dataset declares them (OpenOOD v1.5's split — CIFAR-10: near CIFAR-100, "
    "TinyImageNet; far MNIST, SVHN, Textures, Places365; digits: near the held-out digits 8/9, "
    "far scikit-learn photo patches; Fashion-MNIST: near MNIST, KMNIST, digits_28, letters_28, "
    "far photos_28), read from each record's evaluation.ood_groups. A mean over fewer sets than "
    "the split names is still shown (the per-set columns say which were run)."
)


def ood_kind(ood_set: str, record: Mapping[str, Any] | None = None) -> Kind | None:
    """``"near"``, ``"far"`` or None (in neither group, or a record from before the groups were
    recorded: ``harness upgrade`` adds them) for ``ood_set`` in ``record``'s evaluation."""
    groups = ((record or {}).get("evaluation") or {}).get("ood_groups")
    if isinstance(groups, Mapping) and groups.get(ood_set) in ("near", "far"):
        return groups[ood_set]
    return None
