"""A paired comparison that counts the test set: seeds × images, crossed.

The paired t-interval of :mod:`reports.stats.paired` treats the test set as fixed: it measures
how much a difference varies from seed to seed on *these* test images. A reader wants the
difference on the distribution the test set was drawn from, so the sampling of the images is a
second source of error (on a 10,000-image test set, 0.34 pp of binomial standard error per model
at 88% accuracy), shared by every seed because every cell is scored on the same images.

Seeds and images are *crossed* (every seed scores every image). :func:`bootstrap_rows` builds,
per paired-table row, the R × C matrix of per-image differences (configuration − reference, seed
by seed: :func:`difference_matrix`) and reports the unbiased variance-components estimate of the
mean difference's variance with Satterthwaite's degrees of freedom
(:mod:`reports.stats.variance`: the model, the estimator, the df). Accuracy, NLL and Brier (and
their ``ts/`` versions) are means of per-image values; the 15-bin ECE is not, and enters through
its exact linearisation into per-image values whose mean *is* the ECE
(:func:`reports.stats.variance.ece_influence`). The interval is ``mean ± t_{df} · SE`` and the
p-value the two-sided t p-value of ``mean / SE`` with df; where marks rest on those p-values they
are Holm-adjusted over the table like the t-marks (:func:`image_marks`).

Until issue 59 these columns came from Owen's (2007) pigeonhole bootstrap (:func:`paired_bootstrap`,
kept to document it and for comparison): it resamples seeds and images independently, and its
variance, with the √(n/(n−1)) seed correction applied here, has expectation ≈ σ_A²/R +
σ_B²/C · R/(R−1) + σ_E²/(RC) · (3R−2)/(R−1): the seed × image interaction counted 3.33 times at
R = 4 seeds and 3.2 times at R = 6 (this docstring said "twice"), and on real records the
interaction dominates, so its intervals were 1.08–3.8× too wide for the means
(:func:`reports.stats.variance.naive_bootstrap_variance`, docs/methods.md).

The columns keep the bootstrap's names (``boot_se``, ``boot_lo``, ``boot_hi``, ``boot_p``,
``n_images``, ``boot_note``) so that CSVs, scripts and the claims' citations of them keep
working; ``df`` is new. The point estimate is the mean difference of the records' own metrics
(the paired table's ``mean_diff``); outcomes are needed only for the spread. A cell without
``outcomes.npz`` (recorded before they were kept) gives no interval (NaN columns and a reason).

References:
    Owen, A. B. (2007). The pigeonhole bootstrap. Annals of Applied Statistics 1(2), 386–411.
    Satterthwaite, F. E. (1946). Biometrics Bulletin 2(6), 110–114.
    Searle, S. R., Casella, G. & McCulloch, C. E. (1992). Variance Components. Wiley, ch. 4.
    Efron, B. & Tibshirani, R. J. (1993). An Introduction to the Bootstrap, ch. 6 (standard
    errors) and §8.3 (paired data).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from reports.stats.variance import N_BINS, bin_of, crossed_interval, ece_influence

if TYPE_CHECKING:
    import pandas as pd

#: Metric → (outcome array(s) it needs, without a view prefix). ``ts/…`` reads the ``ts/``
#: arrays; ``correct`` is shared (a temperature does not change the top label).
SUPPORTED = {"acc": "correct", "nll": "nll", "brier": "brier", "ece": "ece"}

#: :func:`paired_bootstrap`'s replicates by default: the SE's own relative error is about
#: 1/√(2B) ≈ 1.6%. The report's columns draw nothing; ``replicates`` is still accepted (and
#: checked) there so that existing calls keep working.
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
    one_hot[np.arange(len(one_hot)), bin_of(arrays["confidence"])] = 1.0
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


def _paired_arrays(
    config: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
    metric: str,
    least: int,
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], int]:
    """Both sides' arrays for ``metric`` and their common image count C, checked: a supported
    metric, the same number of paired seeds on both sides (at least ``least``), one C."""
    if not supports(metric):
        raise ValueError(f"{metric!r} is not computed from per-image outcomes")
    n = len(config)
    if n != len(reference) or n < least:
        word = {1: "one", 2: "two"}.get(least, str(least))
        raise ValueError(f"need the same seeds on both sides, at least {word} (got {n}, "
                         f"{len(reference)})")  # fmt: skip
    a = [_arrays(o, metric) for o in config]
    b = [_arrays(o, metric) for o in reference]
    sizes = {len(next(iter(x.values()))) for x in (*a, *b)}
    if len(sizes) != 1:
        raise ValueError(f"cells scored on different numbers of test images: {sorted(sizes)}")
    return a, b, sizes.pop()


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
    """The pigeonhole bootstrap of ``metric(config) − metric(reference)``, paired by seed: what
    the report used before issue 59, kept to document it (the report now uses
    :func:`bootstrap_rows`'s variance components).

    Each of B replicates draws n seeds with replacement and, independently, N images with
    replacement (one draw for every seed and both sides), and takes the mean over the drawn seeds
    of the metric difference on the drawn images; the SE is the replicates' SD × √(n/(n−1)), the
    interval ``mean ± t_{n−1} · SE``. Its variance over-counts the seed × image interaction
    ((3n−2)/(n−1) times; :func:`reports.stats.variance.naive_bootstrap_variance` is its B → ∞
    value for the per-image means) and n − 1 df ignore the images' share.

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
    n = len(config)
    a, b, n_images = _paired_arrays(config, reference, metric, least=2)
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


def per_image(arrays: Mapping[str, np.ndarray], metric: str) -> np.ndarray:
    """``(N,)`` values whose mean is the cell's ``metric``: the per-image correct/NLL/Brier, or
    for the ECE its exact linearisation (:func:`reports.stats.variance.ece_influence`).

    Args:
        arrays: :func:`_arrays` of the cell for ``metric``.
    """
    if "value" in arrays:
        return arrays["value"]
    return ece_influence(arrays["confidence"], arrays["correct"])


def difference_matrix(
    config: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
    metric: str,
) -> np.ndarray:
    """``(R, C)`` per-image differences, configuration − reference, one row per paired seed.

    Row i's mean is seed i's metric difference (exactly, for the ECE too), so the matrix's mean
    is the paired table's ``mean_diff`` up to how the records rounded their metrics.

    Args:
        config, reference: per paired seed (same order on both sides), the cell's per-image
            outcomes, the same C test images in the same order everywhere.
        metric: a :func:`supports` metric.

    Raises:
        ValueError: an unsupported metric, no seeds or a different number on the two sides,
            cells scored on different numbers of images.
        KeyError: a cell's outcomes lack the arrays the metric needs (e.g. no ``ts/``).
    """
    a, b, _ = _paired_arrays(config, reference, metric, least=1)
    return np.stack([per_image(x, metric) - per_image(y, metric)
                     for x, y in zip(a, b, strict=True)])  # fmt: skip


#: The columns :func:`bootstrap_rows` adds (the names are the former bootstrap's: module docstring).
COLUMNS = ("boot_se", "boot_lo", "boot_hi", "boot_p", "df", "n_images", "boot_note")


def crossed_row(d: np.ndarray, mean_diff: float, level: float = 0.95) -> dict[str, object]:
    """The columns of one comparison from its ``(R, C)`` difference matrix ``d``, centred on
    ``mean_diff`` (:func:`reports.stats.variance.crossed_interval`).

    Degenerate designs get defined outputs: V̂ = 0 (every seed and image give one difference)
    a zero-width interval, p 1 at a difference of 0 and 0 otherwise, df NaN; one seed, where the
    seed-to-seed variance cannot be estimated, NaN columns and a note giving what can be (the
    test images' share given that seed, s_cols/√C); one image NaN and a note.
    """
    r, c = d.shape
    row: dict[str, object] = dict.fromkeys(COLUMNS[:5], np.nan)
    row.update(n_images=c, boot_note="")
    if r < 2:
        se = float(np.std(d[0], ddof=1) / np.sqrt(c)) if c > 1 else np.nan
        row["boot_note"] = (
            "one seed: the seed-to-seed variance cannot be estimated, so no interval (the test "
            f"images alone, given this seed: SE {se:.3g})"
        )
        return row
    if c < 2:
        row["boot_note"] = "one test image: the images' variance cannot be estimated"
        return row
    got = crossed_interval(d, mean_diff, level)
    row.update(boot_se=float(got.se), boot_lo=float(got.lo), boot_hi=float(got.hi),
               boot_p=float(got.p_value), df=float(got.df))  # fmt: skip
    return row


def bootstrap_rows(
    rows: Sequence[Mapping[str, object]],
    outcomes_of: Callable[[Mapping[str, object], bool], list[Mapping[str, np.ndarray] | None]],
    *,
    level: float = 0.95,
    replicates: int = DEFAULT_REPLICATES,
) -> list[dict[str, object]]:
    """The seeds × images columns of a paired table's rows (the name is the former bootstrap's).

    Args:
        rows: the paired table's rows (``metric``, ``mean_diff``, ``n_pairs`` …).
        outcomes_of: ``(row, reference side?)`` → the outcomes of that side's cells at the row's
            paired seeds, in seed order (None for a cell without them).
        level: the intervals' level.
        replicates: accepted and checked for existing callers; nothing is drawn.

    Returns:
        Per row the :data:`COLUMNS`: ``boot_se`` (√V̂), ``boot_lo``, ``boot_hi``, ``boot_p``,
        ``df`` (Satterthwaite's), ``n_images`` and ``boot_note`` (why a row has none: an
        unsupported metric, a cell without outcomes, one seed; :func:`crossed_row`).

    Raises:
        ValueError: a level or replicates :func:`argument_problems` refuses (before any row;
            not a note on every row).
    """
    if problems := argument_problems(level, replicates):
        raise ValueError("; ".join(problems))
    out = []
    empty = dict.fromkeys(COLUMNS[:6], np.nan)
    for row in rows:
        metric = str(row["metric"])
        if not supports(metric):
            out.append({**empty, "boot_note": "not a per-image metric"})
            continue
        mine, theirs = outcomes_of(row, False), outcomes_of(row, True)
        if any(o is None for o in (*mine, *theirs)):
            out.append({**empty, "boot_note": "a cell has no outcomes.npz"})
            continue
        try:
            d = difference_matrix(mine, theirs, metric)
        except KeyError as exc:  # e.g. ts/nll of a cell evaluated without calibration
            out.append({**empty, "boot_note": f"the outcomes lack {exc.args[0]}"})
            continue
        except ValueError as exc:
            out.append({**empty, "boot_note": str(exc)})
            continue
        out.append(crossed_row(d, float(row["mean_diff"]), level))
    return out


def image_marks(
    table: pd.DataFrame, holm: bool, alpha: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """``(boot_p_adjusted, boot_significant)`` for a table with ``boot_p``: the marks that rest
    on the seeds × images test, adjusted as the t-marks are (:mod:`reports.stats.paired`).

    With ``holm``, Holm's (1979) step-down adjustment over every row of the table with a
    ``boot_p`` (rows without one are not counted, as :func:`reports.stats.significance.holm`
    treats NaN): the family is the table's, the one the ``p_adjusted`` of the t-marks is
    adjusted over. A row is significant where its (adjusted) p ≤ ``alpha``.
    """
    from reports.stats.significance import holm as holm_adjust

    p = table["boot_p"].to_numpy(dtype=float)
    adjusted = holm_adjust(p) if holm else p
    return adjusted, np.asarray(adjusted <= alpha)  # NaN compares False: no mark
