"""Best-in-column bolding that means what it says: the best, and every configuration not
significantly different from it.

Within each dataset, per column with a better direction, the configuration with the best mean is
bold, and so is every other configuration that the paired table's test cannot tell apart from it at
level α (p > α, or the test cannot reach α at that n): the same rule as the ▲/▼ marks
(:mod:`reports.stats.paired`), so a bold cell never claims a lead that the marks would not support.

Unless no comparison there could come out different: a dataset's column in which every mean
that differs from the best is compared with too few seeds for its test to reach p ≤ α carries
no bold at all (:attr:`Bolding.unreachable`), since "the best and all it cannot be told apart
from" is then every row, and a page of bold cells reads as a page of winners. The exact sign-flip
test's smallest two-sided p with n pairs is 2/2ⁿ (n = 5: 0.0625), so at α = 0.05 it needs 6
paired seeds (:func:`reports.stats.significance.min_pairs`); the paired t-test needs 2; the
unpaired permutation test with samples of a and b seeds 2/C(a + b, a) (exact up to 9,999
relabellings; a = b = 4: 0.029), Welch's t-test 2 on each side. A column whose means all tie
keeps them all bold (no comparison is asked: they are equally best).

Pairing follows the paired table: two configurations on the same backbone and variant are compared
seed by seed on their common seeds (sign-flip or paired t-test); two that cannot be paired
(another backbone or recipe, or no common seed) are compared unpaired — the two-sample
permutation test of the difference in means (the p-value of ``scipy.stats.permutation_test``: every
relabelling when there are at most 9,999, else 9,999 seeded random ones) for ``signflip``,
Welch's t-test for ``t``. No Holm adjustment: an adjustment would only make more
configurations bold.

Every comparison of the table is collected first and tested in batches
(:mod:`reports.stats.significance`),
so the cost grows with the number of comparisons, not with a Python call per comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from reports.columns import Column, m_text
from reports.stats.paired import per_seed_table
from reports.stats.significance import PERMUTATIONS, min_pvalue, pvalue, unpaired

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


def _per_seed_table(
    cells: pd.DataFrame, metrics: Iterable[str]
) -> tuple[list[tuple], np.ndarray, list[str]]:
    """(configurations, values (configurations × seeds × metrics; NaN: no finite value for that
    seed), the metrics found) of the done cells (:func:`reports.stats.paired.per_seed_table`)."""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    metrics = [m for m in metrics if m in done]
    if done.empty or not metrics:
        return [], np.empty((0, 0, len(metrics))), metrics
    values = done[metrics].apply(pd.to_numeric, errors="coerce").astype(float)
    values = values.where(np.isfinite(values))
    codes, uniques = pd.factorize(pd.Series(config_keys(done), dtype=object), sort=False)
    _, table = per_seed_table(values, codes, done["seed"].to_numpy(), len(uniques))
    return list(uniques), table, metrics


def _rows_of(values: np.ndarray, keep: np.ndarray, n: int) -> np.ndarray:
    """The kept entries of each row of ``values`` (k × seeds), n per row, in seed order."""
    return values[keep].reshape(len(values), n)


def _distinguishable(
    a: np.ndarray, b: np.ndarray, is_paired: np.ndarray, test: str, alpha: float
) -> np.ndarray:
    """For each row of ``a`` and ``b`` (k × seeds: one metric of two configurations per seed,
    NaN where a seed has no value) and whether the two are paired: does ``test`` find a
    difference at p ≤ ``alpha``?

    Paired (same backbone and variant) on the common seeds when there are any; otherwise
    unpaired, where one value on a side never differs (Welch's t has no variance for it, and the
    permutation test's smallest p-value, 2/(k+1), is out of reach of usual alphas). Seeds are in
    ascending order, as the tests have always seen them.
    """
    out = np.zeros(len(a), dtype=bool)
    has_a, has_b = ~np.isnan(a), ~np.isnan(b)
    common = has_a & has_b
    n_common = common.sum(axis=1)
    paired_rows = is_paired & (n_common > 0)
    for n in np.unique(n_common[paired_rows]):
        if min_pvalue(test, int(n)) > alpha:
            continue  # the test cannot reach alpha with n pairs: not different
        rows = np.flatnonzero(paired_rows & (n_common == n))
        diffs = _rows_of(a[rows] - b[rows], common[rows], int(n))
        out[rows] = pvalue(diffs, test) <= alpha
    n_a, n_b = has_a.sum(axis=1), has_b.sum(axis=1)
    unpaired_rows = ~paired_rows & (n_a >= 2) & (n_b >= 2)
    sizes = np.unique(np.stack([n_a, n_b], axis=1)[unpaired_rows], axis=0)
    for size_a, size_b in sizes:
        rows = np.flatnonzero(unpaired_rows & (n_a == size_a) & (n_b == size_b))
        av = _rows_of(a[rows], has_a[rows], int(size_a))
        bv = _rows_of(b[rows], has_b[rows], int(size_b))
        if test == "t":
            # No spread at all: different iff the values differ. (The std, not min == max: a
            # mean of equal values can round off them, and Welch's t then decides, as it
            # always has.)
            flat = (av.std(axis=1) == 0) & (bv.std(axis=1) == 0)
            out[rows[flat]] = av[flat, 0] != bv[flat, 0]
            rows, av, bv = rows[~flat], av[~flat], bv[~flat]
            if not len(rows):
                continue
        p = unpaired(list(zip(av, bv, strict=True)), test)
        out[rows] = np.isfinite(p) & (p <= alpha)
    return out


def _min_unpaired_pvalue(test: str, n_a: int, n_b: int) -> float:
    """The smallest p-value the unpaired test that goes with ``test`` can give with samples of
    ``n_a`` and ``n_b`` values (1 below two on a side): the permutation test's 2/C(n, n_a)
    when it enumerates every relabelling, 2/(9,999 + 1) when it draws them; Welch's 0."""
    if n_a < 2 or n_b < 2:
        return 1.0
    if test == "t":
        return 0.0
    relabellings = math.comb(n_a + n_b, n_a)
    return min(1.0, 2 / relabellings if relabellings <= PERMUTATIONS else 2 / (PERMUTATIONS + 1))


def _reachable(a: np.ndarray, b: np.ndarray, is_paired: np.ndarray, test: str, alpha: float):
    """For each row of ``a`` and ``b`` (as :func:`_distinguishable` takes them): could the test
    :func:`_distinguishable` runs find p ≤ ``alpha`` with that many seeds, whatever the values?
    And the seeds it has: the common ones when paired, the smaller side when not."""
    has_a, has_b = ~np.isnan(a), ~np.isnan(b)
    n_common = (has_a & has_b).sum(axis=1)
    n_a, n_b = has_a.sum(axis=1), has_b.sum(axis=1)
    paired_rows = is_paired & (n_common > 0)
    seeds = np.where(paired_rows, n_common, np.minimum(n_a, n_b))
    smallest = [
        min_pvalue(test, int(nc)) if p else _min_unpaired_pvalue(test, int(x), int(y))
        for p, nc, x, y in zip(paired_rows, n_common, n_a, n_b, strict=True)
    ]
    return np.asarray(smallest) <= alpha, seeds


@dataclass
class Bolding:
    """What :func:`bolding` decides.

    Attributes:
        bold: per column key, the summary row labels to bold.
        unreachable: per column key, the groups (datasets) whose column carries no bold because
            no comparison with its best could reach p ≤ α (see the module docstring).
        seeds: the most seeds any of those comparisons had (0 when there is none).
        compared: per column key, the groups in which some mean was compared with the best.
    """

    bold: dict[str, set[Any]] = field(default_factory=dict)
    unreachable: dict[str, set[Any]] = field(default_factory=dict)
    seeds: int = 0
    compared: dict[str, set[Any]] = field(default_factory=dict)


def bold_rows(
    summary: pd.DataFrame,
    cells: pd.DataFrame,
    columns: Iterable[Column],
    *,
    test: str = "signflip",
    alpha: float = 0.05,
    within: str = "dataset",
) -> dict[str, set[Any]]:
    """Per column key, the summary row labels to bold (see the module docstring): the ``bold``
    of :func:`bolding`."""
    return bolding(summary, cells, columns, test=test, alpha=alpha, within=within).bold


def bolding(
    summary: pd.DataFrame,
    cells: pd.DataFrame,
    columns: Iterable[Column],
    *,
    test: str = "signflip",
    alpha: float = 0.05,
    within: str = "dataset",
) -> Bolding:
    """The bold cells of every column and the groups left without bold (see the module
    docstring).

    Only groups (``within``, default dataset) with two or more finite means are considered; ties
    for the best are all best. ``cells`` is the per-cell frame the summary was
    built from.
    """
    # Length: one pass that collects every comparison of the table, one batched test of them
    # all, and the groups where none could come out different; split, the passes share 8 lists.
    columns = [c for c in columns if c.better is not None]
    keys, table, found = _per_seed_table(cells, [c.key for c in columns])
    # One row more, all NaN: a summary row without done cells (no values to compare).
    table = np.concatenate([table, np.full((1, *table.shape[1:]), np.nan)])
    at = {k: i for i, k in enumerate(keys)}
    summary_keys = config_keys(summary)
    config = np.array([at.get(k, len(keys)) for k in summary_keys], dtype=np.intp)
    pairing = [(k[1], k[5]) for k in summary_keys]  # backbone and variant
    labels = summary.index
    grouped = summary.groupby(within, dropna=False).indices if len(summary) else {}
    out = Bolding()
    mine, ref, metric, is_paired, asked = [], [], [], [], []
    members: dict[tuple[str, Any], np.ndarray] = {}  # (column, group) → its rows
    for c in columns:
        values = summary[f"{c.key}_mean"].to_numpy(dtype=float)
        j = found.index(c.key) if c.key in found else None
        for group, idx in grouped.items():
            idx = idx[np.isfinite(values[idx])]
            if len(idx) < 2:
                continue
            v = values[idx]
            best_value = v.max() if c.better == "higher" else v.min()
            best = idx[v == best_value]
            out.bold.setdefault(c.key, set()).update(labels[best])
            if len(best) == len(idx):  # every mean the same: all best, nothing to compare
                continue
            out.compared.setdefault(c.key, set()).add(group)
            members[c.key, group] = idx
            if j is None:  # no per-seed values: nothing tells the others apart from the best
                out.unreachable.setdefault(c.key, set()).add(group)
                continue
            for other in idx[v != best_value]:
                mine.append(config[other])
                ref.append(config[best[0]])
                metric.append(j)
                is_paired.append(pairing[other] == pairing[best[0]])
                asked.append((c.key, group, other))
    if asked:
        mine_v = table[np.asarray(mine), :, np.asarray(metric)]
        ref_v = table[np.asarray(ref), :, np.asarray(metric)]
        paired_rows = np.asarray(is_paired)
        differs = _distinguishable(mine_v, ref_v, paired_rows, test, alpha)
        reach, seeds = _reachable(mine_v, ref_v, paired_rows, test, alpha)
        reachable: dict[tuple[str, Any], bool] = {}
        most: dict[tuple[str, Any], int] = {}
        for (key, group, other), different, r, n in zip(asked, differs, reach, seeds, strict=True):
            if not different:
                out.bold[key].add(labels[other])
            reachable[key, group] = reachable.get((key, group), False) or bool(r)
            most[key, group] = max(most.get((key, group), 0), int(n))
        for (key, group), any_reachable in reachable.items():
            if not any_reachable:
                out.unreachable.setdefault(key, set()).add(group)
                out.seeds = max(out.seeds, most[key, group])
    for key, groups in out.unreachable.items():
        for group in groups:
            out.bold[key] -= set(labels[members[key, group]])
    out.bold = {key: rows for key, rows in out.bold.items() if rows}
    return out
