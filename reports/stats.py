"""Paired statistics: the difference of each configuration to a reference method, seed by seed.

Two configurations that differ only in method are trained on the same data split with the same seed,
so their per-seed results are paired: seed-to-seed noise that both share (the split, the
initialisation stream, the order of batches) cancels in the difference. ``paired_differences``
pairs the cells of every non-reference configuration with the reference method's cells of the same
dataset, backbone, variant and seed, and gives, per metric, the mean difference over the paired
seeds with a percentile-bootstrap confidence interval (``bootstrap_ci``).

Which reference cells a configuration is paired with (its *reference configuration*):

- same dataset, backbone, variant (the recipe and other config fields, see
  :func:`reports.aggregate.variant_keys`) and seed; never across those;
- the reference's configuration at the same M when the reference has cells at that M; otherwise
  the reference's configurations at any M (a ``single`` reference has only M=1);
- every reference configuration that is left is paired separately, one row each, named in the
  ``reference`` column (``"deep_ensemble M=4"``), so an ambiguous match is never averaged away.

Seeds present on one side only are left out; so is a seed whose value is NaN/inf on either side
for that metric (``n_pairs`` counts what is left). Two cells of one configuration with the same
seed (the same config in two suites) are averaged into one value first.

Caveat: the percentile bootstrap is a large-sample method; with few seeds its interval is too
narrow. For normal noise and no true difference a 95% interval excludes 0 in about 49% of cases
with 2 seeds, 26% with 3, 16% with 5, 9% with 10 and 7.5% with 20 (nominal: 5%). Many metrics ×
configurations are tested at once, too, so a few flags are expected by chance alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.schema import parse_name_values
from reports.aggregate import direction, m_text

DEFAULT_METRICS = ("acc", "nll", "ece", "brier", "cAcc", "cECE")
PAIR_KEYS = ("dataset", "backbone", "variant")  # must be equal (besides the seed) to pair
CONFIG_KEYS = ("dataset", "backbone", "method", "M", "hparams", "variant")
COLUMNS = (
    *CONFIG_KEYS,
    "reference",
    "reference_M",
    "reference_hparams",
    "metric",
    "n_pairs",
    "seeds",
    "mean_diff",
    "ci_lo",
    "ci_hi",
    "significant",
    "better",
)
_ROUNDING = 8 * np.finfo(float).eps  # |a - b| at or below this × max(|a|, |b|) counts as 0
_MAX_DRAWS = 1 << 24  # resample indices drawn at once (128 MiB of int64); more go in batches


def bootstrap_ci(
    diffs: np.ndarray | Sequence[float],
    n_resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of ``diffs`` and its percentile-bootstrap ``level`` interval.

    ``diffs`` holds one paired difference per seed. The seeds are resampled with replacement
    ``n_resamples`` times (``numpy.random.default_rng(seed)``, so the result is deterministic), the
    mean of each resample taken, and ``lo``/``hi`` are the ``(1 - level)/2`` and ``(1 + level)/2``
    quantiles of those means (linear interpolation, NumPy's default). ``mean`` is the mean of
    ``diffs`` itself. One difference gives ``(d, nan, nan)``; none gives ``(nan, nan, nan)``.
    Identical differences give an interval of zero width at their value.
    """
    # Hand-written rather than scipy.stats.bootstrap(method="percentile"): it is the same
    # computation (same draws for the same Generator; tests/test_stats.py checks they agree), but
    # pyproject allows scipy >= 1.11 and scipy has since renamed the generator argument
    # (random_state → rng, 1.15) and changed the quantile routine it uses, so the published
    # intervals could shift with the installed scipy; it also refuses n=1, and importing
    # scipy.stats costs more than these few lines.
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1:
        raise ValueError(f"diffs must be one-dimensional (one difference per seed), got {d.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive int, got {n_resamples!r}")
    if not np.isfinite(d).all():
        raise ValueError("diffs contain NaN or inf; leave those seeds out before bootstrapping")
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(d.mean())
    if n == 1:
        return mean, math.nan, math.nan
    if d.min() == d.max():  # every resample is the same: exactly that value, free of rounding
        return float(d[0]), float(d[0]), float(d[0])
    rng = np.random.default_rng(seed)
    batch = max(1, _MAX_DRAWS // n)
    means = np.concatenate(
        [
            d[rng.integers(0, n, size=(min(batch, n_resamples - k), n))].mean(axis=-1)
            for k in range(0, n_resamples, batch)
        ]
    )
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return mean, float(lo), float(hi)


def default_metrics(cells: pd.DataFrame) -> list[str]:
    """acc, nll, ece, brier, cAcc, cECE and every OOD set's MSP AUROC that has a finite value."""
    ood = [c for c in cells.columns if c.startswith("ood/") and c.endswith("/msp/auroc")]
    return [
        c
        for c in (*DEFAULT_METRICS, *ood)
        if c in cells and np.isfinite(pd.to_numeric(cells[c], errors="coerce")).any()
    ]


def default_reference(cells: pd.DataFrame) -> str | None:
    """``"deep_ensemble"`` if it has done cells, else ``"single"``, else None."""
    methods = set(_done(cells)["method"]) if len(cells) else set()
    return next((m for m in ("deep_ensemble", "single") if m in methods), None)


def parse_reference(reference: str) -> tuple[str, dict[str, object]]:
    """``"deep_ensemble"`` → (method, {}); ``"sigma_ens:lam=0.001,tau=0.1"`` → the method and
    the hyper-parameter values its reference configurations must have."""
    return parse_name_values(reference, "method")


def reference_mask(cells: pd.DataFrame, reference: str) -> pd.Series:
    """Which cells belong to the reference (a method, or a method with fixed hyper-parameters)."""
    method, values = parse_reference(reference)
    mask = cells["method"] == method
    for key, value in values.items():
        col = f"hp_{key}"
        if col not in cells:
            return mask & False
        mask &= cells[col].map(lambda v, value=value: _same(v, value))
    return mask


def _same(a: object, b: object) -> bool:
    try:
        return float(a) == float(b)  # 0.001 in YAML and 1e-3 in a record are one value
    except (TypeError, ValueError):
        return str(a) == str(b)


def _done(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["status"] == "done"] if "status" in cells else cells


def _m_key(m) -> float:
    return -math.inf if m is None or pd.isna(m) else float(m)  # NaN M sorts and matches as one


def reference_label(reference: str, m, hparams: str) -> str:
    """``deep_ensemble M=4``, or ``sigma_ens M=4 (tau=0.5)`` for a reference with hparams."""
    return f"{reference} M={m_text(m, '?')}" + (f" ({hparams})" if hparams else "")


def _per_seed(frame: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per seed (duplicates averaged over their finite values)."""
    return frame[metrics].groupby(frame["seed"].to_numpy()).mean()


def paired_differences(
    cells: pd.DataFrame,
    reference: str,
    metrics: Sequence[str] | None = None,
    *,
    n_resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Per configuration × reference configuration × metric: the paired difference to ``reference``.

    ``cells`` is the per-cell frame (:func:`reports.aggregate.records_to_frame`); only done cells
    count (a frame without ``status`` or ``variant`` columns is taken as all done, one variant).
    The difference is configuration minus reference, in the metric's own units; pairing rules are
    in the module docstring. Columns: the configuration keys (dataset, backbone, method, M,
    hparams, variant); ``reference`` (the reference configuration's label), ``reference_M``,
    ``reference_hparams``; ``metric``; ``n_pairs`` and ``seeds`` (the paired seeds); ``mean_diff``,
    ``ci_lo``, ``ci_hi`` (:func:`bootstrap_ci`, NaN bounds for one pair); ``significant`` (the
    interval excludes 0); ``better`` (the mean difference is an improvement in the metric's
    direction, :data:`reports.aggregate.DIRECTIONS`; NA for a metric without one). No reference
    cells, or no seeds in common, give no rows. Rows follow the configuration keys, then
    reference M, then ``metrics`` order.
    """
    for k in ("dataset", "backbone", "method", "M", "seed"):
        if k not in cells:
            raise ValueError(f"cells has no {k!r} column; pass records_to_frame(records)")
    metrics = list(default_metrics(cells) if metrics is None else metrics)
    absent = [m for m in metrics if m not in cells]
    if absent:
        raise ValueError(f"metric column(s) not in cells: {', '.join(absent)}")
    done = _done(cells).copy()
    for k, default in (("hparams", ""), ("variant", "")):
        if k not in done:
            done[k] = default
    done["_m"] = [_m_key(m) for m in done["M"]]
    done["_ref"] = reference_mask(done, reference)
    ref_method = parse_reference(reference)[0]
    if metrics:
        values = done[metrics].apply(pd.to_numeric, errors="coerce").astype(float)
        done[metrics] = values.where(np.isfinite(values))  # NaN/inf: no value for that seed
    rows: list[dict] = []
    key_cols = ["dataset", "backbone", "method", "_m", "hparams", "variant"]
    groups = {k: g for k, g in done.groupby(key_cols, sort=True, dropna=False)}
    refs = [k for k, g in groups.items() if g["_ref"].all()]
    ref_seeds: dict[tuple, pd.DataFrame] = {}
    for key, group in groups.items():
        dataset, backbone, method, m, hparams, variant = key
        if key in refs:
            continue
        candidates = [r for r in refs if (r[0], r[1], r[5]) == (dataset, backbone, variant)]
        same_m = [r for r in candidates if r[3] == m]
        mine = _per_seed(group, metrics)
        for ref_key in sorted(same_m or candidates, key=lambda r: (r[3], r[4])):
            if ref_key not in ref_seeds:
                ref_seeds[ref_key] = _per_seed(groups[ref_key], metrics)
            theirs = ref_seeds[ref_key]
            common = mine.index.intersection(theirs.index).sort_values()
            if not len(common):
                continue
            a, b = mine.loc[common], theirs.loc[common]
            diff = a - b
            # Differences at rounding level (0.8 + 0.02 vs 0.7 + 0.12) are 0, not a tiny effect
            # that every seed shares and the bootstrap would call significant.
            diff = diff.mask(diff.abs() <= _ROUNDING * np.maximum(a.abs(), b.abs()), 0.0)
            label = reference_label(ref_method, groups[ref_key]["M"].iloc[0], ref_key[4])
            for metric in metrics:
                d = diff[metric]
                d = d[np.isfinite(d)]
                if not len(d):
                    continue
                mean, lo, hi = bootstrap_ci(d.to_numpy(), n_resamples, level, seed)
                better_dir = direction(metric)
                better = (
                    pd.NA
                    if better_dir is None
                    else bool(mean > 0 if better_dir == "higher" else mean < 0)
                )
                rows.append(
                    {
                        "dataset": dataset,
                        "backbone": backbone,
                        "method": method,
                        "M": group["M"].iloc[0],
                        "hparams": hparams,
                        "variant": variant,
                        "reference": label,
                        "reference_M": groups[ref_key]["M"].iloc[0],
                        "reference_hparams": ref_key[4],
                        "metric": metric,
                        "n_pairs": len(d),
                        "seeds": ", ".join(str(s) for s in d.index),
                        "mean_diff": mean,
                        "ci_lo": lo,
                        "ci_hi": hi,
                        "significant": bool(lo > 0 or hi < 0),  # False for NaN bounds
                        "better": better,
                    }
                )
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["better"] = out["better"].astype("boolean")
    out["significant"] = out["significant"].astype(bool)
    out["n_pairs"] = out["n_pairs"].astype(int)
    return out


__all__ = [
    "DEFAULT_METRICS",
    "bootstrap_ci",
    "default_metrics",
    "default_reference",
    "paired_differences",
    "parse_reference",
    "reference_label",
    "reference_mask",
]
