"""Paired statistics: level and coverage by simulation, exact answers, and the pairing rules."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from record_factory import make_record
from scipy import stats as scipy_stats

from reports.records.results import records_to_frame
from reports.stats import paired as stats
from reports.stats.paired import (
    default_metrics,
    default_reference,
    holm,
    min_pairs,
    min_pvalue,
    paired_differences,
    pvalue,
    signflip_pvalue,
    t_interval,
    t_pvalue,
)

# --- level and coverage under the null, by simulation -------------------------------------------

N_EXPERIMENTS = 4000  # per n and noise; 95% binomial band at 5% is about ±0.7 points
NOISES = {
    "normal": lambda rng, shape: rng.normal(0.0, 0.01, size=shape),
    "student_t2": lambda rng, shape: 0.01 * rng.standard_t(2, size=shape),  # infinite variance
    "laplace": lambda rng, shape: rng.laplace(0.0, 0.01, size=shape),
}


@pytest.mark.parametrize("noise", sorted(NOISES))
@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_marks_hold_their_level_and_intervals_cover(noise, n):
    """No true difference: a mark ≤ 6% of the time, the 95% interval covers 0 ≥ 93% of the time.

    The paired noise is symmetric (two exchangeable methods on one seed); a shift of the whole
    difference (the true effect, here 0.003) must not change coverage of the true value.
    """
    rng = np.random.default_rng(1000 * n + sorted(NOISES).index(noise))
    diffs = NOISES[noise](rng, (N_EXPERIMENTS, n))
    for test in ("signflip", "t"):
        p = pvalue(diffs, test)
        marks = (p <= 0.05) & (min_pvalue(test, n) <= 0.05)
        assert marks.mean() <= 0.06, (test, noise, n, marks.mean())
    _, lo, hi = t_interval(diffs + 0.003)
    coverage = ((lo <= 0.003) & (hi >= 0.003)).mean()
    assert coverage >= 0.93, (noise, n, coverage)
    if n <= 5:  # the sign-flip test cannot reach 0.05 below 6 pairs: never a mark
        assert (signflip_pvalue(diffs) >= 2.0 ** (1 - n) - 1e-12).all()


def test_marks_have_power_where_they_can():
    """A real effect of 1.5 noise std at 10 seeds is flagged by both tests most of the time."""
    rng = np.random.default_rng(7)
    diffs = rng.normal(0.015, 0.01, size=(2000, 10))
    assert (pvalue(diffs, "signflip") <= 0.05).mean() > 0.8
    assert (pvalue(diffs, "t") <= 0.05).mean() > 0.9


# --- exact answers ------------------------------------------------------------------------------


def test_t_interval_and_pvalue_match_scipy():
    d = np.array([0.3, -0.1, 0.5, 0.2, 0.4, 0.25])
    ref = scipy_stats.ttest_1samp(d, 0.0)
    mean, lo, hi = (float(v) for v in t_interval(d, 0.9))
    ci = ref.confidence_interval(0.9)
    assert (mean, lo, hi) == pytest.approx((d.mean(), ci.low, ci.high), rel=1e-12)
    assert float(t_pvalue(d)) == pytest.approx(ref.pvalue, rel=1e-12)


def test_signflip_is_exact_and_matches_scipy():
    d = np.array([0.3, -0.1, 0.5, 0.2, 0.4, 0.25])
    # Patterns with |sum| ≥ 1.55: all +, and flipping only -0.1 (sum 1.75) or only 0.2? no (1.15):
    # exactly {all +, flip -0.1} and their negations → 4 / 64.
    assert float(signflip_pvalue(d)) == pytest.approx(4 / 64)
    ref = scipy_stats.permutation_test(
        (d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples"
    )
    assert float(signflip_pvalue(d)) == pytest.approx(ref.pvalue)
    assert float(signflip_pvalue([0.01, 0.02])) == 0.5  # the smallest p at n = 2
    assert float(signflip_pvalue([0.0, 0.0, 0.0])) == 1.0
    batch = signflip_pvalue(np.stack([d, -d, np.zeros(6)]))
    assert batch.tolist() == pytest.approx([4 / 64, 4 / 64, 1.0])


def test_minimum_pvalues_and_pairs_needed():
    assert [min_pvalue("signflip", n) for n in (1, 2, 3, 5, 6)] == [1.0, 0.5, 0.25, 0.0625, 0.03125]
    assert (min_pvalue("t", 1), min_pvalue("t", 2)) == (1.0, 0.0)
    assert (min_pairs("signflip"), min_pairs("t"), min_pairs("signflip", 0.01)) == (6, 2, 8)
    with pytest.raises(ValueError, match="unknown test 'wilcoxon'; expected one of: signflip, t"):
        min_pvalue("wilcoxon", 3)


def test_identical_and_constant_differences():
    assert [float(v) for v in t_interval(np.zeros(4))] == [0.0, 0.0, 0.0]
    assert [float(v) for v in t_interval(np.full(4, 0.05))] == [0.05, 0.05, 0.05]
    assert (float(t_pvalue(np.full(4, 0.05))), float(t_pvalue(np.zeros(4)))) == (0.0, 1.0)
    mean, lo, hi = t_interval(np.array([0.03]))
    assert float(mean) == 0.03 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(float(v)) for v in t_interval(np.array([])))
    assert math.isnan(float(t_pvalue([0.1])))


def test_holm_adjustment():
    # m = 4 finite: sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → 0.06
    out = holm([0.01, 0.04, 0.03, np.nan, 0.005])
    assert out[[0, 1, 2, 4]].tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(out[3])
    assert holm([]).shape == (0,)
    assert holm([0.9, 0.8]).tolist() == [1.0, 1.0]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="diffs contain NaN or inf"):
        t_interval(np.array([0.1, float("nan"), 0.2]))
    with pytest.raises(ValueError, match="at least one axis"):
        signflip_pvalue(np.float64(0.1))
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\), got 95"):
        t_interval(np.zeros(3), level=95)


# --- paired_differences -------------------------------------------------------------------------


def _cells(rows: list[dict]) -> pd.DataFrame:
    base = {
        "status": "done",
        "dataset": "digits",
        "backbone": "mlp",
        "hparams": "",
        "variant": "",
        "acc": 0.8,
        "nll": 0.5,
    }
    return pd.DataFrame([{**base, **r} for r in rows])


def _one(frame: pd.DataFrame, **match) -> pd.Series:
    sel = frame
    for k, v in match.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_constant_shift_and_identical_methods_through_records():
    recs = []
    for s, acc in enumerate([0.80, 0.85, 0.90, 0.83, 0.87]):
        recs.append(make_record(method="deep_ensemble", seed=s, acc=acc, nll=0.4))
        recs.append(make_record(method="better", seed=s, acc=acc + 0.05, nll=0.4))
        recs.append(make_record(method="same", seed=s, acc=acc, nll=0.4))
    out = paired_differences(records_to_frame(recs), "deep_ensemble", ["acc", "nll"])
    shifted = _one(out, method="better", metric="acc")
    assert shifted["mean_diff"] == pytest.approx(0.05)
    assert (shifted["ci_lo"], shifted["ci_hi"]) == pytest.approx((0.05, 0.05))
    # Five pairs: the sign-flip test's smallest p is 2/32 > 0.05, so no mark, however clear.
    assert (shifted["test"], shifted["p_value"]) == ("signflip", pytest.approx(2 / 32))
    assert not shifted["reachable"] and not shifted["significant"] and shifted["better"]
    by_t = _one(
        paired_differences(records_to_frame(recs), "deep_ensemble", ["acc"], test="t"),
        method="better",
    )
    assert by_t["reachable"] and by_t["significant"] and by_t["p_value"] == 0.0
    assert (shifted["n_pairs"], shifted["seeds"]) == (5, "0, 1, 2, 3, 4")
    assert shifted["reference"] == "deep_ensemble M=4"
    same = _one(out, method="same", metric="acc")
    assert (same["mean_diff"], same["ci_lo"], same["ci_hi"]) == (0.0, 0.0, 0.0)
    assert not same["significant"] and not same["better"]
    assert list(out.columns) == list(stats.COLUMNS)
    assert not (out["method"] == "deep_ensemble").any()  # the reference is not compared with itself


def test_seeds_present_on_one_side_only_are_left_out():
    cells = _cells(
        [{"method": "ref", "M": 4, "seed": s, "acc": 0.8} for s in (0, 1, 2, 7)]
        + [{"method": "x", "M": 4, "seed": s, "acc": 0.8 + 0.01 * s} for s in range(5)]
    )
    row = _one(paired_differences(cells, "ref", ["acc"]), method="x")
    assert (row["n_pairs"], row["seeds"]) == (3, "0, 1, 2")
    assert row["mean_diff"] == pytest.approx(0.01)  # (0 + 0.01 + 0.02) / 3


def test_m_matching_prefers_same_m_and_pairs_each_reference_otherwise():
    rows = [
        {"method": "ref", "M": m, "seed": s, "acc": 0.8 + 0.01 * m} for m in (2, 4) for s in (0, 1)
    ]
    rows += [{"method": "x", "M": m, "seed": s, "acc": 0.9} for m in (2, 4, 8) for s in (0, 1)]
    out = paired_differences(_cells(rows), "ref", ["acc"])
    assert _one(out, M=2)["reference"] == "ref M=2"
    assert _one(out, M=2)["mean_diff"] == pytest.approx(0.9 - 0.82)
    assert _one(out, M=4)["reference"] == "ref M=4"
    at8 = out[out["M"] == 8]  # no ref at M=8: paired with each ref M separately, named
    assert list(at8["reference"]) == ["ref M=2", "ref M=4"]
    assert list(at8["reference_M"]) == [2, 4]
    assert at8["mean_diff"].to_list() == pytest.approx([0.9 - 0.82, 0.9 - 0.84])


def test_single_at_m1_is_the_reference_of_m4_methods():
    rows = [{"method": "single", "M": 1, "seed": s, "nll": 0.60} for s in range(4)]
    rows += [{"method": "deep_ensemble", "M": 4, "seed": s, "nll": 0.45} for s in range(4)]
    rows += [
        {"method": "sigma_ens", "M": 4, "hparams": f"tau={t}", "seed": s, "nll": 0.50}
        for t in (0.1, 1)
        for s in range(4)
    ]
    out = paired_differences(_cells(rows), "single", ["nll"], test="t")
    assert set(out["reference"]) == {"single M=1"} and len(out) == 3
    de = _one(out, method="deep_ensemble")
    assert de["mean_diff"] == pytest.approx(-0.15) and de["M"] == 4
    assert de["significant"] and de["better"]  # lower NLL is better
    assert list(out["hparams"]) == ["", "tau=0.1", "tau=1"]


def test_direction_decides_better():
    rows = [
        {"method": "ref", "M": 4, "seed": s, "acc": 0.8, "nll": 0.5, "k_eff": 2.0}
        for s in (0, 1, 2)
    ]
    rows += [
        {"method": "x", "M": 4, "seed": s, "acc": 0.7, "nll": 0.4, "k_eff": 3.0} for s in (0, 1, 2)
    ]
    out = paired_differences(_cells(rows), "ref", ["acc", "nll", "k_eff"], test="t")
    out = out.set_index("metric")
    assert out.loc["nll", "mean_diff"] == pytest.approx(-0.1) and out.loc["nll", "better"]
    assert out.loc["acc", "mean_diff"] == pytest.approx(-0.1) and not out.loc["acc", "better"]
    assert out.loc[["acc", "nll", "k_eff"], "significant"].all()
    assert pd.isna(out.loc["k_eff", "better"])  # a diagnostic has no better direction


def test_never_pairs_across_dataset_backbone_or_variant():
    rows = [{"method": "ref", "M": 4, "seed": 0, "backbone": "cnn"}]
    rows += [{"method": "ref", "M": 4, "seed": 0, "variant": "recipe.epochs=50"}]
    rows += [{"method": "ref", "M": 4, "seed": 0, "dataset": "cifar10"}]
    rows += [{"method": "x", "M": 4, "seed": 0, "acc": 0.9}]
    assert paired_differences(_cells(rows), "ref", ["acc"]).empty
    rows.append({"method": "ref", "M": 4, "seed": 0})
    assert len(paired_differences(_cells(rows), "ref", ["acc"])) == 1


def test_nan_failed_and_duplicate_cells():
    rows = [{"method": "ref", "M": 4, "seed": s, "acc": 0.8, "nll": 0.5} for s in range(3)]
    rows += [
        {"method": "x", "M": 4, "seed": 0, "acc": 0.9, "nll": float("nan")},  # diverged NLL
        {"method": "x", "M": 4, "seed": 1, "acc": 0.9, "nll": 0.4},
        {"method": "x", "M": 4, "seed": 2, "acc": 0.84, "nll": 0.4},
        {"method": "x", "M": 4, "seed": 2, "acc": 0.86, "nll": 0.4},  # same seed twice: averaged
        {"method": "x", "M": 4, "seed": 3, "acc": 0.1, "status": "failed"},
    ]
    out = paired_differences(_cells(rows), "ref", ["acc", "nll"]).set_index("metric")
    assert (out.loc["acc", "n_pairs"], out.loc["acc", "seeds"]) == (3, "0, 1, 2")
    assert out.loc["acc", "mean_diff"] == pytest.approx((0.1 + 0.1 + 0.05) / 3)
    assert (out.loc["nll", "n_pairs"], out.loc["nll", "seeds"]) == (2, "1, 2")


def test_rounding_level_differences_are_zero():
    rows = [{"method": "ref", "M": 4, "seed": s, "acc": 0.70 + 0.12} for s in range(4)]
    rows += [{"method": "x", "M": 4, "seed": s, "acc": 0.80 + 0.02} for s in range(4)]
    assert 0.70 + 0.12 != 0.80 + 0.02  # the same number, computed two ways
    row = _one(paired_differences(_cells(rows), "ref", ["acc"]), method="x")
    assert (row["mean_diff"], row["ci_lo"], row["ci_hi"]) == (0.0, 0.0, 0.0)
    assert not row["significant"]


def test_one_pair_is_never_significant():
    rows = [{"method": "ref", "M": 4, "seed": 0}, {"method": "x", "M": 4, "seed": 0, "acc": 0.9}]
    row = _one(paired_differences(_cells(rows), "ref", ["acc"]), method="x")
    assert row["n_pairs"] == 1 and row["mean_diff"] == pytest.approx(0.1)
    assert math.isnan(row["ci_lo"]) and not row["significant"] and row["better"]


def test_default_metrics_and_reference():
    recs = [
        make_record(method=m, M=M, seed=s, ood_sets=("svhn", "textures"))
        for m, M in (("single", 1), ("deep_ensemble", 4), ("sigma_ens", 4))
        for s in (0, 1)
    ]
    cells = records_to_frame(recs)
    assert default_metrics(cells) == [
        "acc",
        "nll",
        "ece",
        "brier",
        "cAcc",
        "cECE",
        "ood/svhn/msp/auroc",
        "ood/textures/msp/auroc",
    ]
    assert set(paired_differences(cells, "deep_ensemble")["metric"]) == set(default_metrics(cells))
    no_corruption = records_to_frame([make_record(corruption=False, ood_sets=())])
    assert default_metrics(no_corruption) == ["acc", "nll", "ece", "brier"]
    assert default_reference(cells) == "deep_ensemble"
    assert default_reference(cells[cells["method"] != "deep_ensemble"]) == "single"
    assert default_reference(cells[cells["method"] == "sigma_ens"]) is None


def test_paired_differences_rejects_bad_input():
    cells = _cells([{"method": "ref", "M": 4, "seed": 0}])
    with pytest.raises(ValueError, match="metric column\\(s\\) not in cells: cNLL"):
        paired_differences(cells, "ref", ["acc", "cNLL"])
    with pytest.raises(ValueError, match="cells has no 'seed' column"):
        paired_differences(cells.drop(columns="seed"), "ref", ["acc"])
    empty = paired_differences(cells, "absent", ["acc"])
    assert empty.empty and list(empty.columns) == list(stats.COLUMNS)


def test_reference_configuration_compares_within_one_method():
    """``sigma_ens:lam=0.001`` pairs the other λ values of σN-Ens with that one (λ claim)."""
    rows = []
    for lam, shift in ((0.0001, 0.0), (0.001, 0.0), (0.01, 0.03)):
        for s in range(5):
            rows.append(
                {
                    "method": "sigma_ens",
                    "M": 4,
                    "seed": s,
                    "hparams": f"lam={lam}",
                    "hp_lam": lam,
                    "acc": 0.8 + shift + 0.001 * s,
                }
            )
    out = paired_differences(_cells(rows), "sigma_ens:lam=1e-3", ["acc"], test="t")
    assert sorted(out["hparams"]) == ["lam=0.0001", "lam=0.01"]
    by = out.set_index("hparams")
    assert by.loc["lam=0.0001", "mean_diff"] == 0 and not by.loc["lam=0.0001", "significant"]
    assert by.loc["lam=0.01", "mean_diff"] == pytest.approx(0.03)
    assert by.loc["lam=0.01", "significant"]
    assert set(out["reference"]) == {"sigma_ens M=4 (lam=0.001)"}
    with pytest.raises(ValueError, match=r"expected method:key=value"):
        paired_differences(_cells(rows), "sigma_ens:lam", ["acc"])


def test_signflip_marks_from_six_pairs_and_holm_across_the_table():
    rows = [{"method": "ref", "M": 4, "seed": s, "acc": 0.8, "nll": 0.5} for s in range(6)]
    rows += [
        {"method": "x", "M": 4, "seed": s, "acc": 0.81 + 0.001 * s, "nll": 0.5 + 0.02 * (-1) ** s}
        for s in range(6)
    ]
    out = paired_differences(_cells(rows), "ref", ["acc", "nll"]).set_index("metric")
    assert out.loc["acc", "p_value"] == pytest.approx(2 / 64) and out.loc["acc", "significant"]
    assert out.loc["nll", "p_value"] == 1.0 and not out.loc["nll", "significant"]
    # Holm over the two comparisons: 2/64 × 2 = 0.0625 > 0.05, so the mark goes.
    adj = paired_differences(_cells(rows), "ref", ["acc", "nll"], holm_adjust=True)
    adj = adj.set_index("metric")
    assert adj.loc["acc", "p_adjusted"] == pytest.approx(4 / 64)
    assert adj.loc["acc", "p_value"] == pytest.approx(2 / 64) and not adj.loc["acc", "significant"]
    with pytest.raises(ValueError, match="unknown test 'z'"):
        paired_differences(_cells(rows), "ref", ["acc"], test="z")
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\), got 5"):
        paired_differences(_cells(rows), "ref", ["acc"], alpha=5)
