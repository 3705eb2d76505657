"""Post-hoc calibration: temperature scaling against an independent fit, conformal coverage on
exchangeable data, and the calibration split's disjointness from every training image."""

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


def test_conformal_coverage_on_exchangeable_scores():
    """Over 200 random calibration/test splits of exchangeable synthetic scores: THR's mean
    coverage at α = 0.1 lies in [0.895, 0.92] and APS's sets are at least as large as THR's."""
    z, y = _synthetic(2000, 10, seed=5, sharpen=1.0)
    probs = z.softmax(-1).unsqueeze(0)  # (1, N, K)
    gen = torch.Generator().manual_seed(6)
    cover = {"thr": [], "aps": [], "raps": []}
    size = {"thr": [], "aps": [], "raps": []}
    for _ in range(200):
        perm = torch.randperm(len(y), generator=gen)
        cal, test = perm[:1000], perm[1000:]
        post = PosthocCalibration.fit(probs[:, cal], y[cal], alpha=0.1)
        for name, mask in post.sets(probs[:, test]).items():
            acc = SetAccumulator()
            acc.update(mask, y[test])
            out = acc.compute()
            cover[name].append(out["coverage"])
            size[name].append(out["size"])
    assert 0.895 <= np.mean(cover["thr"]) <= 0.92
    assert np.mean(size["aps"]) >= np.mean(size["thr"])
    for name in ("aps", "raps"):  # the randomised sets cover at the level too
        assert 0.88 <= np.mean(cover[name]) <= 0.93, (name, np.mean(cover[name]))


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
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["aps"], first["thr"])  # randomised APS differs from THR


def test_set_accumulator_counts_coverage_and_size():
    sets = torch.tensor([[True, False, True], [False, True, False], [True, True, True]])
    acc = SetAccumulator()
    acc.update(sets[:2], torch.tensor([0, 0]))
    acc.update(sets[2:], torch.tensor([1]))
    assert acc.compute() == {"coverage": 2 / 3, "size": 6 / 3}
    with pytest.raises(ValueError, match="before any sample"):
        SetAccumulator().compute()


def test_record_block_of_the_fit():
    z, y = _synthetic(500, 5, seed=7)
    post = PosthocCalibration.fit(z.softmax(-1).unsqueeze(0), y, alpha=0.2, fitted_on="val")
    block = post.to_json()
    assert block["fitted_on"] == "val" and block["n"] == 500 and block["alpha"] == 0.2
    assert block["temperature"] == post.temperature
    assert set(block["quantiles"]) == {"thr", "aps", "raps"}
    assert "member_temperatures" not in block


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
