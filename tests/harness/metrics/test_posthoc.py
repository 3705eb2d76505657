"""Post-hoc calibration: temperature scaling against an independent fit, and conformal sets on a
fabricated exchangeable case whose coverage is known (the finite-sample guarantee, the fallback's
effect apart)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax as np_log_softmax

from harness.metrics import accuracy, ece, nll
from harness.metrics.posthoc import (
    PosthocCalibration,
    SetAccumulator,
    fit_temperature,
    pooled_logits,
)


def _synthetic(
    n: int, k: int, seed: int, sharpen: float = 3.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a model that is right ~70% of the time, over-confident by ``sharpen``."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += 1.5
    return z * sharpen, y


def _scipy_temperature(z: torch.Tensor, y: torch.Tensor) -> float:
    """The independent fit: the NLL minimised over log T by scipy's bounded Brent search."""
    zz, yy = z.numpy(), y.numpy()

    def loss(log_t: float) -> float:
        return float(-np_log_softmax(zz / math.exp(log_t), axis=1)[np.arange(len(yy)), yy].mean())

    res = minimize_scalar(loss, bounds=(-6, 6), method="bounded", options={"xatol": 1e-10})
    return math.exp(res.x)


@pytest.mark.parametrize("sharpen", [0.4, 1.0, 3.0])
def test_temperature_matches_an_independent_fit(sharpen):
    z, y = _synthetic(3000, 10, seed=1, sharpen=sharpen)
    ours = fit_temperature(z, y)
    ref = _scipy_temperature(z, y)
    assert ours == pytest.approx(ref, rel=1e-3)
    # the direction is right: an over-confident model is cooled (T > 1), an under-confident one
    # sharpened (T < 1)
    assert (ours > 1) == (sharpen > 1.2) or sharpen == 1.0


def test_scaling_an_overconfident_ensemble_lowers_ece_and_nll_and_keeps_accuracy():
    z, y = _synthetic(4000, 10, seed=2, sharpen=3.0)
    # four members: the same logits plus member noise, as (M, N, K) probabilities
    g = torch.Generator().manual_seed(3)
    members = torch.stack([z + 0.3 * torch.randn(z.shape, generator=g, dtype=z.dtype)] * 4)
    probs = members.softmax(-1).float()  # float32, as the evaluator yields them
    cal, test = slice(0, 2000), slice(2000, None)
    post = PosthocCalibration.fit(probs[:, cal], y[cal], members=True)
    assert post.temperature > 1.5  # cooled
    raw = probs[:, test]
    scaled = post.scaled(raw)
    ts = scaled["ts"]  # (1, B, K)
    assert ts.shape == (1, 2000, 10)
    assert float(ece(ts, y[test])) < 0.5 * float(ece(raw, y[test]))
    assert float(nll(ts, y[test])) < float(nll(raw, y[test])) - 0.1
    # accuracy bit-identical: a temperature never changes the top label of the pooled prediction
    assert float(accuracy(ts, y[test])) == float(accuracy(raw, y[test]))
    assert torch.equal(ts[0].argmax(-1), raw.double().mean(0).argmax(-1))
    # calibrate-then-pool: one temperature per member, each near the pooled one here
    assert len(post.member_temperatures) == 4
    assert all(t == pytest.approx(post.temperature, rel=0.25) for t in post.member_temperatures)
    assert scaled["ts_members"].shape == (4, 2000, 10)


def test_pooled_logits_are_the_log_of_the_mean_probability():
    p = torch.tensor([[[0.7, 0.2, 0.1]], [[0.1, 0.2, 0.7]]])  # (M=2, B=1, K=3)
    assert torch.allclose(
        pooled_logits(p).exp(), torch.tensor([[0.4, 0.2, 0.4]], dtype=torch.float64)
    )
    # softmax(log p̄ / 1) is p̄ itself: T = 1 is the identity
    assert torch.allclose(pooled_logits(p).softmax(-1), p.double().mean(0))


def test_a_model_worse_than_chance_gets_a_finite_uniform_temperature():
    # the true class always gets the lowest probability: the NLL falls as 1/T → 0, so the best
    # positive temperature is infinite; it is kept finite (and JSON-writable)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 8, (300,), generator=g)
    p = (-2.0 * torch.nn.functional.one_hot(y, 8).float()).softmax(-1).unsqueeze(0)
    post = PosthocCalibration.fit(p, y)
    assert math.isfinite(post.temperature) and post.temperature >= 1e5
    uniform = torch.full((1, 300, 8), 1 / 8, dtype=torch.float64)
    assert torch.allclose(post.scaled(p)["ts"], uniform, atol=1e-5)


#: The exchangeable case: a fixed softmax model whose labels are drawn from its own
#: probabilities (so it is calibrated and its temperature is 1, fixed, never fitted on the split).
K, N_CAL, N_TEST, REPS, SCALE = 10, 200, 500, 400, 4.0
ALPHAS = (0.05, 0.1, 0.2)


def _exchangeable(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``N_CAL + N_TEST`` i.i.d. draws: logits ``SCALE · N(0, I_K)``, ``p = softmax``,
    ``y ~ Categorical(p)``; probabilities ``(1, N, K)`` float64 and labels ``(N,)``."""
    p = (SCALE * torch.randn(N_CAL + N_TEST, K, generator=gen, dtype=torch.float64)).softmax(-1)
    y = torch.multinomial(p, 1, generator=gen).squeeze(1)
    return p.unsqueeze(0), y


@pytest.fixture(scope="module")
def repeated_sets() -> dict[str, dict[str, np.ndarray]]:
    """Every statistic of every set predictor (THR/APS/RAPS × α) over ``REPS`` independent
    draws of the calibration and test sets (and of the APS/RAPS noise: seed per draw), plus the
    rate of empty sets whose top class is right, counted here from the masks."""
    gen = torch.Generator().manual_seed(11)
    out: dict[str, dict[str, list[float]]] = {}
    for rep in range(REPS):
        probs, y = _exchangeable(gen)
        cal, test = slice(0, N_CAL), slice(N_CAL, None)
        post = PosthocCalibration.fit(
            probs[:, cal], y[cal], alpha=ALPHAS, temperature=1.0, seed=2 * rep
        )
        top_right = probs[0, test].argmax(-1) == y[test]
        for key, sets in post.sets(probs[:, test]).items():
            acc = SetAccumulator()
            acc.update(sets, y[test])
            stats = out.setdefault(key, {})
            for name, value in acc.compute().items():
                stats.setdefault(name, []).append(value)
            empty_right = (~sets.sets.any(-1) & top_right).double().mean()
            stats.setdefault("empty_top_right", []).append(float(empty_right))
    return {k: {m: np.array(v) for m, v in d.items()} for k, d in out.items()}


@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_conformal_coverage_meets_the_finite_sample_guarantee(repeated_sets, method, alpha):
    """Split conformal with the ``⌈(n + 1)(1 − α)⌉``-th smallest of ``n = N_CAL`` scores: on
    exchangeable data with continuous scores (THR's ``1 − p_y`` of a continuous ``p``; APS's and
    RAPS's randomised), the coverage averaged over calibration and test draws is exactly
    ``⌈(n + 1)(1 − α)⌉ / (n + 1)`` (the rank of the threshold among n + 1 exchangeable scores),
    which lies in ``[1 − α, 1 − α + 1/(n + 1)]``: 0.95025, 0.90050, 0.80100 at n = 200.

    Tolerance: the mean of ``REPS`` = 400 independent repetitions has standard error
    ``sd / √REPS``, the per-repetition sd ≈ √(α(1 − α)(1/(n + 2) + 1/N_TEST)) (the coverage
    given the calibration set is Beta-distributed with that first variance; the test sample adds
    the second): 0.0009 to 0.0017 here, and the test uses the measured sd. 4 standard errors
    (two-sided p ≈ 6e-5 per check; the seeds are fixed, so the check is deterministic) bound the
    mean. The fallback sets would miss it by their empty-set rate (APS: 0.7, 2.0 and 6.1 points).
    Measured (seed 11; exact 0.9502 / 0.9005 / 0.8010): THR 0.9487 / 0.8987 / 0.8005, APS
    0.9507 / 0.8996 / 0.7987, RAPS 0.9495 / 0.8983 / 0.8014; with the fallback APS covers
    0.9571 / 0.9194 / 0.8569."""
    n = N_CAL
    key = f"{method}@{alpha!r}"
    cover = repeated_sets[key]["coverage"]
    exact = math.ceil((n + 1) * (1 - alpha) - 1e-9) / (n + 1)
    assert 1 - alpha <= exact <= 1 - alpha + 1 / (n + 1)
    se = cover.std(ddof=1) / math.sqrt(len(cover))
    assert se < 0.002  # the tolerance is as tight as planned
    assert abs(cover.mean() - exact) <= 4 * se, (key, cover.mean(), exact, se)


@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_fallback_adds_exactly_the_empty_sets_whose_top_class_is_right(
    repeated_sets, method, alpha
):
    """torch-uncertainty's sets (the top class added to an empty set) are reported beside the
    method's: their coverage is never lower, and the difference is, repetition by repetition, the
    rate of empty sets whose top class is the label; their size is larger by the empty rate."""
    stats = repeated_sets[f"{method}@{alpha!r}"]
    assert (stats["coverage_fallback"] >= stats["coverage"]).all()
    gain = stats["coverage_fallback"] - stats["coverage"]
    np.testing.assert_allclose(gain, stats["empty_top_right"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        stats["size_fallback"] - stats["size"], stats["empty_rate"], rtol=0, atol=1e-12
    )


def test_the_fallback_over_covers_where_sets_come_out_empty(repeated_sets):
    """The fabricated case has empty sets (an accurate model at a loose α), so the fallback's
    excess is measurable: at α = 0.2, 6.1% of APS's sets are empty and its fallback sets cover
    85.7% where the sets as defined cover 79.9%."""
    aps = repeated_sets["aps@0.2"]
    assert aps["empty_rate"].mean() > 0.03
    assert aps["coverage_fallback"].mean() - aps["coverage"].mean() > 0.03
    assert aps["coverage"].mean() < 0.81 < aps["coverage_fallback"].mean()


def test_the_fallback_sets_are_those_torch_uncertainty_returns():
    """At the same threshold and noise, ``ConformalSets.fallback`` is the support of the
    library's ``conformal`` output, and ``sets`` is it minus the added class."""
    from harness.metrics.posthoc import CONFORMAL_METHODS, _seeded

    gen = torch.Generator().manual_seed(3)
    probs, y = _exchangeable(gen)
    post = PosthocCalibration.fit(probs[:, :N_CAL], y[:N_CAL], alpha=0.2, temperature=1.0)
    batch = probs[:, N_CAL:]
    ours = post.sets(batch)
    logits = pooled_logits(batch)  # T = 1
    with _seeded(post.seed + 1):  # the draws of sets(): every method in turn
        library = {}
        for name in CONFORMAL_METHODS:
            predictor = post.scorers[name]
            predictor.q_hat = torch.tensor(post.conformal[name].quantile, dtype=torch.float64)
            library[name] = predictor.conformal(logits) > 0
    for name in CONFORMAL_METHODS:
        assert torch.equal(ours[name].fallback, library[name]), name
        empty = ~ours[name].sets.any(-1)
        assert torch.equal(ours[name].sets, library[name] & ~empty.unsqueeze(-1)), name
    assert (~ours["aps"].sets.any(-1)).sum() > 0  # the case has empty sets to fill


def test_conformal_quantile_is_the_corrected_order_statistic():
    """The ``⌈(n + 1)(1 − α)⌉``-th smallest score; the library's interpolated quantile sits
    lower (its coverage falls short of 1 − α by O(1/n)); too few scores give ``inf``."""
    from harness.metrics.posthoc import conformal_quantile

    scores = torch.arange(1, 20, dtype=torch.float64)[torch.randperm(19)]  # 1 … 19
    assert conformal_quantile(scores, 0.1) == 18.0  # ⌈20 · 0.9⌉ = 18
    assert float(torch.quantile(scores, 0.9)) == pytest.approx(17.2)  # torch-uncertainty's
    hundred = torch.arange(1, 100, dtype=torch.float64)
    assert conformal_quantile(hundred, 0.1) == 90.0  # (n + 1)(1 − α) = 90 exactly, not 91
    assert conformal_quantile(hundred, 0.3) == 70.0
    assert conformal_quantile(torch.arange(8.0), 0.1) == math.inf  # rank 9 of 8


def test_several_alphas_give_nested_sets_and_one_alpha_keeps_the_plain_keys():
    z, y = _synthetic(800, 10, seed=4, sharpen=1.0)
    probs = z.softmax(-1).unsqueeze(0)
    several = PosthocCalibration.fit(probs[:, :400], y[:400], alpha=[0.2, 0.05, 0.1])
    assert several.alphas == (0.2, 0.05, 0.1)
    assert list(several.conformal) == [
        f"{m}@{a}" for m in ("thr", "aps", "raps") for a in ("0.2", "0.05", "0.1")
    ]
    sets = several.sets(probs[:, 400:])
    for m in ("thr", "aps", "raps"):  # one draw of scores, three thresholds: nested
        loose, mid, tight = (sets[f"{m}@{a}"].sets for a in ("0.2", "0.1", "0.05"))
        assert torch.equal(loose & mid, loose) and torch.equal(mid & tight, mid)
    block = several.to_json()
    assert block["alpha"] == [0.2, 0.05, 0.1] and len(block["quantiles"]) == 9
    one = PosthocCalibration.fit(probs[:, :400], y[:400], alpha=0.1)
    assert list(one.conformal) == ["thr", "aps", "raps"] and one.alphas == (0.1,)
    # the one-α sets are the several-α fit's at that α (same scores, same noise)
    for m in ("thr", "aps", "raps"):
        assert torch.equal(one.sets(probs[:, 400:])[m].sets, sets[f"{m}@0.1"].sets)
    with pytest.raises(ValueError, match=r"repeated values in \[0.1, 0.1\]"):
        PosthocCalibration.fit(probs, y, alpha=[0.1, 0.1])
    with pytest.raises(ValueError, match=r"must be in \(0, 1\), got 1.0"):
        PosthocCalibration.fit(probs, y, alpha=[0.1, 1.0])
    with pytest.raises(ValueError, match="at least one value"):
        PosthocCalibration.fit(probs, y, alpha=[])


def test_randomised_sets_repeat_and_leave_the_global_generator_alone():
    """APS/RAPS draw their noise from a fixed seed: the same batch gets the same sets whatever
    ran before, and the evaluation's own draws (MC Dropout's masks) are not moved."""
    z, y = _synthetic(600, 10, seed=9, sharpen=1.0)
    probs = z.softmax(-1).unsqueeze(0)
    post = PosthocCalibration.fit(probs[:, :300], y[:300], alpha=0.1)
    torch.manual_seed(123)
    first = post.sets(probs[:, 300:])
    after_sets = torch.rand(5)
    torch.manual_seed(123)
    expected = torch.rand(5)
    assert torch.equal(after_sets, expected)  # the global stream continues as if no sets ran
    torch.rand(17)  # another state of the global generator: the sets do not change
    again = post.sets(probs[:, 300:])
    for k in first:
        assert torch.equal(first[k].sets, again[k].sets)
        assert torch.equal(first[k].fallback, again[k].fallback)
    assert not torch.equal(first["aps"].sets, first["thr"].sets)  # randomised APS differs


def test_set_accumulator_counts_coverage_size_and_the_fallback_apart():
    from harness.metrics.posthoc import ConformalSets

    sets = torch.tensor([[True, False, True], [False, False, False], [False, False, False]])
    top = torch.tensor([[False, False, False], [False, True, False], [True, False, False]])
    batch = ConformalSets(sets, sets | top)  # rows 2 and 3 empty, filled with their top class
    acc = SetAccumulator()
    acc.update(ConformalSets(batch.sets[:2], batch.fallback[:2]), torch.tensor([0, 1]))
    acc.update(ConformalSets(batch.sets[2:], batch.fallback[2:]), torch.tensor([1]))
    assert acc.compute() == {
        "coverage": 1 / 3,  # row 1 only
        "size": 2 / 3,
        "coverage_fallback": 2 / 3,  # + row 2, whose top class is its label
        "size_fallback": 4 / 3,
        "empty_rate": 2 / 3,
    }
    with pytest.raises(ValueError, match="before any sample"):
        SetAccumulator().compute()


def test_record_block_of_the_fit():
    z, y = _synthetic(500, 5, seed=7)
    post = PosthocCalibration.fit(z.softmax(-1).unsqueeze(0), y, alpha=0.2, fitted_on="val")
    block = post.to_json()
    assert block["fitted_on"] == "val" and block["n"] == 500 and block["alpha"] == 0.2
    assert block["temperature"] == post.temperature
    assert set(block["quantiles"]) == {"thr", "aps", "raps"}
    assert block["quantile_rule"] == "ceil((n+1)(1-alpha))-th smallest calibration score"
    assert block["seed"] == 0
    assert "member_temperatures" not in block
    # too few calibration images for α = 0.05 (rank 20 of 10): every class, quantile null
    small = PosthocCalibration.fit(z[:10].softmax(-1).unsqueeze(0), y[:10], alpha=0.05)
    assert small.to_json()["quantiles"] == {"thr": None, "aps": None, "raps": None}
    assert all(s.sets.all() for s in small.sets(z[10:20].softmax(-1).unsqueeze(0)).values())


def test_shift_accumulator_equals_the_full_metrics():
    from harness.metrics.collection import EnsembleMetrics
    from harness.metrics.posthoc import ShiftAccumulator

    g = torch.Generator().manual_seed(8)
    full, light = EnsembleMetrics(), ShiftAccumulator()
    for _ in range(3):  # streamed over batches
        p = torch.randn(4, 97, 6, generator=g, dtype=torch.float64).mul(3).softmax(-1)
        y = torch.randint(0, 6, (97,), generator=g)
        full.update(p, y)
        light.update(p, y)
    want, got = full.compute(), light.compute()
    for k in ("acc", "nll", "ece"):
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-15), k


def test_the_fit_records_the_splits_nll_before_and_after_the_temperature():
    """``split_nll`` is the held-out split's mean NLL of the pooled prediction p̄ = mean_m p_m,
    raw and divided by the fitted temperature in logit space, recomputed here with numpy."""
    import numpy as np

    from harness.metrics.posthoc import PosthocCalibration

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 400, 5, generator=g, dtype=torch.float64) * 3  # over-confident
    labels = torch.randint(0, 5, (400,), generator=g)
    probs = logits.softmax(-1)  # (M, N, K)
    fit = PosthocCalibration.fit(probs, labels, alpha=0.1)
    pbar = probs.mean(0).numpy()  # (N, K)
    y = labels.numpy()
    raw = -np.mean(np.log(pbar[np.arange(400), y]))
    z = np.log(pbar) / fit.temperature
    z = z - z.max(1, keepdims=True)
    ts = -np.mean(z[np.arange(400), y] - np.log(np.exp(z).sum(1)))
    assert fit.split_nll == pytest.approx({"raw": raw, "ts": ts}, rel=1e-9)
    assert fit.split_nll["ts"] < fit.split_nll["raw"]  # the fit lowered the split's NLL
    assert fit.to_json()["split_nll"] == fit.split_nll
