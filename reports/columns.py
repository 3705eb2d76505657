"""Leaderboard columns: metric directions, column definitions and number formats.

Pure data and formatting, no I/O and no torch: :mod:`reports.records.results` (records → frames),
:mod:`reports.stats.summary` (per-configuration statistics) and the renderers all read them from
here.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from harness.contract.metric_spec import MetricSpec

Direction = Literal["higher", "lower"]

GROUP_KEYS = ("dataset", "backbone", "method", "M", "hparams", "variant")
ID_COLUMNS = ("suite", "cell_id", "status", *GROUP_KEYS, "seed")

#: A cell's ``evaluation.limit`` (absent or NaN: scored on the whole test set; present only where
#: some record has one). Its flattened-config copy makes it part of the row's variant
#: (:mod:`reports.records.results`), so cells scored on a subset never pool with full-set ones.
LIMIT_COLUMN = "limit"


def limit_text(limit: Any) -> str:
    """``test limited to 50 images`` (the marker of a limited evaluation), or ``""`` (None,
    NaN: the whole test set)."""
    if limit is None or (isinstance(limit, float) and math.isnan(limit)):
        return ""
    return f"test limited to {int(limit)} images"


def limits_note(summary: pd.DataFrame) -> str:
    """The page's and the terminal table's note on limited rows (``""``: none is): which limits,
    and that such rows never pool or compare with full-set ones."""
    if "limit" not in summary:
        return ""
    values = sorted({int(v) for v in summary["limit"] if v == v and v is not None})
    if not values:
        return ""
    some = "" if summary["limit"].notna().all() else "some rows' "
    sizes = " or ".join(str(v) for v in values)
    return (
        f"{some}test limited to {sizes} images (evaluation.limit: a quick first look; each OOD set "
        "and corruption limited likewise; never pooled or compared with full-set cells)"
    )


TEXT_COLUMNS = (
    "error_type", "error_message", "error_traceback", "started_at", "finished_at",
    "diagnostics_undeclared",
)  # fmt: skip
# The text columns of a row that describe how a cell was measured, joined per configuration by
# the summary ("diagnostics_shown": the declarations as JSON, which diagnostic_columns reads from
# the summary). Here, below both, because reports.records writes them and reports.stats joins
# them (neither folder imports the other back).
DIAGNOSTICS = "diagnostics_shown"  # the declared diagnostics shown, as JSON
METRICS_DECLARED = "metrics_declared"  # plugin metric declarations, as JSON
CONDITION_TEXT = (
    "cost_device", "cost_precision", "corruption_mean_over", "mce_over", DIAGNOSTICS,
    METRICS_DECLARED,
)  # fmt: skip

# The directions of the columns that are not metric columns, by base metric name. A column maps
# to its base name with base_metric(): "ood/svhn/msp/auroc" → "auroc", "sev3_ece" → "ece", and
# "ts/nll" → "nll", whose direction is its metric column's: the registered metric columns
# (harness.registry.METRICS: acc, NLL, ECE, … and plugins') declare their own, which
# direction() reads. Diversity (disagreement, mi, kl, k_eff, grad_ratio) has no better
# direction and is never highlighted. The rest stay declared here: they are aggregates of the
# metric columns (corruption means, validation), OOD scores and costs, not per-prediction
# metrics a plugin adds.
DIRECTIONS: dict[str, Direction] = {
    **dict.fromkeys(("member_acc", "val_acc", "cAcc", "auroc", "aupr_in", "aupr_out"), "higher"),
    **dict.fromkeys(("train_ips", "eval_ips"), "higher"),
    **dict.fromkeys(("cNLL", "cECE"), "lower"),
    **dict.fromkeys(("fpr95", "fpr95_id"), "lower"),  # OOD-positive (OpenOOD) / ID-positive
    **dict.fromkeys(("val_nll", "val_ece"), "lower"),
    **dict.fromkeys(("params", "params_trainable", "params_overhead", "flops"), "lower"),
    **dict.fromkeys(("train_mem_mib", "eval_mem_mib"), "lower"),
    **dict.fromkeys(("train_time_s", "epoch_time_s", "total_time_s", "train_device_h"), "lower"),
    "mCE": "lower",  # corruption error relative to a baseline (Hendrycks & Dietterich 2019)
}


def base_metric(column: str) -> str:
    """The metric name a column measures: ``ood/<set>/<score>/auroc`` → ``auroc``.

    Every slash-separated key ends with its metric: ``ood_near/msp/auroc``, ``corr/fog/acc``.
    """
    if "/" in column:
        return column.rsplit("/", 1)[-1]
    if column.startswith("sev") and "_" in column:
        return column.split("_", 1)[1]
    return column


def registered_metrics() -> list[MetricSpec]:
    """The registered metric columns (built-ins first, then plugins'), in registration order."""
    from harness.registry import METRICS

    return [spec for _, spec in METRICS.registered()]


def directions() -> dict[str, Direction]:
    """Every known direction by base metric name: :data:`DIRECTIONS` and the registered metric
    columns'."""
    out = {m.key: m.direction for m in registered_metrics() if m.direction}
    return {**out, **DIRECTIONS}


def direction(column: str) -> Direction | None:
    """``"higher"`` or ``"lower"`` if that is better for ``column``; None if neither."""
    base = base_metric(column)
    return DIRECTIONS.get(base) or directions().get(base)


#: Scores only an ensemble has (M > 1): the members' disagreement, their mutual information
#: (H(p̄) minus the expected member entropy) and pairwise KL, as metrics, and MI as an OOD score
#: (``ood…/mi/<metric>``). A single model's are 0 by construction (its MI-AUROC a coin's 50%):
#: the tables leave them blank and the figures leave them out (:func:`without_ensemble_only`).
ENSEMBLE_ONLY_METRICS = frozenset({"disagreement", "mi", "kl"})
ENSEMBLE_ONLY_SCORES = frozenset({"mi"})


def ensemble_only(column: str) -> bool:
    """Whether ``column`` (a cell column or a summary column's key) is a score only M > 1 has."""
    parts = column.split("/")
    if parts[0].startswith("ood") and len(parts) >= 3:
        return parts[-2] in ENSEMBLE_ONLY_SCORES
    return len(parts) == 1 and column in ENSEMBLE_ONLY_METRICS


def without_ensemble_only(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (per cell, or a summary's ``<key>_mean/_std/_ci/_n``) with every
    :func:`ensemble_only` value of a row with M ≤ 1 missing (NaN; n 0): what M = 1 cannot have
    is not drawn or shown as a number. The same frame when there is nothing left to blank."""
    if "M" not in frame or not len(frame):
        return frame
    single = (pd.to_numeric(frame["M"], errors="coerce") <= 1).to_numpy()
    stats = ("_mean", "_std", "_ci", "_n")
    cols = [c for c in frame.columns
            if ensemble_only(next((c[: -len(s)] for s in stats if c.endswith(s)), c))]  # fmt: skip
    values = [c for c in cols if not c.endswith("_n")]
    if not single.any() or not values or not frame.loc[single, values].notna().any().any():
        return frame
    out = frame.copy()
    for c in cols:
        out.loc[single, c] = 0 if c.endswith("_n") else math.nan
    return out


@dataclass(frozen=True)
class Column:
    """A leaderboard column: key in the frames, header label, header group, number format.

    ``hidden``: left out of the page's default view (the column picker shows it) and of the
    Markdown/LaTeX tables unless asked for; it crowds the table more than most readers need.
    """

    key: str
    label: str
    group: str
    kind: str  # "pct" (fraction shown ×100), "f3", "f2", "count" (11.2M), "int"
    hidden: bool = False
    #: The direction a record declares for the column (a plugin's metric, shown from records
    #: whose plugin is not loaded here); None: the known one, :func:`direction`.
    declared_direction: Direction | None = None

    @property
    def better(self) -> Direction | None:
        return self.declared_direction or direction(self.key)


def metric_column(spec: MetricSpec) -> Column:
    """The leaderboard column of a metric column's declaration."""
    return Column(spec.key, spec.label, spec.group, spec.kind, spec.hidden, spec.direction)


@functools.cache
def _unshown_declaration(key: str, why: str) -> None:
    """Warn, once per key, that a record's declared metric is not shown: one record written by
    a newer harness (or edited by hand) leaves its column out instead of stopping the report."""
    warnings.warn(f"metric column {key!r} not shown: {why}", stacklevel=3)


def metric_columns(group: str | None = None, frame: pd.DataFrame | None = None) -> list[Column]:
    """The metric columns (:func:`registered_metrics`, then those only the records of ``frame``
    declare: a plugin's, not loaded here), all or those of ``group`` (``"Quality"``,
    ``"Diversity"``, a plugin's own group; ``""``: every group but those two)."""
    specs = {m.key: m for m in registered_metrics()}
    for d in declared_metrics(frame) if frame is not None else ():
        if str(d["key"]) in specs:
            continue
        try:
            specs[str(d["key"])] = MetricSpec.from_declaration(d)
        except ValueError as exc:  # a kind or direction this reporter does not know
            _unshown_declaration(str(d["key"]), str(exc))
    if group == "":
        keep = [m for m in specs.values() if m.group not in ("Quality", "Diversity")]
    else:
        keep = [m for m in specs.values() if group is None or m.group == group]
    return [metric_column(m) for m in keep]


def quality_columns() -> list[Column]:
    """The registered quality columns: accuracy, NLL, ECE, Brier, aECE, AURC."""
    return metric_columns("Quality")


COST = (
    Column("params", "Params", "Cost", "count"),
    Column("flops", "FLOPs/img", "Cost", "count"),
    Column("train_ips", "Train img/s", "Cost", "int", hidden=True),
    Column("eval_ips", "Eval img/s", "Cost", "int"),
    Column("train_mem_mib", "Train mem MiB", "Cost", "int", hidden=True),
    Column("eval_mem_mib", "Eval mem MiB", "Cost", "int", hidden=True),
    Column("train_device_h", "Train device-h", "Cost", "f3"),
)
THROUGHPUT = ("train_ips", "eval_ips")  # measured while running: greyed when the device was shared
CORRUPTION = (
    Column("cAcc", "cAcc (%)", "Corruption", "pct"),
    Column("cNLL", "cNLL", "Corruption", "f3"),
    Column("cECE", "cECE (%)", "Corruption", "pct"),
    Column("mCE", "mCE (%)", "Corruption", "pct"),
)
# Diversity columns (disagreement, MI) are registered metric columns, group "Diversity"; a
# method's own diagnostics come from its declarations: diagnostic_columns.
#: Declared diagnostics shown by default whatever their declaration says: σN-Ens's k_eff (the
#: sharing of its members, 1 = each feature owned by one member, M = shared by all) decides
#: whether its row is an ensemble at all, so the reader sees it without the column picker.
SHOWN_DIAGNOSTICS = frozenset({"k_eff"})

#: A collapsed ensemble: M > 1 members whose top-1 predictions disagree on fewer than this
#: fraction of the clean test images (``disagreement``, the mean over member pairs, mean over
#: seeds on the leaderboard). Below one image in a thousand the members are one model; a deep
#: ensemble of the smoke suite disagrees on 3.5%, the smoke σN-Ens at τ = 1 on 0.09%.
COLLAPSE_DISAGREEMENT = 0.001
COLLAPSE_NOTE = (  # what "collapsed" means, after the word on the page and in the Markdown
    f"an ensemble (M > 1) whose members disagree on fewer than "
    f"{100 * COLLAPSE_DISAGREEMENT:g}% of the clean test images (disagreement, mean over member "
    "pairs and seeds): its members are one model, and its numbers are a single model's"
)


def collapsed(disagreement: Any, m: Any) -> Any:
    """Whether an ensemble of ``m`` members with this ``disagreement`` is collapsed
    (:data:`COLLAPSE_DISAGREEMENT`): scalars give a bool, Series a boolean Series; a missing
    disagreement or M, or M ≤ 1, is never collapsed."""
    if isinstance(disagreement, pd.Series):  # NaN compares False: never collapsed
        d = pd.to_numeric(disagreement, errors="coerce")
        members = pd.to_numeric(m, errors="coerce") if isinstance(m, pd.Series) else m
        return ((members > 1) & (d < COLLAPSE_DISAGREEMENT)).astype(bool)
    try:
        d, members = float(disagreement), float(m)
    except (TypeError, ValueError):
        return False
    return bool(members > 1 and d < COLLAPSE_DISAGREEMENT)  # NaN compares False


#: OOD scores (record keys → labels), in the table's order: the probability scores of the pooled
#: prediction, the mutual information, then the logit scores (records since issue 60 item 7;
#: none for a model that gives probabilities only).
OOD_SCORES = {
    "msp": "MSP",
    "entropy": "entropy",
    "mi": "MI",
    "energy": "energy",
    "max_logit": "max-logit",
}
OOD_METRICS = {
    "auroc": "AUROC",
    "aupr_in": "AUPR-In",
    "aupr_out": "AUPR-Out",
    "fpr95": "FPR95",
    "fpr95_id": "FPR95-ID",
}
OOD_SHOWN = {("msp", "auroc"), ("msp", "fpr95")}  # the rest waits in the column picker
#: Shown on the near/far means only (on each set where no record groups its sets), so that the
#: default table grows by one column per score and group, not per set.
OOD_SHOWN_MEANS = {("energy", "auroc"), ("max_logit", "auroc")}
# The near-/far-OOD mean columns (reports.records.flatten.ood_group_columns).
NEAR_FAR_COLUMNS = {"ood_near": "near", "ood_far": "far"}


def ood_sets(frame: pd.DataFrame) -> list[str]:
    """OOD set names present in a cell or summary frame, in first-seen order."""
    seen: dict[str, None] = {}
    for c in frame.columns:
        if c.startswith("ood/"):
            seen[c.split("/")[1]] = None
    return list(seen)


def ood_score_labels(keys: Iterable[str]) -> list[str]:
    """The labels of the OOD scores that column keys (``ood/<set>/<score>/<metric>``,
    ``ood_near/<score>/<metric>``, a summary's ``…_mean``) hold, in :data:`OOD_SCORES` order."""
    prefixes = ("ood/", *(f"{p}/" for p in NEAR_FAR_COLUMNS))
    present = {str(k).split("/")[-2] for k in keys if str(k).startswith(prefixes)}
    return [label for score, label in OOD_SCORES.items() if score in present]


def ood_columns(summary: pd.DataFrame) -> list[Column]:
    """Near/far means, then each OOD set: every score × metric (MSP AUROC/FPR95 shown; the
    energy and max-logit AUROC on the near/far means, or on each set where there are none)."""
    sources = [*NEAR_FAR_COLUMNS.items(), *((f"ood/{s}", s) for s in ood_sets(summary))]
    grouped = any(
        c.startswith(tuple(f"{p}/" for p in NEAR_FAR_COLUMNS)) and summary[c].notna().any()
        for c in summary.columns
    )

    def shown(prefix: str, score: str, metric: str) -> bool:
        if (score, metric) in OOD_SHOWN:
            return True
        return (score, metric) in OOD_SHOWN_MEANS and (prefix in NEAR_FAR_COLUMNS or not grouped)

    return [
        Column(
            f"{prefix}/{score}/{m}",
            f"{mlabel} {name} ({slabel})",
            "OOD",
            "pct",
            hidden=not shown(prefix, score, m),
        )
        for prefix, name in sources
        for score, slabel in OOD_SCORES.items()
        for m, mlabel in OOD_METRICS.items()
    ]


def corruption_names(frame: pd.DataFrame) -> list[str]:
    """Corruption names with per-corruption columns (``corr/<name>/acc``), in first-seen order."""
    seen: dict[str, None] = {}
    for c in frame.columns:
        if c.startswith("corr/"):
            seen[c.split("/")[1]] = None
    return list(seen)


def declared_metrics(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Every metric column declaration in a cell or summary frame's ``metrics_declared``
    column (a plugin's metrics, written into the records by the engine), each key once."""
    return _declarations(frame, METRICS_DECLARED, "key")


def declared_diagnostics(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Every diagnostic declaration in a cell or summary frame's ``diagnostics_shown`` column
    (JSON lists, several per summary row when its records differ, joined by "; "), each column
    once, in first-seen order."""
    return _declarations(frame, DIAGNOSTICS, "column")


def _declarations(frame: pd.DataFrame, column: str, name: str) -> list[dict[str, Any]]:
    """The JSON declaration lists of a text ``column`` (several per summary row when its
    records differ, joined by "; "), each once by ``name`` (else ``key``), first-seen order."""
    seen: dict[str, dict[str, Any]] = {}
    decoder = json.JSONDecoder()
    for text in frame.get(column, pd.Series(dtype=object)).dropna().unique():
        pos, text = 0, str(text)
        while pos < len(text):
            try:
                items, pos = decoder.raw_decode(text, pos)
            except ValueError:
                break
            for d in items if isinstance(items, list) else ():
                if isinstance(d, dict) and d.get("key"):
                    seen.setdefault(str(d.get(name) or d["key"]), d)
            pos += 2 if text.startswith("; ", pos) else len(text)
    return list(seen.values())


def diagnostic_columns(summary: pd.DataFrame) -> list[Column]:
    """The columns of the diagnostics the records declare (label, group, format, hidden)."""
    return [
        Column(
            str(d.get("column") or d["key"]),
            str(d.get("label") or d["key"]),
            str(d.get("group") or "Diagnostics"),
            str(d.get("format") or "f3"),
            hidden=bool(d.get("hidden", True))
            and str(d.get("column") or d["key"]) not in SHOWN_DIAGNOSTICS,
        )
        for d in declared_diagnostics(summary)
    ]


#: Post-hoc calibration (reports.records.flatten): the pool-then-calibrate metrics beside the raw
#: ones.
CALIBRATED = (
    Column("ts/nll", "NLL (TS)", "Calibrated (TS)", "f3"),
    Column("ts/ece", "ECE (TS, %)", "Calibrated (TS)", "pct"),
    Column("ts/brier", "Brier (TS)", "Calibrated (TS)", "f3", hidden=True),
    Column("ts/aece", "aECE (TS, %)", "Calibrated (TS)", "pct", hidden=True),
    Column("ts/aurc", "AURC (TS, %)", "Calibrated (TS)", "pct", hidden=True),
    Column("ts/cNLL", "cNLL (TS)", "Calibrated (TS)", "f3"),
    Column("ts/cECE", "cECE (TS, %)", "Calibrated (TS)", "pct"),
    Column("ts/temperature", "T", "Calibrated (TS)", "f3", hidden=True),
    Column("ts_members/nll", "NLL (TS per member)", "Calibrated (TS)", "f3", hidden=True),
    Column("ts_members/ece", "ECE (TS per member, %)", "Calibrated (TS)", "pct", hidden=True),
)
#: Conformal sets (THR, APS, RAPS) per α (reports.records.flatten): coverage, mean size and
#: empty-set rate of the sets as the methods define them, then of torch-uncertainty's sets (the
#: top class added to an empty set, "+fb"), clean and over the corruptions (key, label, kind).
CONFORMAL_METHODS = ("thr", "aps", "raps")
CONFORMAL_STATS = (
    ("coverage", "cov. (%)", "pct"),
    ("size", "size", "f2"),
    ("empty_rate", "empty (%)", "pct"),
    ("coverage_fallback", "cov. +fb (%)", "pct"),
    ("size_fallback", "size +fb", "f2"),
    ("c_coverage", "cov. corr. (%)", "pct"),
    ("c_size", "size corr.", "f2"),
    ("c_empty_rate", "empty corr. (%)", "pct"),
    ("c_coverage_fallback", "cov. corr. +fb (%)", "pct"),
    ("c_size_fallback", "size corr. +fb", "f2"),
)
#: Shown by default, for APS: coverage and size of the sets as defined (and the corruption
#: coverage); the "+fb" twin takes the place of one a record does not have (records written
#: before the sets were reported as defined hold the fallback numbers alone).
CONFORMAL_SHOWN = ("coverage", "size", "c_coverage")
CONFORMAL_GROUP = "Conformal sets (target coverage 1 − α; +fb sets cover more)"


def conformal_predictors(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """``(method, α)`` of every conformal column of a cell or summary frame (``cp/aps@0.1/…``),
    by method (THR, APS, RAPS) then α; α is ``""`` for a record that stated none."""
    seen: dict[tuple[str, str], None] = {}
    for c in frame.columns:
        if c.startswith("cp/"):
            method, _, alpha = c.split("/")[1].partition("@")
            seen[(method, alpha)] = None
    order = {m: i for i, m in enumerate(CONFORMAL_METHODS)}

    def key(p: tuple[str, str]) -> tuple[int, str, float]:
        try:
            alpha = float(p[1])
        except ValueError:
            alpha = math.inf
        return (order.get(p[0], len(order)), p[0], alpha)

    return sorted(seen, key=key)


def conformal_columns(summary: pd.DataFrame) -> list[Column]:
    """Every conformal predictor's :data:`CONFORMAL_STATS`, α in every label."""

    def has(key: str) -> bool:
        col = f"{key}_mean"
        return col in summary and bool(summary[col].notna().any())

    out = []
    for method, alpha in conformal_predictors(summary):
        prefix = f"cp/{method}@{alpha}" if alpha else f"cp/{method}"
        where = f"{method.upper()} α={alpha}" if alpha else method.upper()
        for stat, label, kind in CONFORMAL_STATS:
            base = stat.replace("_fallback", "")
            shown = method == "aps" and (
                stat in CONFORMAL_SHOWN
                or (stat != base and base in CONFORMAL_SHOWN and not has(f"{prefix}/{base}"))
            )
            out.append(
                Column(f"{prefix}/{stat}", f"{where} {label}", CONFORMAL_GROUP, kind, not shown)
            )
    return out


#: The group the page's raw/calibrated toggle shows and hides.
CALIBRATED_GROUP = "Calibrated (TS)"


def leaderboard_columns(summary: pd.DataFrame, *, hidden: bool = True) -> list[Column]:
    """Metric columns of the leaderboard, grouped, in order; all-empty ones dropped.

    ``hidden=False`` leaves out the columns hidden by default (Markdown, LaTeX, terminal).
    """
    cols = [*metric_columns("Quality", summary), *CALIBRATED, *COST, *CORRUPTION]
    cols += conformal_columns(summary)
    cols += ood_columns(summary)
    cols += metric_columns("Diversity", summary)
    cols += metric_columns("", summary)  # plugins' own groups
    cols += diagnostic_columns(summary)
    return [
        c
        for c in cols
        if f"{c.key}_mean" in summary
        and summary[f"{c.key}_mean"].notna().any()
        and (hidden or not c.hidden)
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


def m_text(m: Any, missing: str = "") -> str:
    """An ensemble size for display: ``4``; ``missing`` when absent or NaN."""
    return missing if m is None or pd.isna(m) else f"{float(m):g}"


def iter_rows(frame: pd.DataFrame) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(label, row as a dict)`` for every row: what ``iterrows`` gives, without building a
    Series per row (at 1,000 configurations × 100 columns the Series were most of a report)."""
    return zip(frame.index, frame.to_dict("records"), strict=True)


def cell_text(mean: Any, spread: Any, n: Any, kind: str, *, show_n: bool = False) -> str:
    """``mean ± spread`` in a column's format (± left out when the spread is NaN or 0)."""
    text = format_number(mean, kind)
    if text == "–":
        return text
    if spread is not None and not pd.isna(spread) and float(spread) != 0:
        text += f" ± {format_number(spread, kind)}"
    if show_n and n is not None and not pd.isna(n):
        text += f" ({int(n)})"
    return text
