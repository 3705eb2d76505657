"""Paired statistics: the difference of each configuration to a reference method, seed by seed.

Two configurations that differ only in method are trained on the same data split with the same seed,
so their per-seed results are paired: seed-to-seed noise that both share (the split, the
initialisation stream, the order of batches) cancels in the difference. ``paired_differences``
pairs the cells of every non-reference configuration with the reference method's cells of the same
dataset, backbone, variant and seed, and gives, per metric, the mean difference over the paired
seeds, its paired t-interval and the p-value of a test of "no difference".

Why these methods (the suites ship 2, 3, 5 and 10 seeds):

- **Interval: the paired t-interval** ``mean ± t_{n-1, (1+level)/2} · s/√n`` (Student 1908). It is
  exact for normal noise at every n ≥ 2 and conservative for symmetric heavy-tailed noise
  (Student-t, Laplace, Cauchy), which ``tests/reports/stats/test_stats.py`` checks by simulation
  at n = 2, 3, 5, 10. The percentile bootstrap this module used before is a large-sample method:
  with no true difference its 95% interval excluded 0 in about 49% of cases at 2 seeds, 26% at 3
  and 16% at 5, so it is gone.
- **Marks (default): the exact sign-flip permutation test** (Fisher 1935, ch. 21; Good 2005,
  §3.1). Under "no difference" with the two methods exchangeable on a seed, each paired difference
  is as likely positive as negative; the p-value is the fraction of the 2ⁿ sign patterns whose
  |mean| is at least the observed one, enumerated exactly. It needs no normality, but it does
  need that premise: its false-positive rate is at most α when the per-seed differences are
  symmetric about zero (normal, Laplace, Student-t noise: 3.2% at n = 6, 4.8% at n = 10 for
  α = 0.05), not for skewed ones — with differences of mean zero drawn from exponential − 1 it
  marks 6.7% at n = 6 and 9.6% at n = 10, from a centred lognormal (σ = 1) 11.0% and 15.4%
  (``benchmarks/signflip_level.py``, 100,000 null experiments each; the t-test does no better
  there: 11.5% and 10.2%). A mark on a handful of seeds is evidence, not proof, whichever
  test is used. Its price: the smallest possible
  two-sided p-value is 2/2ⁿ — 0.5 at n = 2, 0.25 at 3, 0.0625 at 5, 0.031 at 6 — so at α = 0.05
  it can flag nothing below 6 seeds, and the report says so rather than mark noise.
- **Marks (``test="t"``): the paired t-test**, the one consistent with the interval (a mark iff the
  interval excludes 0). It can reach significance from n = 2, but its level rests on normal noise,
  which a handful of seeds cannot check; the report names the test it used.
- **Holm (1979)** step-down adjustment across every comparison of the table (``holm=True``):
  controls the family-wise error over all configurations × metrics, named on the page.

Which reference cells a configuration is paired with (its *reference configuration*):

- same dataset, backbone, variant (the recipe and other config fields, see
  :func:`reports.records.results.variant_of`) and seed; never across those;
- the reference's configuration at the same M when the reference has cells at that M; otherwise
  the reference's configurations at any M (a ``single`` reference has only M=1);
- every reference configuration that is left is paired separately, one row each, named in the
  ``reference`` column (``"deep_ensemble M=4"``), so an ambiguous match is never averaged away.

Seeds present on one side only are left out; so is a seed whose value is NaN/inf on either side
for that metric (``n_pairs`` counts what is left). Two cells of one configuration with the same
seed (the same config in two suites) are averaged into one value first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.contract.build import parse_name_values
from reports.columns import LIMIT_COLUMN, direction, m_text
from reports.stats.significance import (  # noqa: F401 (re-exported: one import for callers)
    TEST_NAMES,
    TESTS,
    check_test,
    holm,
    min_pairs,
    min_pvalue,
    pvalue,
    signflip_pvalue,
    t_interval,
    t_pvalue,
)

DEFAULT_METRICS = ("acc", "nll", "ece", "brier", "cAcc", "cECE", "ts/nll", "ts/ece")
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
    "test",
    "p_value",
    "p_adjusted",
    "reachable",
    "significant",
    "better",
)
_ROUNDING = 8 * np.finfo(float).eps  # |a - b| at or below this × max(|a|, |b|) counts as 0


def default_metrics(cells: pd.DataFrame) -> list[str]:
    """acc, nll, ece, brier, cAcc, cECE, the calibrated NLL and ECE (``ts/``) and every OOD set's
    MSP AUROC that have a finite value."""
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
    """Which cells belong to the reference (a method, or a method with fixed hyper-parameters;
    ``M=4`` fixes the ensemble size: ``deep_ensemble:M=4`` against the method's other sizes)."""
    method, values = parse_reference(reference)
    mask = cells["method"] == method
    for key, value in values.items():
        if key == "M":
            mask &= cells["M"].astype(str) == str(value)
            continue
        col = f"hp_{key}"
        if col not in cells:
            return mask & False
        mask &= cells[col].map(lambda v, value=value: _same(v, value))
    return mask


def missing_reference(cells: pd.DataFrame, reference: str) -> str | None:
    """Why ``reference`` cannot be compared with (it has no done cells: the line names the
    methods that have some), or None. One check for the report's ``--reference`` and
    :func:`harness.api.paired`."""
    done = _done(cells)
    if reference_mask(done, reference).any():
        return mixed_limits(cells, f"reference {reference}")
    methods = ", ".join(sorted(set(done["method"]))) or "none"
    return (
        f"reference {reference}: no done cells of that method in these results (methods: {methods})"
    )


def mixed_limits(cells: pd.DataFrame, what: str) -> str | None:
    """Why ``cells`` cannot be compared: their done cells mix evaluations on a subset of the
    test set (``evaluation.limit``) with full-set ones, or subsets of different sizes (the line
    names a cell of each); or None."""
    done = _done(cells)
    if LIMIT_COLUMN not in done or done.empty:
        return None
    limits = [None if pd.isna(v) else int(v) for v in done[LIMIT_COLUMN]]
    ids = list(done["cell_id"]) if "cell_id" in done else ["?"] * len(limits)
    first = {k: ids[i] for i, k in reversed(list(enumerate(limits)))}  # a cell of each kind
    if len(first) < 2:
        return None
    shown = [
        f"{'the whole test set' if k is None else f'evaluation.limit={k}'} (cell {first[k]})"
        for k in sorted(first, key=lambda v: -1 if v is None else v)
    ]
    return (
        f"{what}: these results mix cells scored on {' and on '.join(shown)}; a comparison "
        "needs one: report them apart, or re-score the limited cells on the whole set "
        "(harness evaluate with no evaluation.limit)"
    )


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


def per_seed_table(
    values: pd.DataFrame, codes: np.ndarray, seeds: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """(the sorted seeds of every group, values: groups × those seeds × columns, NaN where a
    group has no value for a seed) of the numeric ``values``, one row per cell of group
    ``codes[i]`` and seed ``seeds[i]``; duplicate seeds averaged over their finite values, in one
    groupby. A table, not a block per group: pairing 1,000 groups is then array operations, not
    1,000 set intersections (the paired table here, the bold cells in
    :mod:`reports.stats.bolding`)."""
    means = values.groupby([codes, seeds]).mean()
    group = means.index.get_level_values(0).to_numpy()
    sorted_seeds, seed_at = np.unique(means.index.get_level_values(1).to_numpy(),
                                      return_inverse=True)  # fmt: skip
    table = np.full((n_groups, len(sorted_seeds), values.shape[1]), np.nan)
    table[group, seed_at] = means.to_numpy(dtype=float).reshape(len(means), values.shape[1])
    return sorted_seeds, table


def paired_differences(
    cells: pd.DataFrame,
    reference: str,
    metrics: Sequence[str] | None = None,
    *,
    level: float = 0.95,
    test: str = "signflip",
    alpha: float | None = None,
    holm_adjust: bool = False,
) -> pd.DataFrame:
    """Per configuration × reference configuration × metric: the paired difference to ``reference``.

    ``cells`` is the per-cell frame (:func:`reports.records.results.records_to_frame`); only done
    cells
    count (a frame without ``status`` or ``variant`` columns is taken as all done, one variant).
    The difference is configuration minus reference, in the metric's own units; pairing rules are
    in the module docstring. Columns: the configuration keys (dataset, backbone, method, M,
    hparams, variant); ``reference`` (the reference configuration's label), ``reference_M``,
    ``reference_hparams``; ``metric``; ``n_pairs`` and ``seeds`` (the paired seeds); ``mean_diff``,
    ``ci_lo``, ``ci_hi`` (:func:`t_interval` at ``level``, NaN bounds for one pair); ``test``;
    ``p_value`` (:func:`pvalue`); ``p_adjusted`` (Holm across every row when ``holm_adjust``,
    else ``p_value``); ``reachable`` (``test`` can reach p ≤ ``alpha`` at ``n_pairs``, see
    :func:`min_pvalue`); ``significant`` (reachable and ``p_adjusted`` ≤ ``alpha``, default
    ``1 - level``); ``better`` (the mean difference is an improvement in the metric's direction,
    :func:`reports.columns.directions`: the registry's metric columns and
    ``DIRECTIONS``; NA for a metric without one). No reference cells, or no
    seeds in common, give no rows. Rows follow the configuration keys, then reference M, then
    ``metrics`` order. Every test of the table runs in batches
    (:func:`reports.stats.significance.paired`).
    """
    check_test(test)
    alpha = 1 - level if alpha is None else alpha
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    metrics = _checked_metrics(cells, metrics)
    done = _prepared(cells, reference, metrics)
    keys, m_of, is_ref, (seeds, table) = _groups(done, metrics)
    meta, diffs = _differences(keys, is_ref, seeds, table, metrics)
    ref_method = parse_reference(reference)[0]
    return _rows(meta, diffs, keys, m_of, ref_method, level, test, alpha, holm_adjust)


def _checked_metrics(cells: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    """The metrics to compare (default: :func:`default_metrics`), after checking ``cells``."""
    for k in ("dataset", "backbone", "method", "M", "seed"):
        if k not in cells:
            raise ValueError(f"cells has no {k!r} column; pass records_to_frame(records)")
    metrics = list(default_metrics(cells) if metrics is None else metrics)
    absent = [m for m in metrics if m not in cells]
    if absent:
        raise ValueError(f"metric column(s) not in cells: {', '.join(absent)}")
    return metrics


def _prepared(cells: pd.DataFrame, reference: str, metrics: list[str]) -> pd.DataFrame:
    """The done cells with every key column, ``_m`` (M as a sort key), ``_ref`` (a reference
    cell) and the metrics as floats, NaN where not finite (no value for that seed)."""
    done = _done(cells).copy()
    for k, default in (("hparams", ""), ("variant", "")):
        if k not in done:
            done[k] = default
    done["_m"] = [_m_key(m) for m in done["M"]]
    done["_ref"] = reference_mask(done, reference)
    if metrics:
        values = done[metrics].apply(pd.to_numeric, errors="coerce").astype(float)
        done[metrics] = values.where(np.isfinite(values))
    return done


def _groups(
    done: pd.DataFrame, metrics: list[str]
) -> tuple[list, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Per configuration (sorted by its keys): its keys, M, whether it is a reference
    configuration; and the per-seed table of all (:func:`per_seed_table`)."""
    key_cols = ["dataset", "backbone", "method", "_m", "hparams", "variant"]
    codes = done.groupby(key_cols, sort=True, dropna=False).ngroup().to_numpy()
    _, first_pos = np.unique(codes, return_index=True)  # each group's first cell
    keys = list(done[key_cols].iloc[first_pos].itertuples(index=False, name=None))
    m_of = done["M"].to_numpy(dtype=object)[first_pos]
    is_ref = done["_ref"].groupby(codes).all().to_numpy()
    return keys, m_of, is_ref, per_seed_table(done[metrics], codes, done["seed"].to_numpy(),
                                              len(keys))  # fmt: skip


def _differences(
    keys: list[tuple], is_ref: np.ndarray, seeds: np.ndarray, table: np.ndarray, metrics: list[str]
) -> tuple[list[tuple], list[np.ndarray]]:
    """Each configuration paired with its reference configurations (module docstring): per
    pair and metric with a finite difference, (group, reference group, metric, seeds) and the
    per-seed differences (``seeds``, ``table``: :func:`per_seed_table`)."""
    refs: dict[tuple, list[int]] = {}  # (dataset, backbone, variant) → reference groups
    for g in np.flatnonzero(is_ref):
        refs.setdefault(keys[g][:2] + keys[g][5:], []).append(int(g))
    mine, theirs = [], []
    for g, key in enumerate(keys):
        if is_ref[g]:
            continue
        candidates = refs.get(key[:2] + key[5:], [])
        same_m = [r for r in candidates if keys[r][3] == key[3]]
        for r in sorted(same_m or candidates, key=lambda r: (keys[r][3], keys[r][4])):
            mine.append(g)
            theirs.append(r)
    if not mine:
        return [], []
    a, b = table[mine], table[theirs]  # (pairs × seeds × metrics), NaN where a seed is missing
    diff = a - b
    # Differences at rounding level (0.8 + 0.02 vs 0.7 + 0.12) are 0, not a tiny effect that
    # every seed shares and the t-test would call significant.
    with np.errstate(invalid="ignore"):
        diff[np.abs(diff) <= _ROUNDING * np.maximum(np.abs(a), np.abs(b))] = 0.0
    finite = np.isfinite(diff)  # the seeds both sides have, with a value for that metric
    meta, diffs = [], []
    for p, j in zip(*np.nonzero(finite.any(axis=1)), strict=True):  # pair by pair, then metric
        kept = finite[p, :, j]
        meta.append((mine[p], theirs[p], metrics[j], seeds[kept]))
        diffs.append(diff[p, kept, j])
    return meta, diffs


def _seed_texts(seeds: list[np.ndarray]) -> list[str]:
    """``"0, 1, 2"`` for each seed list (most rows share one: each text is made once)."""
    texts: dict[bytes, str] = {}
    out = []
    for sd in seeds:
        key = sd.tobytes()
        if key not in texts:
            texts[key] = ", ".join(str(x) for x in sd)
        out.append(texts[key])
    return out


def _rows(meta, diffs, keys, m_of, ref_method, level, test, alpha, holm_adjust) -> pd.DataFrame:
    """The paired table from the collected differences: every test in one batch per length."""
    from reports.stats.significance import paired

    mean, lo, hi, p = paired(diffs, test, level)
    # Each value computed column by column (a reference's label, a metric's direction: once
    # each, not once per row of 30,000 at 1,000 configurations).
    g, r, metrics, seeds = (list(x) for x in zip(*meta, strict=True)) if meta else ([],) * 4
    ident = [keys[i] for i in g]
    dirs = {m: direction(m) for m in set(metrics)}
    labels = {i: reference_label(ref_method, m_of[i], keys[i][4]) for i in set(r)}
    columns = {
        "dataset": [k[0] for k in ident],
        "backbone": [k[1] for k in ident],
        "method": [k[2] for k in ident],
        "M": [m_of[i] for i in g],
        "hparams": [k[4] for k in ident],
        "variant": [k[5] for k in ident],
        "reference": [labels[i] for i in r],
        "reference_M": [m_of[i] for i in r],
        "reference_hparams": [keys[i][4] for i in r],
        "metric": metrics,
        "n_pairs": [len(x) for x in seeds],
        "seeds": _seed_texts(seeds),
        "mean_diff": [float(x) for x in mean],
        "ci_lo": [float(x) for x in lo],
        "ci_hi": [float(x) for x in hi],
        "test": [test] * len(meta),
        "p_value": [float(x) for x in p],
        "reachable": [min_pvalue(test, len(x)) <= alpha for x in seeds],
        "better": [
            pd.NA if dirs[m] is None else bool(d > 0 if dirs[m] == "higher" else d < 0)
            for m, d in zip(metrics, mean, strict=True)
        ],
    }
    out = pd.DataFrame(columns if meta else [], columns=list(COLUMNS))  # (empty: object columns)
    p_values = out["p_value"].to_numpy(dtype=float)
    out["p_adjusted"] = holm(p_values) if holm_adjust else p_values
    out["reachable"] = out["reachable"].astype(bool)
    out["significant"] = out["reachable"] & (out["p_adjusted"] <= alpha)  # NaN p: False
    out["better"] = out["better"].astype("boolean")
    out["n_pairs"] = out["n_pairs"].astype(int)
    return out
