"""Per-configuration statistics over seeds: mean, sample std and n of every metric.

``aggregate`` groups done cells by (dataset, backbone, method, M, hparams, variant) and gives, per
metric, ``<col>_mean``, ``<col>_std`` (sample std, ddof=1; NaN when fewer than two values) and
``<col>_n`` (the number of finite values, so a diverged seed shows as a smaller n, never as a
silently better mean) and ``<col>_ci`` (the half-width of the 95% t-interval of the mean,
t_{n-1,0.975}·std/√n: the alternative view to ± std; NaN below two values).

``relative_corruption_error`` adds the mCE column (Hendrycks & Dietterich 2019) to the cell frame.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from reports.columns import CONDITION_TEXT, GROUP_KEYS, ID_COLUMNS, LIMIT_COLUMN, TEXT_COLUMNS
from reports.stats.significance import t_quantile

CI_LEVEL = 0.95
MCE_BASELINE = "single"  # the default mCE baseline: one plain network, as in the paper


def metric_columns(cells: pd.DataFrame) -> list[str]:
    """The numeric measurement columns of a cell frame (not identity, text or hparams)."""
    skip = set(ID_COLUMNS) | set(TEXT_COLUMNS) | set(CONDITION_TEXT)
    return [
        c
        for c in cells.columns
        if c not in skip and not c.startswith("hp_") and pd.api.types.is_numeric_dtype(cells[c])
    ]


def drop_duplicate_seeds(cells: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """Keep one done cell per configuration and seed.

    Two records can describe the same configuration and seed under different cell ids (a
    method gained a hyper-parameter whose default reproduces the old behaviour, so the cell was
    re-run under its new id); counting both would pass one seed off as two and shrink every
    interval. The most recently finished one is kept.

    Returns:
        The frame without the older duplicates, and ``(dropped cell id, kept cell id)`` pairs.
    """
    if cells.empty or "seed" not in cells:
        return cells, []
    done = cells[cells["status"] == "done"].sort_values("finished_at", kind="stable")
    keys = [*GROUP_KEYS, "seed"]
    dup = done.duplicated(keys, keep="last")
    if not dup.any():
        return cells, []
    kept = done[~dup].set_index(keys)["cell_id"]
    pairs = [
        (str(r["cell_id"]), str(kept.loc[tuple(r[k] for k in keys)]))
        for _, r in done[dup].iterrows()
    ]
    return cells.drop(index=done.index[dup]), pairs


def _per_group(codes: np.ndarray, values: pd.Series) -> list[list]:
    """The values of each group (numbered 0…k-1 by ``codes``), in the rows' order."""
    out: list[list] = [[] for _ in range(int(codes.max()) + 1 if len(codes) else 0)]
    for code, value in zip(codes.tolist(), values.tolist(), strict=True):
        out[code].append(value)
    return out


def aggregate(cells: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (ddof=1) and n of every metric over the seeds of each group of done cells.

    Non-finite values (a diverged seed) are left out of mean and std and counted in
    ``n_nonfinite``; ``n`` is the number of done cells, ``n_failed`` the failed ones of the group.
    ``<col>_ci`` is the 95% t-interval half-width; the text columns of
    :mod:`reports.records.flatten` (device, precision, corruption list) are joined per group.
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
    parts["ci"] = parts["std"] * t_factor(parts["n"])
    # One index for all (the parts share the groupby's): a dict of Series would align 400
    # columns' indexes one by one.
    stats = pd.DataFrame(
        {f"{c}_{s}": parts[s][c].to_numpy() for c in metrics for s in ("mean", "std", "n", "ci")},
        index=parts["mean"].index,
    )
    by_key = done.groupby(keys, dropna=False, sort=True)
    failed = cells[cells["status"] == "failed"].groupby(keys, dropna=False).size()
    front = pd.DataFrame(
        {
            "n": by_key.size(),
            "n_failed": failed.reindex(stats.index, fill_value=0).astype(int),
            "n_nonfinite": nonfinite.groupby([done[k] for k in keys], dropna=False).sum(),
        }
    )
    # The text columns joined per group in one pass over the rows (a pandas .agg with a Python
    # function per group cost 0.15 s at 1,000 groups); groups numbered in the order of `front`.
    codes = by_key.ngroup().to_numpy()
    front["seeds"] = [", ".join(str(x) for x in sorted(v)) for v in _per_group(codes, done["seed"])]
    for c in CONDITION_TEXT:
        if c in done:
            # `x == x` leaves out a missing value (NaN) as well as "": a text column only some
            # records fill (metrics_declared: those run with a plugin metric) is NaN elsewhere.
            front[c] = [
                "; ".join(sorted({str(x) for x in v if x and x == x}))
                for v in _per_group(codes, done[c])
            ]
    if LIMIT_COLUMN in done:  # one per group: the variant keeps limits apart
        front["limit"] = by_key[LIMIT_COLUMN].max()
    hp = [c for c in cells.columns if c.startswith("hp_")]
    stats = pd.concat([front, stats, *([by_key[hp].first()] if hp else [])], axis=1)
    return stats.reset_index()


def t_factor(n: pd.DataFrame | np.ndarray, level: float = CI_LEVEL) -> pd.DataFrame | np.ndarray:
    """t_{n-1,(1+level)/2}/√n for each count (NaN below 2): std × this = the interval half-width."""
    n_arr = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = t_quantile((1 + level) / 2, np.maximum(n_arr - 1, 1))
        f = np.where(n_arr >= 2, t / np.sqrt(n_arr), np.nan)
    return pd.DataFrame(f, index=n.index, columns=n.columns) if isinstance(n, pd.DataFrame) else f


def relative_corruption_error(
    cells: pd.DataFrame, baseline: str | None = MCE_BASELINE
) -> pd.DataFrame:
    """``cells`` with an ``mCE`` column: each cell's corruption error relative to ``baseline``.

    Hendrycks & Dietterich (ICLR 2019, §3), computed by
    :func:`reports.stats.summary.mean_corruption_error`: CE_c = Σ_s E_{c,s} / Σ_s
    E_{c,s}^baseline over the severities the cell and the baseline share, mCE = the mean of CE_c;
    E = 1 − accuracy. The baseline is the done cells of method ``baseline`` on the same dataset,
    backbone and variant, its per-(corruption, severity) error averaged over their seeds (and over
    its configurations when it has several, e.g. M=1 only for ``single``). Only the corruptions in
    the cell's ``mce_over`` (its benchmark corruptions) count; one where the baseline's error is 0
    is left out with a warning. Cells without a baseline or per-corruption results get NaN; so
    does the whole column when ``baseline`` is None. The baseline's own cells get their ratio to
    the baseline mean (about 1 = 100%). Records read without ``corr_severity_acc`` use the
    per-corruption means ``corr/<c>/acc`` (as one severity).
    """
    out = cells.copy()
    out["mCE"] = math.nan
    names = [c.split("/")[1] for c in cells.columns if c.startswith("corr/") and c.endswith("/acc")]
    if baseline is None or not names or "method" not in cells:
        return out
    done = cells["status"] == "done" if "status" in cells else pd.Series(True, index=cells.index)
    errors = {idx: _severity_errors(cells.loc[idx], names) for idx in cells.index[done]}
    keys = ["dataset", "backbone", "variant"]
    base: dict[tuple, dict[str, dict[str, float]]] = {}
    for key, group in cells[done & (cells["method"] == baseline)].groupby(keys, dropna=False):
        pooled: dict[str, dict[str, list[float]]] = {}
        for idx in group.index:
            for c, by_sev in errors[idx].items():
                for s, e in by_sev.items():
                    pooled.setdefault(c, {}).setdefault(s, []).append(e)
        base[key] = {c: {s: float(np.mean(v)) for s, v in d.items()} for c, d in pooled.items()}
    for idx in cells.index[done]:
        key = tuple(cells.loc[idx, k] for k in keys)
        if key not in base:
            continue
        over = [c for c in str(cells.loc[idx].get("mce_over", "") or "").split(", ") if c]
        out.loc[idx, "mCE"] = mean_corruption_error(errors[idx], base[key], over or names)
    return out


def _severity_errors(row: pd.Series, names: list[str]) -> dict[str, dict[str, float]]:
    """{corruption: {severity: 1 − acc}} of one cell row (finite values only)."""
    text = row.get("corr_severity_acc")
    if isinstance(text, str) and text:
        acc = {c: {s: float(a) for s, a in d.items()} for c, d in json.loads(text).items()}
    else:  # a frame without the per-severity column: the per-corruption mean, one "severity"
        acc = {c: {"mean": float(row.get(f"corr/{c}/acc", math.nan))} for c in names}
    return {c: {s: 1 - a for s, a in d.items() if math.isfinite(a)} for c, d in acc.items()}


# mCE from the per-severity accuracies of the records (stdlib only: the reporter never imports
# torch or the engine).


def mean_corruption_error(
    errors: Mapping[str, Mapping[int, float]],
    baseline: Mapping[str, Mapping[int, float]],
    corruptions: Sequence[str] | None = None,
) -> float:
    """mCE (Hendrycks & Dietterich, ICLR 2019, §3) of one model against a baseline.

    CE_c = Σ_s E_{c,s} / Σ_s E^base_{c,s} and mCE = the mean of CE_c over the corruptions c.
    Both sums run over the severities *both* models were evaluated at, so a model evaluated on
    fewer severities than its baseline is compared on those (dividing by the baseline's error
    over all of its severities would compare different severity sets: a model with exactly
    0.8× the baseline's error would not get 0.8).

    Args:
        errors: {corruption: {severity: error}} of the model (error = 1 − accuracy).
        baseline: the same for the baseline.
        corruptions: the corruptions that count (None: those in ``errors``); one without a
            common severity with the baseline is left out.

    Returns:
        mCE as a fraction (1.0 = the baseline's error); NaN when no corruption counts.

    Warns:
        UserWarning: naming each corruption left out because the baseline's error over the
            common severities is 0 (CE_c would be undefined).
    """
    ratios: list[float] = []
    zero: list[str] = []
    for c in errors if corruptions is None else corruptions:
        mine, base = errors.get(c) or {}, baseline.get(c) or {}
        common = [s for s in mine if s in base]
        if not common:
            continue
        num = sum(float(mine[s]) for s in common)
        den = sum(float(base[s]) for s in common)
        if not (math.isfinite(num) and math.isfinite(den)):
            continue
        if den == 0:
            zero.append(c)
            continue
        ratios.append(num / den)
    if zero:
        warnings.warn(
            f"mCE: the baseline's error is 0 on {', '.join(zero)} (at the common severities), "
            "so CE is undefined there and these corruptions are left out of the mean",
            stacklevel=2,
        )
    return sum(ratios) / len(ratios) if ratios else math.nan
