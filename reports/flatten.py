"""One result record → one flat leaderboard row (absent metrics NaN); the reporter's reading of a
record, shared by :mod:`reports.aggregate` and :mod:`reports.rows`."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

# Records are read through the contract layer only: no engine, methods or torch import here.
from harness.contract import ENSEMBLE_METRIC_KEYS, label_of, shown_diagnostics
from harness.contract import format_hparams as _format_shown
from harness.contract import identity as _record_identity
from reports.calibrated import calibration_columns
from reports.record_extras import extra_columns

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


def _identity(rec: Mapping[str, Any]) -> tuple[str, str, str, Any, str]:
    """(dataset, backbone, method, M, shown hparams) from the record alone (any schema)."""
    return _record_identity(rec)


def _as_record(item: Mapping[str, Any]) -> Mapping[str, Any]:
    return item if "config" in item else {"config": item}  # a bare config: all hparams shown


def flatten_record(rec: Mapping[str, Any], variant: Iterable[str] = ()) -> dict[str, Any]:
    """One leaderboard row for one record (absent metrics are NaN)."""
    cfg = rec.get("config") or {}
    dataset, backbone, method, M, hparams = _identity(rec)
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
    error = rec.get("error") or {}
    row["error_type"] = str(error.get("type", "")) if error else ""
    row["error_message"] = str(error.get("message", "")) if error else ""
    row["error_traceback"] = str(error.get("traceback", "")) if error else ""
    row["started_at"] = str(rec.get("started_at", ""))
    row["finished_at"] = str(rec.get("finished_at", ""))
    return row


DIAGNOSTICS = "diagnostics_shown"  # the text column of the declarations (reports.columns)


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
    return out


def describe_config(item: Mapping[str, Any]) -> str:
    """``dataset / backbone / method M=4 (tau=0.5) seed=0`` for the problem list.

    ``item``: a record (its shown hyper-parameters) or a bare config (all of them)."""
    rec = _as_record(item)
    cfg = rec.get("config") or {}
    dataset, backbone, method, M, hparams = _identity(rec)
    text = f"{dataset} / {backbone} / {method} M={M}"
    if hparams:
        text += f" ({hparams})"
    if "seed" in cfg:
        text += f" seed={cfg['seed']}"
    return text
