"""Result records → pandas tables: one row per cell, and mean ± std (n) across seeds.

``load_results(results_dir)`` reads every cell folder, keeps what validates, and lists every cell
that did not produce a usable record (failed, invalid, missing) with its reason, so a folder with
failed or unfinished cells still reports. ``records_to_frame`` flattens records to one row per cell;
``aggregate`` groups done cells by (dataset, backbone, method, M, hparams, variant) and gives, per
metric, ``<col>_mean``, ``<col>_std`` (sample std, ddof=1; NaN when fewer than two values) and
``<col>_n`` (the number of finite values, so a diverged seed shows as a smaller n, never as a
silently better mean). ``variant`` names config fields (recipe, backbone_kwargs, ...) that differ
between cells of one group, so cells that are not seeds of one configuration are never averaged.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from harness.records import RECORD_FILE, RecordError, read_record, validate_record

Direction = Literal["higher", "lower"]

GROUP_KEYS = ("dataset", "backbone", "method", "M", "hparams", "variant")
ID_COLUMNS = ("suite", "cell_id", "status", *GROUP_KEYS, "seed")
TEXT_COLUMNS = ("error_type", "error_message", "error_traceback", "started_at", "finished_at")
_CONFIG_IDENTITY = ("dataset", "backbone", "method", "M", "hparams", "seed")

# The one table of metric directions, by base metric name. A column maps to its base name with
# base_metric(): "ood/svhn/msp/auroc" → "auroc", "sev3_ece" → "ece". Diversity diagnostics
# (disagreement, mi, kl, k_eff) have no better direction and are never highlighted.
DIRECTIONS: dict[str, Direction] = {
    **dict.fromkeys(
        ("acc", "member_acc", "val_acc", "cAcc", "auroc", "aupr_in", "aupr_out"), "higher"
    ),
    **dict.fromkeys(("train_ips", "eval_ips"), "higher"),
    **dict.fromkeys(("nll", "brier", "ece", "aece", "aurc", "cNLL", "cECE", "fpr95"), "lower"),
    **dict.fromkeys(("val_nll", "val_ece"), "lower"),
    **dict.fromkeys(("params", "params_trainable", "params_overhead", "flops"), "lower"),
    **dict.fromkeys(("train_mem_mib", "eval_mem_mib"), "lower"),
    **dict.fromkeys(("train_time_s", "epoch_time_s", "total_time_s"), "lower"),
}

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
_CLEAN_KEYS = ("acc", "nll", "brier", "ece", "aece", "aurc", "disagreement", "mi", "kl")


def base_metric(column: str) -> str:
    """The metric name a column measures: ``ood/<set>/<score>/auroc`` → ``auroc``."""
    if column.startswith("ood/"):
        return column.rsplit("/", 1)[-1]
    if column.startswith("sev") and "_" in column:
        return column.split("_", 1)[1]
    return column


def direction(column: str) -> Direction | None:
    """``"higher"`` or ``"lower"`` if that is better for ``column``; None if neither."""
    return DIRECTIONS.get(base_metric(column))


@dataclass(frozen=True)
class Column:
    """A leaderboard column: key in the frames, header label, header group, number format."""

    key: str
    label: str
    group: str
    kind: str  # "pct" (fraction shown ×100), "f3", "f2", "count" (11.2M), "int"

    @property
    def better(self) -> Direction | None:
        return direction(self.key)


QUALITY = (
    Column("acc", "Acc (%)", "Quality", "pct"),
    Column("nll", "NLL", "Quality", "f3"),
    Column("ece", "ECE (%)", "Quality", "pct"),
    Column("brier", "Brier", "Quality", "f3"),
    Column("aece", "aECE (%)", "Quality", "pct"),
)
COST = (
    Column("params", "Params", "Cost", "count"),
    Column("flops", "FLOPs/img", "Cost", "count"),
    Column("train_ips", "Train img/s", "Cost", "int"),
    Column("eval_ips", "Eval img/s", "Cost", "int"),
    Column("train_mem_mib", "Train mem MiB", "Cost", "int"),
    Column("eval_mem_mib", "Eval mem MiB", "Cost", "int"),
)
CORRUPTION = (
    Column("cAcc", "cAcc (%)", "Corruption", "pct"),
    Column("cNLL", "cNLL", "Corruption", "f3"),
    Column("cECE", "cECE (%)", "Corruption", "pct"),
)
DIVERSITY = (
    Column("disagreement", "Disagr. (%)", "Diversity", "pct"),
    Column("mi", "MI", "Diversity", "f3"),
    Column("k_eff", "k_eff", "Diversity", "f2"),
)


def ood_sets(frame: pd.DataFrame) -> list[str]:
    """OOD set names present in a cell or summary frame, in first-seen order."""
    seen: dict[str, None] = {}
    for c in frame.columns:
        if c.startswith("ood/"):
            seen[c.split("/")[1]] = None
    return list(seen)


def leaderboard_columns(summary: pd.DataFrame, score: str = "msp") -> list[Column]:
    """Metric columns shown on the leaderboard, quality then cost, in order; all-empty dropped."""
    ood = [
        Column(f"ood/{s}/{score}/{m}", f"{label} {s}", "OOD", "pct")
        for s in ood_sets(summary)
        for m, label in (("auroc", "AUROC"), ("fpr95", "FPR95"))
    ]
    cols = [*QUALITY, *COST, *CORRUPTION, *ood, *DIVERSITY]
    return [
        c for c in cols if f"{c.key}_mean" in summary and summary[f"{c.key}_mean"].notna().any()
    ]


def format_number(value: Any, kind: str) -> str:
    """One number in a column's format; "–" for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    v = float(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if kind == "pct":
        return f"{100 * v:.2f}"
    if kind == "f3":
        return f"{v:.3f}"
    if kind == "f2":
        return f"{v:.2f}"
    if kind == "count":
        for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
            if abs(v) >= div:
                return f"{v / div:.2f}{suffix}"
        return f"{v:.0f}"
    return f"{v:,.0f}"


def format_cell(mean: Any, std: Any, n: Any, kind: str, *, show_n: bool = True) -> str:
    """``mean ± std (n)``; the ± part is left out when std is NaN (n = 1) or exactly 0."""
    text = format_number(mean, kind)
    if text == "–":
        return text
    if std is not None and not (isinstance(std, float) and math.isnan(std)) and float(std) != 0:
        text += f" ± {format_number(std, kind)}"
    if show_n and n is not None and not pd.isna(n):
        text += f" ({int(n)})"
    return text


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def m_text(m: Any, missing: str = "") -> str:
    """An ensemble size for display: ``4``; ``missing`` when absent or NaN."""
    return missing if m is None or pd.isna(m) else f"{float(m):g}"


def method_defaults(method: str | None) -> dict[str, Any]:
    """Default hyper-parameters of a registered method ({} for an unknown one)."""
    from harness.registry import UnknownNameError
    from harness.suite import method_defaults as defaults_of

    try:
        return defaults_of(str(method))
    except UnknownNameError:
        return {}


def format_hparams(hparams: Mapping[str, Any] | None, method: str | None = None) -> str:
    """A readable, order-independent hyper-parameter string: ``lam=0.1, tau=0.5``.

    With ``method``, values equal to the method's current defaults are left out (the mapping
    stays one-to-one: two different configurations never print the same).
    """
    defaults = method_defaults(method) if method else {}
    parts = []
    for k in sorted(hparams or {}):
        v = hparams[k]
        if k in defaults and defaults[k] == v:
            continue
        if isinstance(v, float):
            v = f"{v:g}"
        elif not isinstance(v, str | int | bool):
            v = json.dumps(v, sort_keys=True)
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(obj, Mapping) and obj:
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(obj, sort_keys=True, default=str)}


def _identity(cfg: Mapping[str, Any]) -> tuple[str, str, str, Any, str]:
    return (
        str(cfg.get("dataset", "?")),
        str(cfg.get("backbone", "?")),
        str(cfg.get("method", "?")),
        cfg.get("M"),
        format_hparams(cfg.get("hparams"), cfg.get("method")),
    )


def variant_keys(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Dotted config keys (besides the identity and seed) that differ inside one group."""
    seen: dict[tuple, dict[str, set[str]]] = {}
    for cfg in configs:
        rest = {k: v for k, v in cfg.items() if k not in _CONFIG_IDENTITY}
        values = seen.setdefault(_identity(cfg), {})
        flat = _flatten(rest)
        for k in set(flat) | set(values):
            values.setdefault(k, set()).add(flat.get(k, "<absent>"))
    return sorted({k for values in seen.values() for k, v in values.items() if len(v) > 1})


def flatten_record(rec: Mapping[str, Any], variant: Iterable[str] = ()) -> dict[str, Any]:
    """One leaderboard row for one record (absent metrics are NaN)."""
    cfg = rec.get("config") or {}
    dataset, backbone, method, M, hparams = _identity(cfg)
    flat_cfg = _flatten({k: v for k, v in cfg.items() if k not in _CONFIG_IDENTITY})
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
    row["importance_mean"] = _num(last.get("importance"))
    row["l_div"] = _num(last.get("l_div"))
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
    variant = variant_keys(r.get("config") or {} for r in records)
    frame = pd.DataFrame([flatten_record(r, variant) for r in records])
    if frame.empty:
        return pd.DataFrame(columns=[*ID_COLUMNS, "acc", "nll", "ece"])
    return frame


def metric_columns(cells: pd.DataFrame) -> list[str]:
    """The numeric measurement columns of a cell frame (not identity, text or hparams)."""
    skip = set(ID_COLUMNS) | set(TEXT_COLUMNS)
    return [
        c
        for c in cells.columns
        if c not in skip and not c.startswith("hp_") and pd.api.types.is_numeric_dtype(cells[c])
    ]


def aggregate(cells: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (ddof=1) and n of every metric over the seeds of each group of done cells.

    Non-finite values (a diverged seed) are left out of mean and std and counted in
    ``n_nonfinite``; ``n`` is the number of done cells, ``n_failed`` the failed ones of the group.
    """
    keys = list(GROUP_KEYS)
    metrics = metric_columns(cells)
    done = cells[cells["status"] == "done"]
    if done.empty:
        return pd.DataFrame(columns=[*keys, "n", "n_failed", "n_nonfinite", "seeds"])
    values = done[metrics].astype(float)
    nonfinite = ~np.isfinite(values[[c for c in ("acc", "nll") if c in values]]).all(axis=1)
    values = values.where(np.isfinite(values))
    grouped = values.groupby([done[k] for k in keys], dropna=False, sort=True)
    parts = {"mean": grouped.mean(), "std": grouped.std(ddof=1), "n": grouped.count()}
    stats = pd.DataFrame({f"{c}_{s}": parts[s][c] for c in metrics for s in ("mean", "std", "n")})
    by_key = done.groupby(keys, dropna=False, sort=True)
    failed = cells[cells["status"] == "failed"].groupby(keys, dropna=False).size()
    front = pd.DataFrame(
        {
            "n": by_key.size(),
            "n_failed": failed.reindex(stats.index, fill_value=0).astype(int),
            "n_nonfinite": nonfinite.groupby([done[k] for k in keys], dropna=False).sum(),
            "seeds": by_key["seed"].agg(lambda s: ", ".join(str(x) for x in sorted(s))),
        }
    )
    hp = [c for c in cells.columns if c.startswith("hp_")]
    stats = pd.concat([front, stats, *([by_key[hp].first()] if hp else [])], axis=1)
    return stats.reset_index()


@dataclass
class Problem:
    """A cell without a usable record: failed, invalid or missing, and why."""

    cell_id: str
    status: Literal["failed", "invalid", "missing"]
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

    @property
    def n_done(self) -> int:
        return int((self.cells["status"] == "done").sum()) if len(self.cells) else 0


def describe_config(cfg: Mapping[str, Any]) -> str:
    """``dataset / backbone / method M=4 (tau=0.5) seed=0`` for the problem list."""
    dataset, backbone, method, M, hparams = _identity(cfg)
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
        desc = describe_config(cfg) if isinstance(cfg, Mapping) else ""
        if cell_id is not None:
            if str(cell_id) in ids:
                continue
        elif any(_config_matches(cfg, r.get("config") or {}) for r in records):
            continue
        ident = str(cell_id) if cell_id is not None else "(no id)"
        out.append(Problem(ident, "missing", "expected cell has no record (not run yet?)", desc))
    return out


def _provenance(records: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    def counted(values: Iterable[Any]) -> list[str]:
        counts = Counter(str(v) for v in values if v not in (None, ""))
        return [f"{v} ({n} cells)" if len(counts) > 1 else v for v, n in counts.most_common()]

    envs = [r.get("environment") or {} for r in records]
    keys = ["git_commit", "python", "torch", "torch_uncertainty", "platform", "device", "cpu"]
    keys += [*sorted({k for e in envs for k in e} - {*keys, "hostname"}), "hostname"]
    out = {"suite": counted(r.get("suite") for r in records)}
    out.update({k: counted(e.get(k) for e in envs) for k in keys})
    started = [str(r["started_at"]) for r in records if r.get("started_at")]
    finished = [str(r["finished_at"]) for r in records if r.get("finished_at")]
    if started and finished:
        out["runs"] = [f"{min(started)} → {max(finished)}"]
    out["report generated"] = [datetime.now(timezone.utc).isoformat(timespec="seconds")]
    return {k: v for k, v in out.items() if v}


def _conventions(records: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, dict[str, None]] = {}
    for r in records:
        for k, v in (r.get("conventions") or {}).items():
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            out.setdefault(str(k), {})[text] = None
    return {k: list(v) for k, v in out.items()}


def from_records(
    records: Iterable[Mapping[str, Any]],
    expected: Iterable[Any] | None = None,
    problems: Iterable[Problem] = (),
    source: str = "",
) -> Results:
    """:class:`Results` from records already read (each must validate)."""
    records = list(records)
    problems = list(problems)
    cells = records_to_frame(records)
    for r in records:
        if r.get("status") == "failed":
            err = r.get("error") or {}
            reason = f"{err.get('type', 'Error')}: {err.get('message', '')}".strip()
            detail = str(err.get("traceback", ""))
            cfg = describe_config(r.get("config") or {})
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
