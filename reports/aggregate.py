"""Result records → pandas tables: one row per cell, and mean ± std (n) across seeds.

``load_results(results_dir)`` reads every cell folder, keeps what validates, and lists every cell
that did not produce a usable record (failed, invalid, missing) with its reason, so a folder with
failed or unfinished cells still reports. ``records_to_frame`` flattens records to one row per cell;
``aggregate`` (:mod:`reports.summary`) gives mean, std and n per configuration. ``variant`` names
config fields (recipe, backbone_kwargs, ...) that differ between cells of one group, so cells
that are not seeds of one configuration are never averaged.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

# Records are read through the contract layer only: no engine, methods or torch import here.
from harness.contract import (
    ENSEMBLE_METRIC_KEYS,
    RECORD_FILE,
    RecordError,
    label_of,
    read_record,
    validate_record,
)
from harness.contract import format_hparams as _format_shown
from harness.contract import identity as _record_identity
from reports.columns import (
    ID_COLUMNS,
)
from reports.provenance import conventions as _conventions
from reports.provenance import provenance as _provenance
from reports.record_extras import extra_columns
from reports.summary import (
    MCE_BASELINE,
    aggregate,
    drop_duplicate_seeds,
    relative_corruption_error,
)

_CONFIG_IDENTITY = ("dataset", "backbone", "method", "M", "hparams", "seed")


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


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def format_hparams(hparams: Mapping[str, Any] | None) -> str:
    """A readable, order-independent hyper-parameter string: ``lam=0.1, tau=0.5``.

    Which hyper-parameters a cell shows is decided when it runs (``hparams_shown`` in its record,
    those differing from the method's defaults then); the reporter never asks the methods.
    """
    return _format_shown(hparams or {})


def _flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(obj, Mapping) and obj:
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(obj, sort_keys=True, default=str)}


def _identity(rec: Mapping[str, Any]) -> tuple[str, str, str, Any, str]:
    """(dataset, backbone, method, M, shown hparams) from the record alone (any schema)."""
    return _record_identity(rec)


def _as_record(item: Mapping[str, Any]) -> Mapping[str, Any]:
    return item if "config" in item else {"config": item}  # a bare config: all hparams shown


def variant_keys(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Dotted config keys (besides the identity and seed) that differ inside one group.

    ``records``: result records (or bare config mappings, whose hyper-parameters all count)."""
    seen: dict[tuple, dict[str, set[str]]] = {}
    for item in records:
        rec = _as_record(item)
        cfg = rec.get("config") or {}
        rest = _config_rest(cfg)
        values = seen.setdefault(_identity(rec), {})
        flat = _flatten(rest)
        for k in set(flat) | set(values):
            values.setdefault(k, set()).add(flat.get(k, "<absent>"))
    return sorted({k for values in seen.values() for k, v in values.items() if len(v) > 1})


def flatten_record(rec: Mapping[str, Any], variant: Iterable[str] = ()) -> dict[str, Any]:
    """One leaderboard row for one record (absent metrics are NaN)."""
    cfg = rec.get("config") or {}
    dataset, backbone, method, M, hparams = _identity(rec)
    flat_cfg = _flatten(_config_rest(cfg))
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
    per_epoch = (rec.get("diagnostics") or {}).get("per_epoch") or []
    last = per_epoch[-1] if per_epoch and isinstance(per_epoch[-1], Mapping) else {}
    row["k_eff"] = _num(last.get("k_eff"))  # σN-Ens's sharing diagnostics, last epoch
    row["k_eff_scale"] = _num(last.get("k_eff_scale"))  # on |w_m·sigmoid(γ_m)|: the affine too
    first = per_epoch[0] if per_epoch and isinstance(per_epoch[0], Mapping) else {}
    # ‖∇γ L_div‖ / ‖∇γ L_task‖ of the first epoch: whether λ matters at the start of training.
    row["grad_ratio"] = _num(first.get("grad_ratio"))
    row["importance_mean"] = _num(last.get("importance"))
    row["l_div"] = _num(last.get("l_div"))
    row.update(extra_columns(rec))  # per corruption, near/far OOD, cost conditions
    error = rec.get("error") or {}
    row["error_type"] = str(error.get("type", "")) if error else ""
    row["error_message"] = str(error.get("message", "")) if error else ""
    row["error_traceback"] = str(error.get("traceback", "")) if error else ""
    row["started_at"] = str(rec.get("started_at", ""))
    row["finished_at"] = str(rec.get("finished_at", ""))
    return row


def records_to_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per cell (done and failed), identity columns first."""
    records = list(records)
    variant = variant_keys(records)
    frame = pd.DataFrame([flatten_record(r, variant) for r in records])
    if frame.empty:
        return pd.DataFrame(columns=[*ID_COLUMNS, "acc", "nll", "ece"])
    return frame


@dataclass
class Problem:
    """A cell without a usable record: failed, invalid, missing, or a duplicate (same
    configuration and seed as a newer record, which is the one counted), and why."""

    cell_id: str
    status: Literal["failed", "invalid", "missing", "duplicate"]
    reason: str
    config: str = ""
    detail: str = ""


@dataclass
class Results:
    """Everything a report shows, computed once."""

    cells: pd.DataFrame
    summary: pd.DataFrame
    problems: list[Problem]
    provenance: dict[str, list[str]]
    conventions: dict[str, list[str]]
    source: str = ""
    suites: list[str] = field(default_factory=list)
    mce_baseline: str | None = MCE_BASELINE  # the method the mCE column is relative to

    def with_mce_baseline(self, baseline: str | None) -> Results:
        """These results with the mCE recomputed against ``baseline`` (None: no mCE column)."""
        cells = relative_corruption_error(self.cells, baseline)
        return dataclasses.replace(
            self, cells=cells, summary=aggregate(cells), mce_baseline=baseline
        )

    @property
    def n_done(self) -> int:
        return int((self.cells["status"] == "done").sum()) if len(self.cells) else 0


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


def _config_matches(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    for k, v in want.items():
        if k not in have:
            return False
        if isinstance(v, Mapping) and isinstance(have[k], Mapping):
            if not _config_matches(v, have[k]):
                return False
        elif v != have[k]:
            return False
    return True


def _expected_entry(item: Any) -> tuple[str | None, Mapping[str, Any] | None]:
    if isinstance(item, str):
        return item, None
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        cell_id, cfg = getattr(item, "cell_id", None), getattr(item, "config", None)
        if cell_id is None and cfg is None:
            cfg = dataclasses.asdict(item)
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            cfg = dataclasses.asdict(cfg)
        return cell_id, cfg
    if isinstance(item, Mapping):
        if "cell_id" in item or "config" in item:
            return item.get("cell_id"), item.get("config")
        return None, item
    cell_id, cfg = getattr(item, "cell_id", None), getattr(item, "config", None)
    if cell_id is None and not isinstance(cfg, Mapping):
        raise TypeError(
            f"expected cell {item!r}: give a cell id, a mapping with 'cell_id' or 'config', "
            "a config mapping, or an object with a cell_id attribute"
        )
    return cell_id, cfg


def missing_cells(
    expected: Iterable[Any], records: Iterable[Mapping[str, Any]], known: Iterable[str] = ()
) -> list[Problem]:
    """Expected cells (ids, configs or objects with ``cell_id``/``config``) with no record."""
    records = list(records)
    ids = {str(r.get("cell_id")) for r in records} | set(known)
    out = []
    for item in expected:
        cell_id, cfg = _expected_entry(item)
        label = item.get("label") if isinstance(item, Mapping) else None
        desc = label or (describe_config(cfg) if isinstance(cfg, Mapping) else "")
        if cell_id is not None:
            if str(cell_id) in ids:
                continue
        elif any(_config_matches(cfg, r.get("config") or {}) for r in records):
            continue
        ident = str(cell_id) if cell_id is not None else "(no id)"
        out.append(Problem(ident, "missing", "expected cell has no record (not run yet?)", desc))
    return out


def from_records(
    records: Iterable[Mapping[str, Any]],
    expected: Iterable[Any] | None = None,
    problems: Iterable[Problem] = (),
    source: str = "",
) -> Results:
    """:class:`Results` from records already read (each must validate)."""
    records = list(records)
    problems = list(problems)
    cells, duplicates = drop_duplicate_seeds(records_to_frame(records))
    cells = relative_corruption_error(cells, MCE_BASELINE)
    for dropped, kept in duplicates:
        reason = f"same configuration and seed as the newer record {kept}, which is counted"
        problems.append(Problem(dropped, "duplicate", reason))
    for r in records:
        if r.get("status") == "failed":
            err = r.get("error") or {}
            reason = f"{err.get('type', 'Error')}: {err.get('message', '')}".strip()
            detail = str(err.get("traceback", ""))
            cfg = describe_config(r)
            problems.append(Problem(str(r.get("cell_id")), "failed", reason, cfg, detail))
    if expected is not None:
        problems += missing_cells(expected, records, known=[p.cell_id for p in problems])
    return Results(
        cells=cells,
        summary=aggregate(cells),
        problems=problems,
        provenance=_provenance(records),
        conventions=_conventions(records),
        source=source,
        suites=sorted({str(r.get("suite")) for r in records}),
    )


def _cell_dirs(results_dir: Path, ignore: Iterable[Path]) -> list[Path]:
    ignore = {p.resolve() for p in ignore}

    def subdirs(d: Path) -> list[Path]:
        return sorted(
            p
            for p in d.iterdir()
            if p.is_dir() and not p.name.startswith((".", "_")) and p.resolve() not in ignore
        )

    if any(results_dir.glob(f"*/{RECORD_FILE}")) or not any(results_dir.glob(f"*/*/{RECORD_FILE}")):
        return subdirs(results_dir)
    return [cell for suite in subdirs(results_dir) for cell in subdirs(suite)]  # results root


def load_results(
    results_dir: Path | str, expected: Iterable[Any] | None = None, ignore: Iterable[Path] = ()
) -> Results:
    """Read a suite's results folder (or a folder of suite folders) into :class:`Results`.

    A cell folder without ``record.json`` is listed as missing (pending, running or killed), an
    unreadable or invalid record as invalid; ``expected`` adds cells that have no folder at all.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results folder {results_dir} does not exist")
    records, problems = [], []
    for cell_dir in _cell_dirs(results_dir, ignore):
        try:
            rec = read_record(cell_dir)
            if rec is None:
                reason = "no record.json in its folder: pending, running, or killed before writing"
                problems.append(Problem(cell_dir.name, "missing", reason))
                continue
            if not isinstance(rec, dict):
                raise RecordError(f"record is a JSON {type(rec).__name__}, not an object")
            validate_record(rec)
        except (OSError, ValueError, RecordError) as e:  # JSONDecodeError is a ValueError
            problems.append(Problem(cell_dir.name, "invalid", f"{type(e).__name__}: {e}"))
            continue
        records.append(rec)
    return from_records(records, expected=expected, problems=problems, source=str(results_dir))


def load_frame(results_dir: Path | str) -> pd.DataFrame:
    """The per-cell frame (done and failed cells) of a results folder; see :func:`load_results`."""
    return load_results(results_dir).cells
