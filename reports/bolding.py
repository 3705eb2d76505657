"""Best-in-column bolding that means what it says: the best, and every configuration not
significantly different from it.

Within each dataset, per column with a better direction, the configuration with the best mean is
bold, and so is every other configuration that the paired table's test cannot tell apart from it at
level α (p > α, or the test cannot reach α at that n): the same rule as the ▲/▼ marks
(:mod:`reports.stats`), so a bold cell never claims a lead that the marks would not support.

Pairing follows the paired table: two configurations on the same backbone and variant are compared
seed by seed on their common seeds (sign-flip or paired t-test); two that cannot be paired
(another backbone or recipe, or no common seed) are compared unpaired — the two-sample
permutation test of the difference in means (the p-value of ``scipy.stats.permutation_test``: every
relabelling when there are at most 9,999, else 9,999 seeded random ones) for ``signflip``,
Welch's t-test for ``t``. No Holm adjustment: an adjustment would only make more
configurations bold.

Every comparison of the table is collected first and tested in batches (:mod:`reports.batched`),
so the cost grows with the number of comparisons, not with a Python call per comparison.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from reports.batched import paired as paired_tests
from reports.batched import unpaired
from reports.columns import Column, m_text
from reports.significance import min_pvalue

KEYS = ("dataset", "backbone", "method", "M", "hparams", "variant")


def config_key(row: Any) -> tuple:
    """The configuration of a summary or cell row, with M as text so NaN matches NaN."""
    return tuple(m_text(row["M"]) if k == "M" else str(row.get(k, "")) for k in KEYS)


def config_keys(frame: pd.DataFrame) -> list[tuple]:
    """:func:`config_key` of every row of ``frame``, column by column (one pass, no iterrows)."""
    parts = []
    for k in KEYS:
        if k not in frame:
            parts.append([""] * len(frame))
        elif k == "M":
            texts = {m: m_text(m) for m in pd.unique(frame[k])}
            parts.append([texts[m] for m in frame[k]])
        else:
            parts.append(frame[k].astype(str).tolist())
    return list(zip(*parts, strict=True))


def per_seed(cells: pd.DataFrame, metrics: Iterable[str]) -> dict[tuple, pd.DataFrame]:
    """Configuration → its done cells' values, one row per seed (duplicates averaged)."""
    arrays = _per_seed_arrays(cells, metrics)
    return {k: pd.DataFrame(v, index=s, columns=cols) for k, (s, v, cols) in arrays.items()}


def _per_seed_arrays(cells: pd.DataFrame, metrics: Iterable[str]) -> dict[tuple, tuple]:
    """Configuration → (sorted seeds, values (seeds × metrics), metrics): one groupby in all."""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    metrics = [m for m in metrics if m in done]
    if done.empty or not metrics:
        return {}
    values = done[metrics].apply(pd.to_numeric, errors="coerce").astype(float)
    values = values.where(np.isfinite(values))
    keys = config_keys(done)
    codes, uniques = pd.factorize(pd.Series(keys, dtype=object), sort=False)
    means = values.groupby([codes, done["seed"].to_numpy()]).mean()  # one pass over all cells
    first = means.index.get_level_values(0).to_numpy()
    seeds = means.index.get_level_values(1).to_numpy()
    array = means.to_numpy(dtype=float)
    bounds = np.searchsorted(first, np.arange(len(uniques) + 1))
    return {
        key: (seeds[bounds[i] : bounds[i + 1]], array[bounds[i] : bounds[i + 1]], metrics)
        for i, key in enumerate(uniques)
    }


_EMPTY = (np.empty(0), np.empty(0))


def _column(seeds: dict[tuple, tuple], column: str) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Configuration → (seeds, values) of one metric with its NaN seeds left out."""
    out = {}
    for key, (s, v, cols) in seeds.items():
        col = v[:, cols.index(column)]
        finite = ~np.isnan(col)
        out[key] = (s[finite], col[finite])
    return out


def distinguishable(
    comparisons: list[tuple[tuple, tuple, bool]], test: str, alpha: float
) -> np.ndarray:
    """For each ((seeds, values) a, (seeds, values) b, paired): does ``test`` find a difference
    at p ≤ ``alpha``?

    Paired (same backbone and variant) on the common seeds when there are any; otherwise
    unpaired, where one value on a side never differs (Welch's t has no variance for it, and the
    permutation test's smallest p-value, 2/(k+1), is out of reach of usual alphas).
    """
    out = np.zeros(len(comparisons), dtype=bool)
    diffs, diff_at, pairs, pair_at = [], [], [], []
    for i, ((sa, av), (sb, bv), is_paired) in enumerate(comparisons):
        if is_paired:
            common, ia, ib = np.intersect1d(sa, sb, assume_unique=True, return_indices=True)
            if len(common):
                if min_pvalue(test, len(common)) <= alpha:
                    diffs.append(av[ia] - bv[ib])
                    diff_at.append(i)
                continue
        if len(av) < 2 or len(bv) < 2:
            continue
        # No spread at all: different iff the values differ. (The std, not min == max: a mean
        # of equal values can round off them, and Welch's t then decides, as it always has.)
        if test == "t" and av.std() == 0 and bv.std() == 0:
            out[i] = av[0] != bv[0]
            continue
        pairs.append((av, bv))
        pair_at.append(i)
    if diffs:
        p = paired_tests(diffs, test, 0.95)[3]
        out[diff_at] = p <= alpha
    if pairs:
        p = unpaired(pairs, test)
        out[pair_at] = np.isfinite(p) & (p <= alpha)
    return out


def bold_rows(
    summary: pd.DataFrame,
    cells: pd.DataFrame,
    columns: Iterable[Column],
    *,
    test: str = "signflip",
    alpha: float = 0.05,
    within: str = "dataset",
) -> dict[str, set[Any]]:
    """Per column key, the summary row labels to bold (see the module docstring).

    Only groups (``within``, default dataset) with two or more finite means are considered; ties
    for the best are all best. ``cells`` is the per-cell frame the summary was built from.
    """
    columns = [c for c in columns if c.better is not None]
    seeds = _per_seed_arrays(cells, [c.key for c in columns])
    keys = dict(zip(summary.index, config_keys(summary), strict=True))
    groups = summary.groupby(within, dropna=False).groups.items() if len(summary) else []
    groups = list(groups)
    out: dict[str, set[Any]] = {}
    comparisons: list[tuple[tuple, tuple, bool]] = []
    asked: list[tuple[str, Any]] = []
    for c in columns:
        values = summary[f"{c.key}_mean"].astype(float)
        by_config = _column(seeds, c.key) if seeds else {}
        for _, idx in groups:
            v = values.loc[idx]
            v = v[np.isfinite(v)]
            if len(v) < 2:
                continue
            best_value = v.max() if c.better == "higher" else v.min()
            best = list(v.index[v == best_value])
            out.setdefault(c.key, set()).update(best)
            ref = keys[best[0]]
            ref_values = by_config.get(ref, _EMPTY)
            for other in v.index.difference(best):
                mine = by_config.get(keys[other], _EMPTY)
                is_paired = (keys[other][1], keys[other][5]) == (ref[1], ref[5])
                comparisons.append((mine, ref_values, is_paired))
                asked.append((c.key, other))
    differs = distinguishable(comparisons, test, alpha)
    for (key, other), different in zip(asked, differs, strict=True):
        if not different:
            out[key].add(other)
    return out
