"""Best-in-column bolding that means what it says: the best, and every configuration not
significantly different from it.

Within each dataset, per column with a better direction, the configuration with the best mean is
bold, and so is every other configuration that the paired table's test cannot tell apart from it at
level α (p > α, or the test cannot reach α at that n): the same rule as the ▲/▼ marks
(:mod:`reports.stats`), so a bold cell never claims a lead that the marks would not support.

Pairing follows the paired table: two configurations on the same backbone and variant are compared
seed by seed on their common seeds (sign-flip or paired t-test); two that cannot be paired
(another backbone or recipe, or no common seed) are compared unpaired — the exact two-sample
permutation test of the difference in means (``scipy.stats.permutation_test``, every relabelling
when there are at most 9,999) for ``signflip``, Welch's t-test for ``t``. No Holm adjustment: an
adjustment would only make more configurations bold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from reports.columns import Column, m_text
from reports.significance import min_pvalue, pvalue

KEYS = ("dataset", "backbone", "method", "M", "hparams", "variant")


def config_key(row: Any) -> tuple:
    """The configuration of a summary or cell row, with M as text so NaN matches NaN."""
    return tuple(m_text(row["M"]) if k == "M" else str(row.get(k, "")) for k in KEYS)


def per_seed(cells: pd.DataFrame, metrics: Iterable[str]) -> dict[tuple, pd.DataFrame]:
    """Configuration → its done cells' values, one row per seed (duplicates averaged)."""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    metrics = [m for m in metrics if m in done]
    if done.empty or not metrics:
        return {}
    values = done[metrics].apply(pd.to_numeric, errors="coerce").astype(float)
    values = values.where(np.isfinite(values))
    keys = [config_key(r) for _, r in done.iterrows()]
    out: dict[tuple, pd.DataFrame] = {}
    for key in dict.fromkeys(keys):
        mask = np.array([k == key for k in keys])
        part = values[mask]
        out[key] = part.groupby(done.loc[mask, "seed"].to_numpy()).mean()
    return out


def indistinguishable(a: pd.Series, b: pd.Series, paired: bool, test: str, alpha: float) -> bool:
    """True when ``test`` finds no difference between the per-seed values ``a`` and ``b``."""
    a, b = a.dropna(), b.dropna()
    if paired:
        common = a.index.intersection(b.index)
        if len(common):
            d = (a.loc[common] - b.loc[common]).to_numpy()
            if min_pvalue(test, len(d)) > alpha:
                return True
            return not float(pvalue(d, test)) <= alpha
    # One value on a side: Welch's t has no variance for it, and the permutation test's smallest
    # p-value is 2/(k+1) with k on the other side, out of reach of usual alphas.
    if len(a) < 2 or len(b) < 2:
        return True
    if test == "t":
        if a.std() == 0 and b.std() == 0:
            return bool(a.iloc[0] == b.iloc[0])
        p = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    else:
        res = scipy_stats.permutation_test(
            (a.to_numpy(), b.to_numpy()),
            lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
            permutation_type="independent",
            n_resamples=9_999,  # exact (every relabelling) up to 9,999 of them
            **_seeded(0),
        )
        p = res.pvalue
    return not (math.isfinite(p) and p <= alpha)


def _seeded(seed: int) -> dict[str, Any]:
    # scipy renamed permutation_test's random_state to rng in 1.15; pyproject allows >= 1.11.
    import inspect

    params = inspect.signature(scipy_stats.permutation_test).parameters
    return {"rng" if "rng" in params else "random_state": np.random.default_rng(seed)}


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
    seeds = per_seed(cells, [c.key for c in columns])
    keys = {idx: config_key(r) for idx, r in summary.iterrows()}
    out: dict[str, set[Any]] = {}
    for c in columns:
        values = summary[f"{c.key}_mean"].astype(float)
        for _, idx in summary.groupby(within, dropna=False).groups.items():
            v = values.loc[idx]
            v = v[np.isfinite(v)]
            if len(v) < 2:
                continue
            best_value = v.max() if c.better == "higher" else v.min()
            best = list(v.index[v == best_value])
            bold = set(best)
            ref = keys[best[0]]
            ref_values = seeds.get(ref, pd.DataFrame()).get(c.key, pd.Series(dtype=float))
            for other in v.index.difference(best):
                mine = seeds.get(keys[other], pd.DataFrame()).get(c.key, pd.Series(dtype=float))
                paired = (keys[other][1], keys[other][5]) == (ref[1], ref[5])
                if indistinguishable(mine, ref_values, paired, test, alpha):
                    bold.add(other)
            out[c.key] = out.get(c.key, set()) | bold
    return out
