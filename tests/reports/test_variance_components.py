"""The seeds × images interval (reports/stats/variance.py, issue 59 item 1) on simulated crossed
designs d_ij = δ + a_i + b_j + e_ij with known σ_A, σ_B, σ_E: V̂ unbiased for Var(d̄) within 5%
and its 95% interval covering δ 93–97% of the time, at R ∈ {4, 6, 10} seeds and C ∈ {10³, 10⁴}
images; the degenerate designs (σ_A = 0, σ_B = 0, one seed, V̂ = 0) with defined outputs; the
former pigeonhole bootstrap's over-count of the interaction, as derived; the ECE's linearisation.

Every simulation is one vectorised array operation per chunk, with fixed seeds; the counts are
chosen so that each mean's Monte Carlo error is asserted well under the 5% it is checked at."""

from __future__ import annotations

import numpy as np
import pytest

from reports.stats.bootstrap import bootstrap_rows, crossed_row, paired_bootstrap
from reports.stats.variance import (
    crossed_interval,
    ece_influence,
    naive_bootstrap_variance,
    variance_components,
)

DELTA = 0.01

#: (σ_A, σ_B, σ_E). "records" is T7's σN-Ens-free comparison, deep ensemble − single accuracy,
#: as its records estimate it (docs/results/claims_fmnist_tuned_lr: σ̂_A 0.0013, σ̂_B 0.052,
#: σ̂_E 0.18 per image): the interaction dominates. "seeds" gives the seeds a real share.
SETTINGS = {
    "records": (0.0013, 0.052, 0.18),
    "seeds": (0.01, 0.05, 0.25),
    "no seed effect": (0.0, 0.05, 0.25),
    "no image effect": (0.003, 0.0, 0.25),
}


def _designs(rng: np.random.Generator, n: int, r: int, c: int, sigmas) -> np.ndarray:
    """``(n, r, c)`` independent crossed designs (float32 draws: half the time, and the
    statistics are computed in float64 by the module)."""
    s_a, s_b, s_e = sigmas
    d = rng.standard_normal((n, r, c), dtype=np.float32) * np.float32(s_e)
    d += rng.standard_normal((n, r, 1), dtype=np.float32) * np.float32(s_a)
    d += rng.standard_normal((n, 1, c), dtype=np.float32) * np.float32(s_b)
    return d + np.float32(DELTA)


def _simulate(seed: int, n: int, r: int, c: int, sigmas, chunk: int = 100):
    """V̂, coverage of δ and the naive bootstrap's variance over ``n`` designs."""
    rng = np.random.default_rng(seed)
    var, covered, naive = [], [], []
    for lo in range(0, n, chunk):
        d = _designs(rng, min(chunk, n - lo), r, c, sigmas)
        got = crossed_interval(d)
        var.append(got.se**2)
        covered.append((got.lo <= DELTA) & (got.hi >= DELTA))
        naive.append(naive_bootstrap_variance(d))
    return np.concatenate(var), np.concatenate(covered), np.concatenate(naive)


def _true_variance(r: int, c: int, sigmas) -> float:
    s_a, s_b, s_e = sigmas
    return s_a**2 / r + s_b**2 / c + s_e**2 / (r * c)


#: Designs per R at C = 1,000: enough for a Monte Carlo error of V̂'s mean ≤ 1.5% (its spread
#: is the seeds' χ²_{R−1}, widest at R = 4) and of the coverage ≤ 0.55 points.
N_SIMS = {4: 4000, 6: 3000, 10: 2000}


@pytest.mark.parametrize("r", [4, 6, 10])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_unbiased_and_covering_at_a_thousand_images(r, setting):
    sigmas, c = SETTINGS[setting], 1000
    var, covered, _ = _simulate(r, N_SIMS[r], r, c, sigmas)
    truth = _true_variance(r, c, sigmas)
    mc_error = var.std() / np.sqrt(len(var)) / truth
    assert mc_error < 0.015  # the 5% below is more than three Monte Carlo errors
    assert var.mean() / truth == pytest.approx(1.0, abs=0.05)
    assert np.sqrt(covered.mean() * (1 - covered.mean()) / len(covered)) < 0.0055
    assert 0.93 <= covered.mean() <= 0.97


@pytest.mark.parametrize("r", [4, 6, 10])
def test_unbiased_and_covering_at_ten_thousand_images(r):
    """C = 10⁴ (the Fashion-MNIST test set): fewer designs, in a setting where the images carry
    most of the variance (so V̂'s own spread, and the Monte Carlo error, are small)."""
    sigmas, c = (0.003, 0.2, 0.1), 10_000
    var, covered, _ = _simulate(100 + r, 400, r, c, sigmas, chunk=20)
    truth = _true_variance(r, c, sigmas)
    assert var.std() / np.sqrt(len(var)) / truth < 0.017
    assert var.mean() / truth == pytest.approx(1.0, abs=0.05)
    # 400 designs: the coverage's Monte Carlo error is 1.1 points, so a wider band than 93–97.
    assert 0.925 <= covered.mean() <= 0.975


def test_the_former_bootstrap_counts_the_interaction_three_times_and_more():
    """Its expectation ≈ σ_A²/R + σ_B²/C · R/(R−1) + σ_E²/(RC) · (3R−2)/(R−1): with the
    interaction alone, (3R−2)/(R−1) = 3.33 at R = 4 and 3.2 at R = 6 (up to (C−1)/C terms),
    while V̂ counts it once; with the image effect alone, R/(R−1)."""
    c = 1000
    for r in (4, 6):
        exact = 1 + r / (r - 1) * (c - 1) / c + (c - 1) / c  # finite-C expectation
        var, _, naive = _simulate(r, 2000, r, c, (0.0, 0.0, 1.0))
        unit = 1.0 / (r * c)
        assert naive.mean() / unit == pytest.approx(exact, rel=0.02)
        assert naive.mean() / unit == pytest.approx((3 * r - 2) / (r - 1), rel=0.02)
        assert var.mean() / unit == pytest.approx(1.0, rel=0.02)
    _, _, naive = _simulate(7, 1000, 4, c, (0.0, 1.0, 1e-6))
    assert naive.mean() / (1.0 / c) == pytest.approx(4 / 3, rel=0.05)


def test_the_closed_form_is_what_the_former_bootstrap_computed():
    """naive_bootstrap_variance is paired_bootstrap's SE² as B → ∞ (here B = 40,000 on a small
    fabricated design: its Monte Carlo error is about 0.7% of the variance)."""
    rng = np.random.default_rng(11)
    d = rng.normal(0.0, 0.3, (3, 40)) + rng.normal(0.0, 0.1, (3, 1))
    base = rng.exponential(0.4, 40)
    config = [{"nll": base + row, "correct": np.ones(40, bool)} for row in d]
    reference = [{"nll": base.copy(), "correct": np.ones(40, bool)} for _ in d]
    got = paired_bootstrap(config, reference, "nll", float(d.mean()), replicates=40_000, seed=3)
    assert got.se**2 == pytest.approx(float(naive_bootstrap_variance(d)), rel=0.03)


def test_images_that_add_nothing_give_the_paired_t_interval():
    """Each seed's difference the same on every image: s²_cols = 0, the image term is cut, and
    the interval is the paired t-interval exactly (df = R − 1)."""
    from reports.stats.significance import t_interval, t_pvalue

    shifts = np.array([0.010, 0.030, -0.005, 0.020, 0.015])
    d = np.repeat(shifts[:, None], 500, axis=1)
    got = crossed_interval(d)
    _, lo, hi = t_interval(shifts)
    assert float(got.df) == pytest.approx(4.0)
    assert (float(got.lo), float(got.hi)) == pytest.approx((float(lo), float(hi)), rel=1e-9)
    assert float(got.p_value) == pytest.approx(float(t_pvalue(shifts)), rel=1e-9)
    assert float(got.se) == pytest.approx(shifts.std(ddof=1) / np.sqrt(5), rel=1e-9)


def test_no_spread_gives_a_zero_width_interval():
    """V̂ = 0 (every seed and image give one difference): the interval is that difference, the
    p-value 1 at 0 and 0 elsewhere, and df undefined."""
    zero = crossed_interval(np.zeros((6, 100)))
    assert (float(zero.se), float(zero.lo), float(zero.hi)) == (0.0, 0.0, 0.0)
    assert float(zero.p_value) == 1.0 and np.isnan(zero.df)
    shifted = crossed_interval(np.full((6, 100), 0.25), centre=0.25)
    assert (float(shifted.lo), float(shifted.hi), float(shifted.p_value)) == (0.25, 0.25, 0.0)


def test_one_seed_has_no_interval_and_says_what_can_be_estimated():
    rng = np.random.default_rng(4)
    d = rng.normal(0.01, 0.2, (1, 400))
    got = crossed_interval(d)
    assert np.isnan(got.se) and np.isnan(got.lo) and np.isnan(got.p_value) and np.isnan(got.df)
    row = crossed_row(d, 0.01)
    assert np.isnan(row["boot_se"]) and np.isnan(row["df"]) and row["n_images"] == 400
    assert row["boot_note"].startswith("one seed: the seed-to-seed variance cannot be estimated")
    assert f"SE {d.std(ddof=1) / 20:.3g}" in row["boot_note"]
    one_image = crossed_row(rng.normal(size=(4, 1)), 0.0)
    assert one_image["boot_note"] == "one test image: the images' variance cannot be estimated"
    with pytest.raises(ValueError, match="level must be in"):
        crossed_interval(d, level=95)


def test_rows_carry_df_and_the_former_names():
    rng = np.random.default_rng(5)
    cells = [{"correct": rng.random(300) < 0.8, "nll": rng.exponential(0.4, 300)}
             for _ in range(6)]  # fmt: skip
    rows = [{"metric": "nll", "mean_diff": 0.0}, {"metric": "acc", "mean_diff": 0.0}]
    out = bootstrap_rows(rows, lambda row, reference: cells[3:] if reference else cells[:3])
    for got in out:
        assert set(got) == {"boot_se", "boot_lo", "boot_hi", "boot_p", "df", "n_images",
                            "boot_note"}  # fmt: skip
        assert got["boot_note"] == "" and got["n_images"] == 300 and got["df"] >= 2.0
    single = bootstrap_rows(rows[:1], lambda row, reference: cells[1:2] if reference else cells[:1])
    assert single[0]["boot_note"].startswith("one seed")


def _ece(confidence: np.ndarray, correct: np.ndarray) -> float:
    """15 equal-width bins (b/15, (b+1)/15], written out independently of the module."""
    total = 0.0
    for b in range(15):
        inside = ((confidence > b / 15) & (confidence <= (b + 1) / 15)) | (
            (b == 0) & (confidence == 0)
        )
        total += abs(confidence[inside].sum() - correct[inside].sum())
    return total / len(confidence)


def test_the_ece_values_average_to_the_ece_exactly():
    rng = np.random.default_rng(6)
    confidence = rng.uniform(0.2, 1.0, (5, 700))
    correct = (rng.random((5, 700)) < confidence**1.3).astype(float)
    confidence[0, :3] = [0.0, 1 / 15, 1.0]  # the edges go to the lower bin
    u = ece_influence(confidence, correct)
    assert u.shape == (5, 700)
    for row in range(5):
        assert u[row].mean() == pytest.approx(_ece(confidence[row], correct[row]), abs=1e-12)


def _ece_experiments(rng: np.random.Generator, n: int, r: int, c: int, temps):
    """``(n,)`` estimates and their intervals of ECE(config) − ECE(reference) over ``n``
    independent experiments, each R seeds × C fresh test images: image difficulty and luck
    shared by every seed and both sides, a seed shift, a seed × image jitter; each side's
    confidence is the true probability sharpened by its inverse temperature."""
    z = rng.normal(2.0, 1.5, (n, 1, c))
    luck = rng.random((n, 1, c))
    u = []
    for inverse_temperature in temps:
        logit = z + rng.normal(0, 0.15, (n, r, 1)) + rng.normal(0, 0.7, (n, r, c))
        correct = luck < 1 / (1 + np.exp(-logit))
        u.append(ece_influence(1 / (1 + np.exp(-inverse_temperature * logit)), correct))
    d = u[0] - u[1]
    return variance_components(d), crossed_interval(d)


@pytest.mark.parametrize(
    ("temps", "name"), [((0.8, 1.5), "under- against over-confident"), ((1.0, 1.1), "near")]
)
def test_the_ece_interval_is_unbiased_and_covers(temps, name):
    """The ECE's variance from its linearisation against the estimator's own variance over 6,000
    simulated experiments (R = 6 seeds, C = 500 images), and its 95% interval's coverage of the
    estimator's mean (the ECE is biased upward at finite C, on both sides; the interval is for
    the difference of what is computed). Near calibration the bins' signs flip from seed to
    seed, where the linearisation errs wide. The band is 10%, not 5%: the empirical variance of
    6,000 ECE differences has a Monte Carlo error of about 2.5% (they are not normal), and
    across seeds of this simulation the ratio ranged 0.94–1.08."""
    rng = np.random.default_rng(12)
    estimates, variances, los, his = [], [], [], []
    for _ in range(12):
        comp, got = _ece_experiments(rng, 500, 6, 500, temps)
        estimates.append(comp.mean), variances.append(comp.var), los.append(got.lo)
        his.append(got.hi)
    est, var, lo, hi = (np.concatenate(x) for x in (estimates, variances, los, his))
    assert var.mean() / est.var(ddof=1) == pytest.approx(1.0, abs=0.10), name
    centre = est.mean()
    assert 0.93 <= np.mean((lo <= centre) & (centre <= hi)) <= 0.97, name
