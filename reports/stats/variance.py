"""The variance of a paired difference over seeds × test images, each noise source counted once.

A paired comparison scores R seeds of a configuration and of the reference on the same C test
images (every seed scores every image: the design is *crossed*). Per seed i and image j, the
per-image difference ``d_ij`` (configuration − reference: a correct/wrong flip, an NLL, a Brier
score, or an ECE influence value, :func:`ece_influence`) follows the two-way random-effects model

    d_ij = δ + a_i + b_j + e_ij,   a_i ~ (0, σ_A²),  b_j ~ (0, σ_B²),  e_ij ~ (0, σ_E²),

all independent: ``a`` the seed (training run) effect, ``b`` the image effect every seed shares,
``e`` the seed × image interaction (which images this particular pair of runs disagrees on). The
comparison's estimate is the grand mean d̄, and the variance the reader needs (the difference on
the distribution the seeds *and* the test images were drawn from) is

    V = Var(d̄) = σ_A²/R + σ_B²/C + σ_E²/(RC).

With the row means r_i (the per-seed differences), the column means c_j and the two-way residual
mean square ``MS_E = Σ (d_ij − r_i − c_j + d̄)² / ((R−1)(C−1))`` the ANOVA expectations are
``E s²_rows = σ_A² + σ_E²/C``, ``E s²_cols = σ_B² + σ_E²/R`` and ``E MS_E = σ_E²`` (Searle,
Casella & McCulloch 1992, §4.6), so

    V̂ = s²_rows/R + max(0, s²_cols − MS_E/R)/C

is unbiased (the ``max`` only keeps a negative estimate of σ_B² out, a bias of order
σ_E²/(RC)·√(2/C)). Its degrees of freedom are Satterthwaite's (1946): V̂ is a linear combination
of the three mean squares, ``V̂ = (MS_A + MS_B − MS_E)/(RC)`` with ``MS_A = C s²_rows`` (R−1 df),
``MS_B = R s²_cols`` (C−1 df), and

    df = V̂² / [ (s²_rows/R)²/(R−1) + (s²_cols/C)²/(C−1) + (MS_E/(RC))²/((R−1)(C−1)) ];

when the image term is cut to zero, V̂ = s²_rows/R and df = R − 1 (the paired t-interval's). The
interval is ``d̄ ± t_{df} √V̂`` and the p-value the two-sided t p-value of ``d̄/√V̂`` with df.
Satterthwaite's df rest on normal mean squares (Var MS = 2σ⁴/df); per-image values are far from
normal, so the image and residual mean squares enter with the df their kurtosis leaves them,
``1/(1/df + κ/(2n))`` (:func:`_effective_df`; Var s² = σ⁴(2/(n−1) + κ/n) for n values of
excess kurtosis κ: Cramér 1946, §27.4). The seeds' R − 1 stay as they are: κ is not estimable
from four to ten row means.

What this replaces (:func:`naive_bootstrap_variance`): the pigeonhole bootstrap (Owen 2007)
resamples rows and columns, and its variance (B → ∞) is ``s²_rows,pop/R + s²_cols,pop/C +
s²_resid,pop/(RC)`` (population forms, divisor R, C, RC). Each of the first two contains the
interaction once more (σ_E²/C in a row mean, σ_E²/R in a column mean), so with the harness's
√(R/(R−1)) factor its expectation is ≈ σ_A²/R + σ_B²/C·R/(R−1) + σ_E²/(RC)·(3R−2)/(R−1): the
interaction 3.33 times at R = 4, 3.2 at R = 6. On real records the interaction dominates (two
networks trained on the same data disagree on a few percent of the images, per seed), so those
intervals were 1.08–3.8× too wide for the means (median 1.47×; docs/methods.md).

Every function works on arrays ``(..., R, C)``: the leading axes are independent comparisons, so
the tests' thousands of simulated designs run as one array operation.

References:
    Owen, A. B. (2007). The pigeonhole bootstrap. Annals of Applied Statistics 1(2), 386–411.
    Satterthwaite, F. E. (1946). An approximate distribution of estimates of variance components.
    Biometrics Bulletin 2(6), 110–114.
    Searle, S. R., Casella, G. & McCulloch, C. E. (1992). Variance Components. Wiley (ch. 4:
    balanced data, the two-way crossed classification).
    Cramér, H. (1946). Mathematical Methods of Statistics. Princeton (§27.4: the variance of
    the sample variance).
    Efron, B. (1982). The Jackknife, the Bootstrap and Other Resampling Plans. SIAM (ch. 6: the
    infinitesimal jackknife and influence values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

#: The ECE's equal-width bins (harness.metrics.calibration.N_BINS; not imported: no torch here).
N_BINS = 15


def bin_of(confidence: np.ndarray) -> np.ndarray:
    """The equal-width bin ``(b/15, (b+1)/15]`` of each confidence (an edge goes lower; 0 goes to
    the first), as :func:`harness.metrics.calibration.calibration_bins` bins them; any shape."""
    edges = np.arange(N_BINS + 1, dtype=np.float64) / N_BINS
    return np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, N_BINS - 1)


def ece_influence(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Per-image values whose mean is the 15-bin ECE of each row: ``u_j = s_b(j) (conf_j −
    correct_j)`` with ``s_b`` the sign of bin b's gap ``Σ_{j∈b} (conf_j − correct_j)``.

    The ECE is ``Σ_b |Σ_{j∈b}(conf_j − correct_j)| / N``: with the bins' edges fixed, its only
    non-linearity is the absolute value, so ``mean(u) = ECE`` *exactly*, and ``u`` is the ECE's
    linearisation (its influence values up to the centring, the infinitesimal jackknife: Efron
    1982, ch. 6) wherever no bin's gap is zero. The crossed-design variance of a difference of
    ECEs is then that of a difference of means (:func:`variance_components` on
    ``u_config − u_reference``). A bin whose gap is exactly zero contributes zero (the
    subgradient 0 of |x| at 0); near such a kink the linearisation's variance (s²) exceeds the
    variance of |gap| itself (s²(1 − 2/π) at a true gap of 0), so it errs wide.

    Args:
        confidence: ``(..., N)`` the top-class confidence of each image.
        correct: ``(..., N)`` whether the top class is right (0/1).

    Returns:
        ``(..., N)`` float64: the per-image values ``u``.
    """
    conf = np.asarray(confidence, dtype=np.float64)
    gap = conf - np.asarray(correct, dtype=np.float64)
    lead, n = gap.shape[:-1], gap.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    # One bincount over every row at once: row k's bin b is slot k·15 + b.
    slot = bin_of(conf).reshape(rows, n) + N_BINS * np.arange(rows)[:, None]
    sums = np.bincount(slot.ravel(), weights=gap.reshape(rows, n).ravel(),
                       minlength=rows * N_BINS)  # fmt: skip
    return (np.sign(sums)[slot] * gap.reshape(rows, n)).reshape(gap.shape)


@dataclass(frozen=True)
class Components:
    """The crossed-design ANOVA of ``d`` (arrays of its leading shape; 0-d for one comparison).

    Attributes:
        mean: d̄, the grand mean.
        var: V̂, the unbiased estimate of Var(d̄) (module docstring); NaN below two seeds or two
            images.
        df: its Satterthwaite degrees of freedom (NaN where V̂ is 0 or NaN).
        s2_rows: the sample variance of the R row (seed) means.
        s2_cols: the sample variance of the C column (image) means.
        ms_resid: the two-way residual mean square MS_E.
        seeds, images: R and C.
    """

    mean: np.ndarray
    var: np.ndarray
    df: np.ndarray
    s2_rows: np.ndarray
    s2_cols: np.ndarray
    ms_resid: np.ndarray
    seeds: int
    images: int


def variance_components(d: np.ndarray) -> Components:
    """V̂ and its Satterthwaite df for the mean of ``d`` (module docstring).

    Args:
        d: ``(..., R, C)`` per-image differences, seeds × images (leading axes: independent
            comparisons).

    Returns:
        :class:`Components` of the leading shape.
    """
    d = np.asarray(d, dtype=np.float64)
    r, c = d.shape[-2], d.shape[-1]
    mean = d.mean(axis=(-2, -1))
    nan = np.full(mean.shape, np.nan)
    if r < 2 or c < 2:  # no spread between seeds (or images) to estimate: nothing is
        return Components(mean, nan, nan.copy(), nan.copy(), nan.copy(), nan.copy(), r, c)
    rows, cols = d.mean(axis=-1), d.mean(axis=-2)
    s2_rows, s2_cols = rows.var(axis=-1, ddof=1), cols.var(axis=-1, ddof=1)
    resid = d - rows[..., :, None] - cols[..., None, :] + mean[..., None, None]
    ms_resid = np.square(resid).sum(axis=(-2, -1)) / ((r - 1) * (c - 1))
    v_rows, v_cols, v_resid = s2_rows / r, s2_cols / c, ms_resid / (r * c)
    image_part = v_cols - v_resid  # (σ_B² estimate)/C: may come out negative; then none
    cut = image_part <= 0
    var = v_rows + np.where(cut, 0.0, image_part)
    df_cols = _effective_df(cols - cols.mean(axis=-1, keepdims=True), c - 1, c)
    df_resid = _effective_df(resid.reshape(*resid.shape[:-2], -1), (r - 1) * (c - 1), r * c)
    spread = np.where(
        cut,
        v_rows**2 / (r - 1),
        v_rows**2 / (r - 1) + v_cols**2 / df_cols + v_resid**2 / df_resid,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(var > 0, var**2 / spread, np.nan)
    return Components(mean, var, df, s2_rows, s2_cols, ms_resid, r, c)


def _effective_df(centred: np.ndarray, df: int, n: int) -> np.ndarray:
    """The degrees of freedom of a mean square of the ``n`` centred values along the last axis,
    for its variance, ``2σ⁴/df_eff = σ⁴ (2/df + κ/n)`` with κ their excess kurtosis (clipped at 0:
    never more than the normal theory's ``df``).

    Per-image differences are far from normal (a correct/wrong flip is −1, 0 or +1; the ECE's
    values are ±(conf − correct), the image effect carried by the few wrong images), and a mean
    square of such values varies more than χ²_df/df: with normal-theory df the ECE's 95%
    intervals covered 93.2% in a near-calibrated simulation (the model of
    ``tests/reports/test_variance_components.py`` at R = 6, C = 1,000; 4,000 experiments), with
    these 94.1%. For normal values κ ≈ 0 and this is ``df``."""
    m2 = np.square(centred).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kurt = np.square(np.square(centred)).mean(axis=-1) / np.square(m2) - 3.0
    kurt = np.where(np.isfinite(kurt), np.maximum(kurt, 0.0), 0.0)  # constant values: no spread
    return 1.0 / (1.0 / df + kurt / (2.0 * n))


def naive_bootstrap_variance(d: np.ndarray) -> np.ndarray:
    """The variance the pigeonhole bootstrap gives the mean of ``d`` as B → ∞, with the
    √(R/(R−1)) factor the harness applied (:func:`reports.stats.bootstrap.paired_bootstrap`):
    ``R/(R−1) · [s²_rows,pop/R + s²_cols,pop/C + s²_resid,pop/(RC)]`` (Owen 2007, §3; population
    forms, divisors R, C and RC). Kept to document what it over-counts (module docstring).

    Args:
        d: ``(..., R, C)`` per-image differences.

    Returns:
        The leading shape; NaN below two seeds.
    """
    d = np.asarray(d, dtype=np.float64)
    r, c = d.shape[-2], d.shape[-1]
    if r < 2:
        return np.full(d.shape[:-2], np.nan)
    rows, cols, mean = d.mean(axis=-1), d.mean(axis=-2), d.mean(axis=(-2, -1))
    resid = d - rows[..., :, None] - cols[..., None, :] + mean[..., None, None]
    pop_rows, pop_cols = rows.var(axis=-1), cols.var(axis=-1)  # ddof 0: the resampled units
    pop = pop_rows / r + pop_cols / c + np.square(resid).mean(axis=(-2, -1)) / (r * c)
    return pop * r / (r - 1)


@dataclass(frozen=True)
class Interval:
    """``centre ± t_{df} √V̂`` (arrays of the comparisons' leading shape).

    Attributes:
        se: √V̂.
        lo, hi: the interval at the requested level; ``[centre, centre]`` where V̂ = 0.
        p_value: two-sided t p-value of ``centre/se`` with ``df`` (V̂ = 0: 1 at a centre of 0,
            else 0, as :func:`reports.stats.significance.t_pvalue` treats identical differences).
        df: Satterthwaite's.
    """

    se: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p_value: np.ndarray
    df: np.ndarray


def crossed_interval(
    d: np.ndarray, centre: np.ndarray | float | None = None, level: float = 0.95
) -> Interval:
    """The t-interval and p-value of the mean of ``d`` with V̂ and Satterthwaite's df.

    Args:
        d: ``(..., R, C)`` per-image differences.
        centre: the point estimate (the records' mean difference; default d̄); leading shape.
        level: the interval's level, in (0, 1).

    Returns:
        :class:`Interval`; NaN everywhere below two seeds or two images.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    comp = variance_components(d)
    mid = comp.mean if centre is None else np.asarray(centre, dtype=np.float64)
    se = np.sqrt(comp.var)
    zero = se == 0
    # t_{df} at a finite df (V̂ = 0 has none: any quantile times 0 is 0).
    t = special.stdtrit(np.where(zero, 1.0, comp.df), (1 + level) / 2)
    half = np.where(zero, 0.0, t * se)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2 * special.stdtr(comp.df, -np.abs(mid) / se)
    p = np.where(zero, np.where(mid == 0, 1.0, 0.0), p)
    nan = np.isnan(comp.var)
    p = np.where(nan, np.nan, p)
    return Interval(se, mid - half, mid + half, p, comp.df)
