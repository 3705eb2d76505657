"""Small-sample tests and intervals for paired differences (why these: :mod:`reports.stats.paired`).

Every function works along the last axis of its input (one difference per seed), so thousands of
simulated experiments run at once: ``tests/reports/stats/test_stats.py`` checks the level and
coverage with them.
A report asks for thousands of tests (one per configuration × metric, and as many bolding
comparisons), so :func:`paired` and :func:`unpaired` group them by sample size and run each group
as one array operation instead of a Python call per comparison.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from itertools import combinations

import numpy as np
from scipy import special

TESTS = ("signflip", "t")  # see the module docstring
TEST_NAMES = {
    "signflip": "exact sign-flip permutation test (two-sided)",
    "t": "paired t-test (two-sided)",
}
_EXACT_MAX_N = 16  # 2^16 sign patterns enumerated exactly; above, Monte Carlo
_MC_DRAWS = 100_000
_CHUNK_ELEMENTS = 262_144  # comparisons × sign patterns per product (2 MB)


def t_quantile(q: float, df: np.ndarray | float) -> np.ndarray:
    """Student's t quantile, ``scipy.stats.t.ppf(q, df)`` (NaN for NaN df): scipy.special's
    inverse t CDF, which ``t.ppf`` calls, so the values are the same bits; importing
    scipy.stats costs a report 0.6 s, scipy.special 0.1 s."""
    return special.stdtrit(df, q)


def t_interval(
    diffs: np.ndarray | Sequence[float], level: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, lo, hi)`` of the paired differences along the last axis: the paired t-interval.

    ``diffs`` has shape ``(..., n)``: one difference per seed in the last axis (leading axes are
    independent experiments, so the simulation test runs thousands at once). ``lo, hi = mean ∓
    t_{n-1,(1+level)/2} · s/√n`` with the sample std ``s`` (ddof=1). n = 1 gives NaN bounds, n = 0
    a NaN mean too; identical differences give an interval of zero width at their value. Returns
    arrays of the leading shape (0-d for a 1-D input; ``float()`` them).
    """
    d = _diff_array(diffs)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    n = d.shape[-1]
    nan = np.full(d.shape[:-1], np.nan)
    if n == 0:
        return nan, nan.copy(), nan.copy()
    mean = d.mean(axis=-1)
    if n == 1:
        return mean, nan, nan.copy()
    # Exactly 0 for identical differences (np.std can leave a rounding residue there).
    s = np.where(d.max(axis=-1) == d.min(axis=-1), 0.0, d.std(axis=-1, ddof=1))
    mean = np.where(s == 0, d[..., 0], mean)
    half = t_quantile((1 + level) / 2, n - 1) * s / math.sqrt(n)
    return mean, mean - half, mean + half


def t_pvalue(diffs: np.ndarray | Sequence[float]) -> np.ndarray:
    """Two-sided paired t-test p-values along the last axis (NaN below two differences).

    Identical differences have zero spread: p = 0 when they are not 0, p = 1 when they are.
    """
    d = _diff_array(diffs)
    n = d.shape[-1]
    if n < 2:
        return np.full(d.shape[:-1], np.nan)
    mean = d.mean(axis=-1)
    s = np.where(d.max(axis=-1) == d.min(axis=-1), 0.0, d.std(axis=-1, ddof=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean) / (s / math.sqrt(n))
    p = 2 * special.stdtr(n - 1, -t)  # scipy.stats.t.sf(t, n - 1), as t_quantile says
    return np.where(s == 0, np.where(d[..., 0] == 0, 1.0, 0.0), p)


def signflip_pvalue(diffs: np.ndarray | Sequence[float], seed: int = 0) -> np.ndarray:
    """Two-sided exact sign-flip permutation p-values along the last axis.

    p = the fraction of the 2ⁿ sign patterns s for which |Σ sᵢdᵢ| ≥ |Σ dᵢ| (the observed pattern
    counts, so p ≥ 2/2ⁿ). Exact (level ≤ α) when each difference is as likely positive as
    negative, i.e. for differences symmetric about zero; skewed differences of mean zero are
    marked more often (9.6% at n = 10, α = 0.05, for exponential − 1:
    ``benchmarks/signflip_level.py``). Enumerated exactly up to n = 16; above, ``100,000``
    random patterns (``numpy.random.default_rng(seed)``) with the (1 + hits)/(1 + draws)
    estimate. n = 0 gives NaN.
    """
    # Hand-written: scipy.stats.permutation_test(permutation_type="samples") computes the same
    # exact p-value for one comparison, but it loops in Python per call and has no batch axis;
    # the simulation test needs thousands at once (tests check the two agree).
    d = _diff_array(diffs)
    n = d.shape[-1]
    if n == 0:
        return np.full(d.shape[:-1], np.nan)
    if n <= _EXACT_MAX_N:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
    else:
        bits = np.random.default_rng(seed).integers(0, 2, size=(_MC_DRAWS, n))
    signs = (1 - 2 * bits).astype(float).T.copy()  # (n, patterns)
    flat = d.reshape(-1, n)
    hits = np.empty(len(flat))
    # A few hundred rows at a time: the (rows × patterns) sums of 6,000 comparisons at once were
    # 100 MB of fresh memory whose first touch cost more than the arithmetic.
    step = max(1, _CHUNK_ELEMENTS // signs.shape[1])
    for s in range(0, len(flat), step):
        part = flat[s : s + step]
        sums = np.abs(part @ signs)  # (rows, patterns)
        observed = np.abs(part.sum(axis=-1, keepdims=True))
        # Sums of the same numbers in another order may differ in the last bits: count those
        # as ties.
        tol = 1e-12 * np.abs(part).sum(axis=-1, keepdims=True)
        hits[s : s + step] = (sums >= observed - tol).sum(axis=-1)
    hits = hits.reshape(d.shape[:-1])
    if n <= _EXACT_MAX_N:
        return hits / signs.shape[1]
    return (1 + hits) / (1 + signs.shape[1])


def min_pvalue(test: str, n: int) -> float:
    """The smallest p-value ``test`` can give with ``n`` paired differences (1 below its minimum).

    Sign-flip: 2/2ⁿ (n ≥ 1); t-test: 0 from n = 2 (a large enough effect drives t to infinity).
    """
    check_test(test)
    if test == "signflip":
        return 1.0 if n < 1 else min(1.0, 2.0 ** (1 - n))
    return 1.0 if n < 2 else 0.0


def min_pairs(test: str, alpha: float = 0.05) -> int:
    """The fewest paired seeds with which ``test`` can reach p ≤ ``alpha`` (sign-flip: 6)."""
    return next(n for n in range(1, 64) if min_pvalue(test, n) <= alpha)


def holm(pvalues: np.ndarray | Sequence[float]) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values; NaN entries stay NaN and are not counted.

    Sorted ascending, p₍ᵢ₎ becomes max_{j ≤ i} min(1, (m − j + 1) p₍ⱼ₎) for m finite p-values;
    rejecting where the adjusted p ≤ α controls the family-wise error rate at α.
    """
    # Hand-written: scipy has only Benjamini–Hochberg (false_discovery_control); statsmodels'
    # multipletests has Holm but is not a dependency for these few lines.
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = len(finite)
    if m == 0:
        return out
    order = finite[np.argsort(p[finite], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def pvalue(diffs: np.ndarray | Sequence[float], test: str = "signflip") -> np.ndarray:
    """p-values of ``test`` (``"signflip"`` or ``"t"``) along the last axis of ``diffs``."""
    check_test(test)
    return signflip_pvalue(diffs) if test == "signflip" else t_pvalue(diffs)


def check_test(test: str) -> None:
    """Raise a one-line ValueError for a test name other than those of :data:`TESTS`."""
    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}; expected one of: {', '.join(TESTS)}")


def _diff_array(diffs: np.ndarray | Sequence[float]) -> np.ndarray:
    d = np.asarray(diffs, dtype=float)
    if d.ndim < 1:
        raise ValueError("diffs must have at least one axis (one difference per seed)")
    if not np.isfinite(d).all():
        raise ValueError("diffs contain NaN or inf; leave those seeds out before testing")
    return d


# Batched tests: the p-value of
# ``scipy.stats.permutation_test(permutation_type="independent", n_resamples=9_999)`` with
# ``rng=numpy.random.default_rng(0)`` (every relabelling when there are at most 9,999, else the
# same random ones scipy draws: they depend only on the total sample size, so one set serves every
# comparison of that size), computed for all comparisons of one size as one matrix product.
# Hand-written because permutation_test loops in Python per call: 15,000 comparisons took minutes.
# Values that differ from the observed statistic only by rounding count as ties.
PERMUTATIONS = 9_999  # as bolding has always asked scipy for
_PERM_CHUNK = 2_000_000  # comparisons × relabellings per product (16 MB)


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
    step = max(1, _PERM_CHUNK // len(mask))
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
    from scipy import stats  # Welch's test only: see t_quantile

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue, float)


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
