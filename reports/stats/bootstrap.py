"""A paired comparison that counts the test set: seeds × images, crossed.

The paired t-interval of :mod:`reports.stats.paired` treats the test set as fixed: it measures
how much a difference varies from seed to seed on *these* test images. A reader wants the
difference on the distribution the test set was drawn from, so the sampling of the images is a
second source of error (on a 10,000-image test set, 0.34 pp of binomial standard error per model
at 88% accuracy), shared by every seed because every cell is scored on the same images.

Seeds and images are *crossed* (every seed scores every image), so the two are resampled
independently: Owen's pigeonhole bootstrap (Owen 2007, for crossed random effects). One replicate
draws n seeds with replacement from the n paired seeds and N images with replacement from the N
test images (one draw of images for every seed and both configurations: the images are one
sample); its statistic is the mean over the drawn seeds of
``metric(configuration on the drawn images) − metric(reference on the drawn images)``. Any
metric computed from per-image outcomes works the same way: the means (accuracy, NLL, Brier, and
their temperature-scaled versions) and the 15-bin ECE, which is not a mean of per-image values and
is the reason this is a bootstrap rather than a closed-form variance sum.

From B replicates the standard error is their standard deviation, inflated by ``√(n/(n−1))``:
resampling n seeds underestimates the variance of a mean of n by the factor (n−1)/n, and the
correction makes the result *equal to the paired t-interval when the images contribute nothing*
(tested). The interval is ``mean ± t_{n−1} · SE`` and the p-value the two-sided t p-value of
``mean / SE`` with n − 1 degrees of freedom: with 4–6 seeds a percentile interval would be far
too narrow (see :mod:`reports.stats.paired`), and n − 1 degrees of freedom are conservative when
the image term dominates. Owen (2007) shows the pigeonhole bootstrap's variance is mildly
conservative for crossed designs (it counts the seed × image interaction twice).

The point estimate is the mean difference of the records' own metrics (the paired table's
``mean_diff``); outcomes are needed only for the spread. A cell without ``outcomes.npz``
(recorded before they were kept) gives no bootstrap (NaN columns and a reason).

References:
    Owen, A. B. (2007). The pigeonhole bootstrap. Annals of Applied Statistics 1(2), 386–411.
    Efron, B. & Tibshirani, R. J. (1993). An Introduction to the Bootstrap, ch. 6 (standard
    errors) and §8.3 (paired data).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Metric → (outcome array(s) it needs, without a view prefix). ``ts/…`` reads the ``ts/``
#: arrays; ``correct`` is shared (a temperature does not change the top label).
SUPPORTED = {"acc": "correct", "nll": "nll", "brier": "brier", "ece": "ece"}

#: The ECE's equal-width bins (harness.metrics.calibration.N_BINS; not imported: no torch here).
N_BINS = 15

#: Bootstrap replicates by default: the SE's own relative error is about 1/√(2B) ≈ 1.6%.
DEFAULT_REPLICATES = 2000

_CHUNK = 250


def argument_problems(level: object, replicates: object) -> list[str]:
    """One line per argument of the bootstrap that cannot be used (``level`` a fraction in
    (0, 1), ``replicates`` a whole number ≥ 2: a standard deviation needs two), naming it, its
    value and what to give instead; empty when both are usable."""
    problems = []
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        hint = "a fraction strictly between 0 and 1, e.g. 0.95"
        if isinstance(level, numbers.Real) and not isinstance(level, bool) and 1 < level < 100:
            hint += f" (did you mean level={level / 100:g}?)"
        problems.append(f"level={level!r}: the interval's level must be {hint}")
    if (
        isinstance(replicates, bool)
        or not isinstance(replicates, numbers.Integral)
        or replicates < 2
    ):
        problems.append(
            f"replicates={replicates!r}: the bootstrap's replicates must be a whole number, at "
            f"least 2 (default {DEFAULT_REPLICATES})"
        )
    return problems


def supports(metric: str) -> bool:
    """Whether ``metric`` can be computed from per-image outcomes (``acc``, ``nll``, ``brier``,
    ``ece`` and their ``ts/`` versions; ``ts/acc`` is ``acc``)."""
    base = metric.removeprefix("ts/")
    return base in SUPPORTED


def _arrays(outcomes: Mapping[str, np.ndarray], metric: str) -> dict[str, np.ndarray]:
    """What ``metric`` needs of one cell's outcomes (KeyError when the cell lacks them)."""
    view = "ts/" if metric.startswith("ts/") else ""
    base = metric.removeprefix("ts/")
    correct = np.asarray(outcomes["correct"], dtype=np.float64)
    if base == "acc":
        return {"value": correct}
    if base == "ece":
        return {"confidence": np.asarray(outcomes[f"{view}confidence"], np.float64),
                "correct": correct}  # fmt: skip
    return {"value": np.asarray(outcomes[f"{view}{SUPPORTED[base]}"], np.float64)}


def _bin_of(confidence: np.ndarray) -> np.ndarray:
    """The equal-width bin ``(b/15, (b+1)/15]`` of each confidence (an edge goes lower), as
    :func:`harness.metrics.calibration.calibration_bins` bins them."""
    edges = np.arange(N_BINS + 1, dtype=np.float64) / N_BINS
    return np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, N_BINS - 1)


def weighted_metric(
    arrays: Mapping[str, np.ndarray], weights: np.ndarray, metric: str
) -> np.ndarray:
    """The metric of one cell under image weights.

    Args:
        arrays: :func:`_arrays` of the cell (length N each).
        weights: ``(B, N)`` how often each image is drawn in each replicate (rows sum to N).

    Returns:
        ``(B,)``: the metric on each replicate's images.
    """
    n = weights.sum(axis=1)
    if "value" in arrays:
        return weights @ arrays["value"] / n
    one_hot = np.zeros((len(arrays["confidence"]), N_BINS))
    one_hot[np.arange(len(one_hot)), _bin_of(arrays["confidence"])] = 1.0
    conf = weights @ (one_hot * arrays["confidence"][:, None])
    correct = weights @ (one_hot * arrays["correct"][:, None])
    return np.abs(conf - correct).sum(axis=1) / n  # Σ_b |Σ conf − Σ correct| / N


@dataclass(frozen=True)
class Bootstrap:
    """One paired comparison over seeds × images.

    Attributes:
        se: standard error of the mean difference (seed-corrected, see the module docstring).
        ci_lo, ci_hi: ``mean ± t_{n−1} · se`` at the requested level.
        p_value: two-sided t p-value of ``mean / se`` with n − 1 degrees of freedom.
        n_images: test images per cell.
        replicates: bootstrap replicates drawn.
    """

    se: float
    ci_lo: float
    ci_hi: float
    p_value: float
    n_images: int
    replicates: int


def paired_bootstrap(
    config: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
    metric: str,
    mean_diff: float,
    *,
    level: float = 0.95,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
) -> Bootstrap:
    """The pigeonhole bootstrap of ``metric(config) − metric(reference)``, paired by seed.

    Args:
        config, reference: per paired seed (same order on both sides), the cell's per-image
            outcomes (:func:`reports.records.outcomes.read_outcomes`), the same N test images in
            the same order everywhere.
        metric: a :func:`supports` metric.
        mean_diff: the point estimate (the records' mean difference), the interval's centre.
        level: the interval's level.
        replicates: B.
        seed: of the resampling (the same table twice gives the same numbers).

    Raises:
        ValueError: fewer than two seeds, an unsupported metric, cells scored on different
            numbers of images, or a level or replicates :func:`argument_problems` refuses.
        KeyError: a cell's outcomes lack the arrays the metric needs (e.g. no ``ts/``).
    """
    from scipy import stats

    if problems := argument_problems(level, replicates):
        raise ValueError("; ".join(problems))
    if not supports(metric):
        raise ValueError(f"{metric!r} is not computed from per-image outcomes")
    n = len(config)
    if n != len(reference) or n < 2:
        raise ValueError(f"need the same seeds on both sides, at least two (got {n}, "
                         f"{len(reference)})")  # fmt: skip
    a = [_arrays(o, metric) for o in config]
    b = [_arrays(o, metric) for o in reference]
    sizes = {len(next(iter(x.values()))) for x in (*a, *b)}
    if len(sizes) != 1:
        raise ValueError(f"cells scored on different numbers of test images: {sorted(sizes)}")
    (n_images,) = sizes
    rng = np.random.default_rng(seed)
    stat = np.empty(replicates)
    # In chunks of replicates: a (B, N) weight matrix for B = 2000 and N = 10,000 test images
    # would hold 160 MB at once.
    for lo in range(0, replicates, _CHUNK):
        size = min(_CHUNK, replicates - lo)
        draws = rng.integers(0, n, size=(size, n))  # the seeds each replicate draws
        images = rng.integers(0, n_images, size=(size, n_images))  # the images it draws
        weights = np.zeros((size, n_images))
        np.add.at(weights, (np.arange(size)[:, None], images), 1.0)  # times each is drawn
        per_seed = np.stack(
            [
                weighted_metric(x, weights, metric) - weighted_metric(y, weights, metric)
                for x, y in zip(a, b, strict=True)
            ]
        )  # fmt: skip  (n, size)
        stat[lo : lo + size] = per_seed[draws.T, np.arange(size)].mean(axis=0)
    se = float(np.std(stat, ddof=1) * np.sqrt(n / (n - 1)))
    t = float(stats.t.ppf((1 + level) / 2, n - 1))
    if se > 0:
        p = float(2 * stats.t.sf(abs(mean_diff) / se, n - 1))
    else:
        p = 1.0 if mean_diff == 0 else 0.0
    return Bootstrap(se, mean_diff - t * se, mean_diff + t * se, p, n_images, replicates)


def bootstrap_rows(
    rows: Sequence[Mapping[str, object]],
    outcomes_of: Callable[[Mapping[str, object], bool], list[Mapping[str, np.ndarray] | None]],
    *,
    level: float = 0.95,
    replicates: int = DEFAULT_REPLICATES,
) -> list[dict[str, object]]:
    """The bootstrap columns of a paired table's rows.

    Args:
        rows: the paired table's rows (``metric``, ``mean_diff``, ``n_pairs`` …).
        outcomes_of: ``(row, reference side?)`` → the outcomes of that side's cells at the row's
            paired seeds, in seed order (None for a cell without them).

    Returns:
        Per row ``boot_se``, ``boot_lo``, ``boot_hi``, ``boot_p``, ``n_images`` and
        ``boot_note`` (why a row has none: an unsupported metric, a cell without outcomes).

    Raises:
        ValueError: a level or replicates :func:`argument_problems` refuses (before any row;
            not a note on every row).
    """
    if problems := argument_problems(level, replicates):
        raise ValueError("; ".join(problems))
    out = []
    for row in rows:
        empty = {"boot_se": np.nan, "boot_lo": np.nan, "boot_hi": np.nan, "boot_p": np.nan,
                 "n_images": np.nan}  # fmt: skip
        metric = str(row["metric"])
        if not supports(metric):
            out.append({**empty, "boot_note": "not a per-image metric"})
            continue
        mine, theirs = outcomes_of(row, False), outcomes_of(row, True)
        if any(o is None for o in (*mine, *theirs)):
            out.append({**empty, "boot_note": "a cell has no outcomes.npz"})
            continue
        try:
            b = paired_bootstrap(mine, theirs, metric, float(row["mean_diff"]), level=level,
                                 replicates=replicates)  # fmt: skip
        except KeyError as exc:  # e.g. ts/nll of a cell evaluated without calibration
            out.append({**empty, "boot_note": f"the outcomes lack {exc.args[0]}"})
            continue
        except ValueError as exc:
            out.append({**empty, "boot_note": str(exc)})
            continue
        out.append({"boot_se": b.se, "boot_lo": b.ci_lo, "boot_hi": b.ci_hi,
                    "boot_p": b.p_value, "n_images": b.n_images, "boot_note": ""})  # fmt: skip
    return out
