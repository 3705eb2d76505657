"""The seeds × images bootstrap (reports/stats/bootstrap.py) against a brute-force enumeration of
every resample of a tiny fabricated case, and against the paired t-interval when the images
contribute nothing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from reports.stats.bootstrap import bootstrap_rows, paired_bootstrap


def _ece(conf: np.ndarray, correct: np.ndarray) -> float:
    """15 equal-width bins (b/15, (b+1)/15], written out independently of the module."""
    total = 0.0
    for b in range(15):
        lo, hi = b / 15, (b + 1) / 15
        inside = [(c, k) for c, k in zip(conf, correct) if (lo < c <= hi) or (b == 0 and c == 0)]
        if inside:
            total += abs(sum(c for c, _ in inside) - sum(k for _, k in inside)) / len(conf)
    return total


def _metric(outcomes: dict, metric: str, idx: list[int]) -> float:
    if metric == "acc":
        return float(np.mean(outcomes["correct"][idx]))
    if metric == "nll":
        return float(np.mean(outcomes["nll"][idx]))
    return _ece(outcomes["confidence"][idx], outcomes["correct"][idx].astype(float))


def _exact_se(config, reference, metric: str) -> float:
    """Every (seed draw, image draw) of the pigeonhole bootstrap, equally likely: the exact
    variance of its statistic, times n/(n − 1)."""
    n, n_images = len(config), len(config[0]["nll"])
    values = []
    for seeds in itertools.product(range(n), repeat=n):
        for images in itertools.product(range(n_images), repeat=n_images):
            idx = list(images)
            diffs = [_metric(config[s], metric, idx) - _metric(reference[s], metric, idx)
                     for s in seeds]  # fmt: skip
            values.append(np.mean(diffs))
    return float(np.sqrt(np.var(values) * n / (n - 1)))


def _cell(rng: np.random.Generator, n_images: int) -> dict:
    return {
        "correct": rng.random(n_images) < 0.6,
        "nll": rng.exponential(0.5, n_images).astype(np.float32),
        "confidence": rng.uniform(0.3, 1.0, n_images).astype(np.float32),
    }


@pytest.mark.parametrize("metric", ["acc", "nll", "ece"])
def test_standard_error_matches_brute_force_enumeration(metric):
    rng = np.random.default_rng(3)
    config = [_cell(rng, 4) for _ in range(2)]
    reference = [_cell(rng, 4) for _ in range(2)]
    exact = _exact_se(config, reference, metric)
    assert exact > 0
    got = paired_bootstrap(config, reference, metric, 0.0, replicates=100_000, seed=1)
    # Monte Carlo error of an SD from B draws: about 1/√(2B) ≈ 0.2%; 2% is far outside it.
    assert got.se == pytest.approx(exact, rel=0.02)
    assert got.n_images == 4 and got.replicates == 100_000
    t = stats.t.ppf(0.975, 1)
    assert (got.ci_lo, got.ci_hi) == pytest.approx((-t * got.se, t * got.se))
    assert got.p_value == pytest.approx(1.0)


def test_equals_the_paired_t_interval_when_images_add_nothing():
    """Each seed's difference the same on every image: only the seeds vary, and the interval is
    the paired t-interval (mean ± t·s/√n) up to the bootstrap's Monte Carlo error."""
    shifts = np.array([0.010, 0.030, -0.005, 0.020, 0.015])  # per-seed NLL differences
    base = np.random.default_rng(0).exponential(0.4, 200)
    config = [{"nll": base + d, "correct": np.ones(200, bool)} for d in shifts]
    reference = [{"nll": base.copy(), "correct": np.ones(200, bool)} for _ in shifts]
    mean = float(shifts.mean())
    got = paired_bootstrap(config, reference, "nll", mean, replicates=40_000, seed=2)
    s = shifts.std(ddof=1) / np.sqrt(len(shifts))
    assert got.se == pytest.approx(s, rel=0.02)
    t = stats.t.ppf(0.975, len(shifts) - 1)
    assert got.ci_lo == pytest.approx(mean - t * s, rel=0.05)
    assert got.p_value == pytest.approx(2 * stats.t.sf(mean / s, len(shifts) - 1), rel=0.1)


def test_image_sampling_widens_the_interval_beyond_the_seeds():
    """Identical seeds (no seed noise at all) still leave the test set's sampling: the SE is the
    SD of the per-image differences over √N, as for a mean of N independent images."""
    rng = np.random.default_rng(5)
    d = rng.normal(0.01, 0.2, 1000)
    base = rng.exponential(0.4, 1000)
    config = [{"nll": base + d, "correct": np.ones(1000, bool)}] * 3
    reference = [{"nll": base, "correct": np.ones(1000, bool)}] * 3
    got = paired_bootstrap(config, reference, "nll", float(d.mean()), replicates=20_000)
    assert got.se == pytest.approx(d.std() / np.sqrt(1000) * np.sqrt(3 / 2), rel=0.03)


def test_rows_say_why_they_have_no_bootstrap():
    rng = np.random.default_rng(1)
    cells = [_cell(rng, 50) for _ in range(4)]
    rows = [
        {"metric": "acc", "mean_diff": 0.01},
        {"metric": "ood/x/msp/auroc", "mean_diff": 0.01},
        {"metric": "nll", "mean_diff": 0.01},
        {"metric": "ts/nll", "mean_diff": 0.01},  # the fabricated cells have no ts/ arrays
    ]

    def outcomes_of(row, reference):
        if row["metric"] == "nll" and reference:
            return [cells[2], None]
        return cells[2:] if reference else cells[:2]

    out = bootstrap_rows(rows, outcomes_of, replicates=200)
    assert out[0]["boot_note"] == "" and out[0]["n_images"] == 50 and out[0]["boot_se"] > 0
    assert out[1]["boot_note"] == "not a per-image metric" and np.isnan(out[1]["boot_se"])
    assert out[2]["boot_note"] == "a cell has no outcomes.npz"
    assert "ts/" in out[3]["boot_note"] and np.isnan(out[3]["boot_p"])


def test_refuses_a_single_seed_and_mismatched_test_sets():
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="at least two"):
        paired_bootstrap([_cell(rng, 5)], [_cell(rng, 5)], "acc", 0.0)
    with pytest.raises(ValueError, match="different numbers of test images"):
        paired_bootstrap([_cell(rng, 5)] * 2, [_cell(rng, 6)] * 2, "acc", 0.0)
    with pytest.raises(ValueError, match="per-image"):
        paired_bootstrap([_cell(rng, 5)] * 2, [_cell(rng, 5)] * 2, "aurc", 0.0)
