"""mCE from the per-severity accuracies of the records (stdlib only: the reporter never imports
torch or the engine)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence


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
