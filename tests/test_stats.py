"""Paired statistics: the bootstrap against cases with a known answer, and the pairing rules."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pandas as pd
import pytest
from record_factory import make_record

from reports import stats
from reports.aggregate import records_to_frame
from reports.stats import bootstrap_ci, default_metrics, default_reference, paired_differences

# --- bootstrap_ci -------------------------------------------------------------------------------


def test_identical_methods_give_zero_interval():
    a = np.array([0.81, 0.84, 0.79, 0.86, 0.83, 0.80])
    assert bootstrap_ci(a - a) == (0.0, 0.0, 0.0)  # covers zero, exactly [0, 0]


@pytest.mark.parametrize("n", [2, 5, 10, 30])
def test_constant_shift_excludes_zero(n):
    mean, lo, hi = bootstrap_ci(np.full(n, 0.05))
    assert (mean, lo, hi) == (0.05, 0.05, 0.05)
    assert lo > 0


def _noise(seed: int, n: int, sd: float) -> np.ndarray:
    """Seeded normal noise with sample mean exactly 0: the known answer does not hang on luck."""
    z = np.random.default_rng(seed).normal(0.0, sd, size=n)
    return z - z.mean()


def test_noisy_shift_contains_true_mean_and_excludes_zero():
    diffs = 0.05 + _noise(7, 30, 0.02)
    mean, lo, hi = bootstrap_ci(diffs)
    assert mean == pytest.approx(0.05, abs=1e-15)
    assert lo < 0.05 < hi and lo > 0
    # Width near the normal-theory 2 · 1.96 · s / √n (the percentile bootstrap is a bit narrower).
    normal = 2 * 1.96 * diffs.std(ddof=1) / math.sqrt(len(diffs))
    assert 0.8 * normal < hi - lo < 1.1 * normal


def test_noise_without_shift_covers_zero():
    for seed in range(5):
        mean, lo, hi = bootstrap_ci(_noise(seed, 10, 0.02), seed=seed)
        assert lo < 0 < hi and mean == pytest.approx(0, abs=1e-15)


def test_coverage_is_near_nominal():
    """Over 300 seeded data sets of 20 normal differences, ~95% of intervals hold the mean."""
    rng = np.random.default_rng(11)
    hits = 0
    for i in range(300):
        _, lo, hi = bootstrap_ci(rng.normal(0.3, 1.0, size=20), n_resamples=2000, seed=i)
        hits += lo <= 0.3 <= hi
    assert 0.88 <= hits / 300 <= 0.98, hits


def test_one_pair_has_no_interval_and_none_gives_nan():
    mean, lo, hi = bootstrap_ci(np.array([0.03]))
    assert mean == 0.03 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(v) for v in bootstrap_ci(np.array([])))


def test_deterministic_in_its_seed_and_nested_in_its_level():
    diffs = np.random.default_rng(5).normal(0.01, 0.03, size=12)
    assert bootstrap_ci(diffs, seed=4) == bootstrap_ci(diffs, seed=4)
    other = bootstrap_ci(diffs, seed=5)
    assert other != bootstrap_ci(diffs, seed=4)
    assert other == pytest.approx(bootstrap_ci(diffs, seed=4), abs=2e-3)  # Monte Carlo error only
    _, lo95, hi95 = bootstrap_ci(diffs, level=0.95)
    _, lo50, hi50 = bootstrap_ci(diffs, level=0.5)
    assert lo95 < lo50 < hi50 < hi95


def test_matches_scipy_percentile_bootstrap(monkeypatch):
    """Same draws as scipy.stats.bootstrap(method="percentile") for the same Generator."""
    scipy_stats = pytest.importorskip("scipy.stats")
    if "rng" not in inspect.signature(scipy_stats.bootstrap).parameters:
        pytest.skip("scipy < 1.15 has no rng argument")
    diffs = np.random.default_rng(1).normal(0.05, 0.02, size=7)

    def scipy_ci(**kw):
        res = scipy_stats.bootstrap(
            (diffs,),
            np.mean,
            method="percentile",
            n_resamples=3000,
            confidence_level=0.9,
            rng=np.random.default_rng(2),
            **kw,
        )
        return res.confidence_interval.low, res.confidence_interval.high

    ours = bootstrap_ci(diffs, n_resamples=3000, level=0.9, seed=2)[1:]
    assert ours == pytest.approx(scipy_ci(), rel=1e-12)
    monkeypatch.setattr(stats, "_MAX_DRAWS", 7 * 400)  # batches of 400 resamples
    batched = bootstrap_ci(diffs, n_resamples=3000, level=0.9, seed=2)[1:]
    assert batched == pytest.approx(scipy_ci(batch=400), rel=1e-12)


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN or inf"):
        bootstrap_ci(np.array([0.1, float("nan"), 0.2]))
    with pytest.raises(ValueError, match="one-dimensional"):
        bootstrap_ci(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        bootstrap_ci(np.zeros(3), level=95)
    with pytest.raises(ValueError, match="n_resamples must be a positive int"):
        bootstrap_ci(np.zeros(3), n_resamples=0)


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
    assert shifted["significant"] and shifted["better"]
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
    out = paired_differences(_cells(rows), "single", ["nll"])
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
    out = paired_differences(_cells(rows), "ref", ["acc", "nll", "k_eff"]).set_index("metric")
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
    out = paired_differences(_cells(rows), "sigma_ens:lam=1e-3", ["acc"])
    assert sorted(out["hparams"]) == ["lam=0.0001", "lam=0.01"]
    by = out.set_index("hparams")
    assert by.loc["lam=0.0001", "mean_diff"] == 0 and not by.loc["lam=0.0001", "significant"]
    assert by.loc["lam=0.01", "mean_diff"] == pytest.approx(0.03)
    assert by.loc["lam=0.01", "significant"]
    assert set(out["reference"]) == {"sigma_ens M=4 (lam=0.001)"}
    with pytest.raises(ValueError, match=r"expected method:key=value"):
        paired_differences(_cells(rows), "sigma_ens:lam", ["acc"])
