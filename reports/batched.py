"""The report's tests, many comparisons at once: the numbers of one-at-a-time calls, in NumPy.

A report of 1,000 configurations asks for about 15,000 paired tests (one per configuration ×
metric) and as many bolding comparisons; one call each costs seconds to minutes in Python. Here
the comparisons are grouped by their sample sizes and each group is one array operation:

- :func:`paired` — :func:`reports.significance.t_interval` and :func:`~reports.significance.pvalue`
  of every difference vector of one length in one call (those functions work along the last axis).
- :func:`unpaired_permutation` — the two-sample permutation test of the difference in means that
  ``scipy.stats.permutation_test(permutation_type="independent", n_resamples=9_999)`` computes
  with ``rng=numpy.random.default_rng(0)``: every relabelling when there are at most 9,999 of
  them, else the same 9,999 random relabellings scipy draws (they depend only on the total
  sample size, so one set serves every comparison of that size); the null statistics of all
  comparisons of one size are one matrix product. p = 2·min(P(null ≤ obs), P(null ≥ obs)), with
  scipy's +1 correction for random relabellings. Values that differ from the observed statistic
  only by rounding count as ties (scipy's tolerance, 100 ulp of the statistic, is below the
  rounding of a sum of accuracies; there a tie was decided by summation order).
- :func:`unpaired_welch` — Welch's t-test by ``scipy.stats.ttest_ind`` along a batch axis.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from itertools import combinations

import numpy as np

from reports.significance import pvalue, t_interval

PERMUTATIONS = 9_999  # as bolding has always asked scipy for
_CHUNK_ELEMENTS = 2_000_000  # comparisons × relabellings per product (16 MB: fresh memory costs)


def by_length(vectors: Sequence[np.ndarray]) -> dict[int, list[int]]:
    """Length → the positions of the vectors of that length (the batches)."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, v in enumerate(vectors):
        out[len(v)].append(i)
    return out


def paired(
    diffs: Sequence[np.ndarray], test: str, level: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, lo, hi, p)`` for each 1-D difference vector (every one finite, length ≥ 1)."""
    k = len(diffs)
    mean, lo, hi, p = (np.full(k, np.nan) for _ in range(4))
    for n, idx in by_length(diffs).items():
        block = np.stack([diffs[i] for i in idx]) if n else np.empty((len(idx), 0))
        m, low, high = t_interval(block, level)
        mean[idx], lo[idx], hi[idx] = m, low, high
        p[idx] = pvalue(block, test)
    return mean, lo, hi, p


@lru_cache(maxsize=64)
def _first_group(n_a: int, n_b: int) -> tuple[np.ndarray, bool]:
    """(relabellings × n) 0/1 matrix of which positions land in the first sample; exact?"""
    n = n_a + n_b
    if math.comb(n, n_a) <= PERMUTATIONS:  # scipy enumerates every partition then
        rows = list(combinations(range(n), n_a))
        mask = np.zeros((len(rows), n))
        mask[np.repeat(np.arange(len(rows)), n_a), np.asarray(rows).ravel()] = 1.0
        return mask, True
    rng = np.random.default_rng(0)  # scipy's draws, in scipy's order: one permutation each
    perms = np.stack([rng.permutation(n) for _ in range(PERMUTATIONS)])
    mask = np.zeros((PERMUTATIONS, n))
    mask[np.repeat(np.arange(PERMUTATIONS), n_a), perms[:, :n_a].ravel()] = 1.0
    return mask, False


def unpaired_permutation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two-sided permutation p-values of mean(a) − mean(b), row by row.

    ``a`` (k, n_a) and ``b`` (k, n_b): k comparisons of one pair of sample sizes, finite values.
    """
    k, n_a = a.shape
    n_b = b.shape[1]
    data = np.concatenate([a, b], axis=1)
    observed = a.mean(axis=1) - b.mean(axis=1)
    mask, exact = _first_group(n_a, n_b)
    total = data.sum(axis=1, keepdims=True)
    tol = 1e-9 * np.abs(data).max(axis=1, initial=0.0)[:, None] + np.abs(observed)[:, None] * 1e-13
    adjustment = 0 if exact else 1
    out = np.empty(k)
    step = max(1, _CHUNK_ELEMENTS // len(mask))
    for s in range(0, k, step):
        part = data[s : s + step]
        sums = part @ mask.T  # (chunk, relabellings): the first sample's sum
        null = sums / n_a - (total[s : s + step] - sums) / n_b
        obs, t = observed[s : s + step, None], tol[s : s + step]
        less = np.count_nonzero(null <= obs + t, axis=1) + adjustment
        greater = np.count_nonzero(null >= obs - t, axis=1) + adjustment
        out[s : s + step] = 2 * np.minimum(less, greater) / (len(mask) + adjustment)
    return np.clip(out, 0.0, 1.0)


def unpaired_welch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Welch's two-sided t-test p-values row by row (``a`` (k, n_a), ``b`` (k, n_b), n ≥ 2)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        from scipy import stats as scipy_stats  # only for unpaired comparisons

        return np.asarray(scipy_stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue, float)


def unpaired(pairs: Sequence[tuple[np.ndarray, np.ndarray]], test: str) -> np.ndarray:
    """p-values of the unpaired test that goes with ``test`` for each (a, b) (each n ≥ 2)."""
    out = np.full(len(pairs), np.nan)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (a, b) in enumerate(pairs):
        groups[len(a), len(b)].append(i)
    for idx in groups.values():
        a = np.stack([pairs[i][0] for i in idx])
        b = np.stack([pairs[i][1] for i in idx])
        out[idx] = unpaired_permutation(a, b) if test == "signflip" else unpaired_welch(a, b)
    return out
