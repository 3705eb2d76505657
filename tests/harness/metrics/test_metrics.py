"""Metrics against independent references: scikit-learn, SciPy, NumPy loops and closed forms.

Every value is checked per batch (one-shot) and accumulated over many uneven batches. Tests are
built so that they fail if a metric averaged logits instead of probabilities, swapped the
positive class of the OOD metrics, or put a confidence on a bin edge into the wrong bin.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from scipy.special import entr, rel_entr
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    log_loss,
    roc_auc_score,
    roc_curve,
)

import harness.metrics as hm

UNEVEN = (1, 2, 17, 5, 64, 3, 108)  # batch sizes, 200 samples in all


# ---------------------------------------------------------------------------------------------
# inputs and NumPy references


def random_probs(m: int, b: int, k: int, seed: int, conc: float = 1.0) -> torch.Tensor:
    """Member probabilities (M, B, K) drawn from a Dirichlet; members genuinely differ."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.dirichlet(np.full(k, conc), size=(m, b)))


def random_labels(b: int, k: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed + 1000).integers(0, k, size=b))


def np_mean(probs: torch.Tensor) -> np.ndarray:
    return probs.numpy().mean(axis=0)  # (B, K): mean of probabilities


def np_logit_mean(probs: torch.Tensor) -> np.ndarray:
    """The wrong ensemble: softmax of the mean log-probability (= mean of logits)."""
    log_p = np.log(probs.numpy()).mean(axis=0)
    e = np.exp(log_p - log_p.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_ece(conf: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> float:
    """Guo et al.'s ECE with a loop over bins (lo, hi]."""
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        in_bin = (conf > lo) & (conf <= hi)
        if in_bin.any():
            total += in_bin.mean() * abs(correct[in_bin].mean() - conf[in_bin].mean())
    return total


def np_aece(conf: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> float:
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for chunk in np.array_split(order, min(n_bins, len(conf))):
        total += len(chunk) / len(conf) * abs(correct[chunk].mean() - conf[chunk].mean())
    return total


def np_aurc_ordered(err_in_order: np.ndarray) -> float:
    """Mean selective risk when samples are accepted in the given order."""
    k = np.arange(1, len(err_in_order) + 1)
    return float(np.mean(np.cumsum(err_in_order) / k))


def np_top_label(p: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return p.max(axis=-1), (p.argmax(axis=-1) == labels).astype(float)


def np_fpr95_ood_positive(id_s: np.ndarray, ood_s: np.ndarray) -> float:
    """OpenOOD's ``auc_and_fpr_recall`` (Jingkang50/OpenOOD openood/evaluators/metrics.py @
    a59cdac): OOD positive, the negated confidence as the detector's score."""
    y = np.r_[np.zeros(len(id_s)), np.ones(len(ood_s))]
    fpr, tpr, _ = roc_curve(y, -np.r_[id_s, ood_s], drop_intermediate=False)
    return float(fpr[np.argmax(tpr >= 0.95)])


def np_fpr95_id_positive(id_s: np.ndarray, ood_s: np.ndarray) -> float:
    y = np.r_[np.ones(len(id_s)), np.zeros(len(ood_s))]
    fpr, tpr, _ = roc_curve(y, np.r_[id_s, ood_s], drop_intermediate=False)
    return float(fpr[np.argmax(tpr >= 0.95)])


# ---------------------------------------------------------------------------------------------
# accuracy, NLL, Brier


@pytest.mark.parametrize(("m", "k"), [(1, 2), (3, 10), (5, 4)])
def test_accuracy_nll_brier_match_sklearn_and_numpy(m: int, k: int) -> None:
    probs, labels = random_probs(m, 300, k, seed=m * k), random_labels(300, k, seed=m * k)
    p, y = np_mean(probs), labels.numpy()
    onehot = np.eye(k)[y]
    assert float(hm.accuracy(probs, labels)) == pytest.approx(
        accuracy_score(y, p.argmax(-1)), abs=1e-12
    )
    ref_nll = log_loss(y, p, labels=list(range(k)))
    assert float(hm.nll(probs, labels)) == pytest.approx(ref_nll, abs=1e-10)
    ref_brier = ((p - onehot) ** 2).sum(axis=1).mean()
    assert float(hm.brier(probs, labels)) == pytest.approx(ref_brier, abs=1e-12)
    members = probs.numpy()
    np.testing.assert_allclose(
        hm.member_accuracy(probs, labels).numpy(),
        [accuracy_score(y, members[i].argmax(-1)) for i in range(m)],
        atol=1e-12,
    )
    np.testing.assert_allclose(
        hm.member_nll(probs, labels).numpy(),
        [log_loss(y, members[i], labels=list(range(k))) for i in range(m)],
        atol=1e-10,
    )
    np.testing.assert_allclose(
        hm.member_brier(probs, labels).numpy(),
        [((members[i] - onehot) ** 2).sum(axis=1).mean() for i in range(m)],
        atol=1e-12,
    )
    if m > 1:  # the test discriminates: averaging logits would give another NLL and Brier
        wrong = np_logit_mean(probs)
        assert abs(log_loss(y, wrong, labels=list(range(k))) - ref_nll) > 1e-2
        assert abs(((wrong - onehot) ** 2).sum(axis=1).mean() - ref_brier) > 1e-3


def test_nll_clamps_a_zero_probability_and_says_how_much() -> None:
    # Both members give the true class exactly 0: the NLL is -log(eps), finite.
    probs = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]]], dtype=torch.float64)
    labels = torch.tensor([1])
    assert float(hm.nll(probs, labels)) == pytest.approx(-math.log(hm.NLL_EPS), rel=1e-12)
    assert pytest.approx(1e-12) == hm.NLL_EPS
    # Ensemble of one confident-right and one confident-wrong member: p̄[y] = 0.5, not clamped.
    mixed = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    assert float(hm.nll(mixed, labels)) == pytest.approx(math.log(2), rel=1e-12)
    assert float(hm.brier(mixed, labels)) == pytest.approx(0.5, abs=1e-12)
    assert float(hm.accuracy(mixed, labels)) == pytest.approx(0.0, abs=0)  # argmax tie -> class 0


# ---------------------------------------------------------------------------------------------
# ECE, adaptive ECE, AURC


@pytest.mark.parametrize("m", [1, 4])
def test_ece_matches_numpy_loop_and_torchmetrics_off_the_edges(m: int) -> None:
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs, labels = random_probs(m, 500, 10, seed=7 + m, conc=0.3), random_labels(500, 10, 7 + m)
    conf, correct = np_top_label(np_mean(probs), labels.numpy())
    ref = np_ece(conf, correct)
    assert float(hm.ece(probs, labels)) == pytest.approx(ref, abs=1e-12)
    # Continuous confidences never sit on an edge, so torchmetrics' [lo, hi) bins agree.
    tm = multiclass_calibration_error(probs.mean(0), labels, num_classes=10, n_bins=15, norm="l1")
    assert float(hm.ece(probs, labels)) == pytest.approx(float(tm), abs=1e-6)
    member_refs = [np_ece(*np_top_label(probs[i].numpy(), labels.numpy())) for i in range(m)]
    np.testing.assert_allclose(hm.member_ece(probs, labels).numpy(), member_refs, atol=1e-12)
    if m > 1:
        wrong = np_ece(*np_top_label(np_logit_mean(probs), labels.numpy()))
        assert abs(wrong - ref) > 1e-3


def _two_member_ensemble(rows: list[list[float]]) -> torch.Tensor:
    """Two identical members (so p̄ equals the rows exactly), float64 (2, B, K)."""
    p = torch.tensor(rows, dtype=torch.float64)
    return torch.stack([p, p])


def test_ece_confidence_on_a_bin_edge_goes_to_the_lower_bin() -> None:
    # Sample A: confidence exactly 8/15 and right; sample B: 8/15 + 0.01 and wrong.
    # (lo, hi] bins: A in (7/15, 8/15], B in (8/15, 9/15]  -> ECE = ½(1 − 8/15) + ½(8/15 + .01).
    # [lo, hi) bins would pool them                      -> ECE = |½ − (8/15 + 0.005)| ≈ 0.038.
    c = 8 / 15
    probs = _two_member_ensemble([[c, 1 - c], [c + 0.01, 1 - c - 0.01]])
    labels = torch.tensor([0, 1])
    expected = 0.5 * (1 - c) + 0.5 * (c + 0.01)
    assert float(hm.ece(probs, labels)) == pytest.approx(expected, abs=1e-12)
    assert np_ece(np.array([c, c + 0.01]), np.array([1.0, 0.0])) == pytest.approx(expected)
    count, _, _ = hm.calibration_bins(
        torch.tensor([c, c + 0.01], dtype=torch.float64), torch.tensor([True, False])
    )
    assert count[7] == 1 and count[8] == 1
    # Every edge k/15 (k = 8..15, the ones a top label of 2 classes can reach) goes to bin k − 1.
    edges = torch.tensor([k / 15 for k in range(8, 16)], dtype=torch.float64)
    count, _, _ = hm.calibration_bins(edges, torch.ones(8, dtype=torch.bool))
    assert count.tolist() == [0.0] * 7 + [1.0] * 8


def test_ece_pools_saturated_confidence_with_the_top_bin() -> None:
    # conf 1.0 (wrong) and 0.99 (right) share (14/15, 1]: ECE = |½ − 0.995| = 0.495.
    # torchmetrics' extra bin for exactly 1.0 would give ½·1 + ½·0.01 = 0.505.
    probs = _two_member_ensemble([[1.0, 0.0], [0.99, 0.01]])
    labels = torch.tensor([1, 0])
    assert float(hm.ece(probs, labels)) == pytest.approx(0.495, abs=1e-12)


def test_adaptive_ece_matches_numpy_and_torch_uncertainty() -> None:
    from torch_uncertainty.metrics import AdaptiveCalibrationError

    probs = random_probs(3, 407, 6, seed=11, conc=0.5)
    # Right iff more confident than the median: under-confident on top, over-confident below.
    mean = np_mean(probs)
    top = mean.argmax(-1)
    hit = mean.max(-1) > np.median(mean.max(-1))
    labels = torch.from_numpy(np.where(hit, top, (top + 1) % 6))
    conf, correct = np_top_label(mean, labels.numpy())
    ref = np_aece(conf, correct)
    assert float(hm.adaptive_ece(probs, labels)) == pytest.approx(ref, abs=1e-12)
    tu = AdaptiveCalibrationError(task="multiclass", num_bins=15, num_classes=6)
    tu.update(probs.mean(0), labels)
    assert float(hm.adaptive_ece(probs, labels)) == pytest.approx(float(tu.compute()), abs=1e-6)
    # Equal-mass bins differ from equal-width ones on these skewed confidences.
    assert abs(ref - np_ece(conf, correct)) > 1e-3


def test_adaptive_ece_with_ties_and_fewer_samples_than_bins() -> None:
    # Ties across a bin boundary keep input order (stable sort), as the NumPy reference.
    conf = torch.tensor([0.6] * 20 + [0.9] * 10, dtype=torch.float64)
    correct = torch.tensor([True, False] * 10 + [True] * 10)
    ref = np_aece(conf.numpy(), correct.numpy().astype(float))
    assert float(hm.adaptive_ece_from_confidences(conf, correct)) == pytest.approx(ref, abs=1e-12)
    # 3 samples < 15 bins: each sample is its own bin -> mean |correct − conf|.
    small = torch.tensor([0.5, 0.7, 0.9], dtype=torch.float64)
    hit = torch.tensor([True, False, True])
    assert float(hm.adaptive_ece_from_confidences(small, hit)) == pytest.approx(
        (0.5 + 0.7 + 0.1) / 3, abs=1e-12
    )


def test_aurc_matches_numpy_on_distinct_confidences() -> None:
    probs, labels = random_probs(4, 333, 5, seed=3), random_labels(333, 5, 3)
    conf, correct = np_top_label(np_mean(probs), labels.numpy())
    order = np.argsort(-conf)
    ref = np_aurc_ordered(1 - correct[order])
    assert float(hm.aurc(probs, labels)) == pytest.approx(ref, abs=1e-12)
    # torch-uncertainty's trapezoid variant agrees to O(1/N).
    from torch_uncertainty.metrics import AURC

    tu = AURC()
    tu.update(probs.mean(0).float(), labels)
    assert float(hm.aurc(probs, labels)) == pytest.approx(float(tu.compute()), abs=2 / 333)


def test_aurc_closed_forms_and_ranking_direction() -> None:
    correct = torch.tensor([True, True, False, False])
    # Right answers most confident: risks 0, 0, 1/3, 2/4 -> 5/24.
    good = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)
    assert float(hm.aurc_from_confidences(good, correct)) == pytest.approx(5 / 24, abs=1e-12)
    # Errors most confident: risks 1, 1, 2/3, 2/4 -> 19/24 (ranking by *de*creasing conf).
    bad = torch.tensor([0.6, 0.7, 0.8, 0.9], dtype=torch.float64)
    assert float(hm.aurc_from_confidences(bad, correct)) == pytest.approx(19 / 24, abs=1e-12)
    ones = torch.ones(4, dtype=torch.bool)
    assert float(hm.aurc_from_confidences(good, ones)) == pytest.approx(0.0, abs=0)
    assert float(hm.aurc_from_confidences(good, ~ones)) == pytest.approx(1.0, abs=1e-12)


def test_aurc_with_ties_is_the_average_over_tie_orders() -> None:
    conf = np.array([0.9, 0.5, 0.9, 0.7, 0.9, 0.5, 0.7])
    correct = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    groups = [np.flatnonzero(conf == v) for v in sorted(set(conf), reverse=True)]
    values = [
        np_aurc_ordered(1 - correct[np.concatenate(perm)])
        for perm in itertools.product(*(itertools.permutations(g) for g in groups))
    ]
    got = hm.aurc_from_confidences(torch.from_numpy(conf), torch.from_numpy(correct).bool())
    assert float(got) == pytest.approx(np.mean(values), abs=1e-12)
    # And it does not depend on the input order.
    perm = np.array([4, 2, 0, 6, 3, 1, 5])
    got2 = hm.aurc_from_confidences(
        torch.from_numpy(conf[perm]), torch.from_numpy(correct[perm]).bool()
    )
    assert float(got2) == pytest.approx(float(got), abs=1e-15)


# ---------------------------------------------------------------------------------------------
# diversity


def test_diversity_closed_forms() -> None:
    # Two confident members that disagree on 2 classes.
    probs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    assert float(hm.mutual_information(probs)) == pytest.approx(math.log(2), abs=1e-12)
    assert float(hm.disagreement(probs)) == pytest.approx(1.0, abs=1e-7)
    # KL(p‖q) with q = 0 where p = 1 is -log(eps) by the documented clamp, both directions.
    assert float(hm.pairwise_kl(probs)) == pytest.approx(-math.log(hm.NLL_EPS), rel=1e-12)
    # Known KL: p = (0.8, 0.2), q = (0.5, 0.5); mean of both directions.
    pq = torch.tensor([[[0.8, 0.2]], [[0.5, 0.5]]], dtype=torch.float64)
    kl_pq = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    kl_qp = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    assert float(hm.pairwise_kl(pq)) == pytest.approx((kl_pq + kl_qp) / 2, abs=1e-12)
    h = lambda v: -sum(x * math.log(x) for x in v)  # noqa: E731
    assert float(hm.mutual_information(pq)) == pytest.approx(
        h([0.65, 0.35]) - (h([0.8, 0.2]) + h([0.5, 0.5])) / 2, abs=1e-12
    )
    assert float(hm.disagreement(pq)) == pytest.approx(0.0, abs=0)  # both predict class 0
    # One member: no diversity at all.
    single = random_probs(1, 20, 5, seed=1)
    for fn in (hm.disagreement, hm.mutual_information, hm.pairwise_kl):
        assert float(fn(single)) == 0.0
    # Identical members: 0 as well.
    same = torch.cat([single, single, single])
    for fn in (hm.disagreement, hm.mutual_information, hm.pairwise_kl):
        assert float(fn(same)) == pytest.approx(0.0, abs=1e-12)


def test_diversity_matches_pairwise_numpy_loops() -> None:
    probs = random_probs(5, 200, 7, seed=21)
    p = probs.numpy()
    m = p.shape[0]
    preds = p.argmax(-1)  # (M, B)
    pairs = list(itertools.combinations(range(m), 2))
    ref_dis = np.mean([np.mean(preds[i] != preds[j]) for i, j in pairs])
    assert float(hm.disagreement(probs)) == pytest.approx(ref_dis, abs=1e-6)
    ref_mi = np.mean(entr(p.mean(0)).sum(-1) - entr(p).sum(-1).mean(0))
    assert float(hm.mutual_information(probs)) == pytest.approx(ref_mi, abs=1e-12)
    ordered = [(i, j) for i in range(m) for j in range(m) if i != j]
    ref_kl = np.mean([rel_entr(p[i], p[j]).sum(-1).mean() for i, j in ordered])
    assert float(hm.pairwise_kl(probs)) == pytest.approx(ref_kl, rel=1e-10)
    # Per-sample MI is not the mean member entropy (torch-uncertainty Entropy's pitfall).
    assert abs(ref_mi - entr(p).sum(-1).mean()) > 1e-2


# ---------------------------------------------------------------------------------------------
# OOD


def _sk_ood(id_s: np.ndarray, ood_s: np.ndarray) -> dict[str, float]:
    y = np.r_[np.ones(len(id_s)), np.zeros(len(ood_s))]  # ID = 1 = positive
    s = np.r_[id_s, ood_s]
    return {
        "auroc": roc_auc_score(y, s),
        "aupr_in": average_precision_score(y, s),
        "aupr_out": average_precision_score(1 - y, -s),
        "fpr95": np_fpr95_ood_positive(id_s, ood_s),
        "fpr95_id": np_fpr95_id_positive(id_s, ood_s),
    }


@pytest.mark.parametrize("discrete", [False, True])
def test_ood_metrics_match_sklearn_in_both_fpr95_conventions(discrete: bool) -> None:
    rng = np.random.default_rng(5)
    id_s, ood_s = rng.normal(1.0, 0.5, 400), rng.normal(0.0, 1.5, 150)  # asymmetric spreads
    if discrete:  # many ties
        id_s, ood_s = np.round(id_s * 2) / 2, np.round(ood_s * 2) / 2
    got = hm.ood_metrics(torch.from_numpy(id_s), torch.from_numpy(ood_s))
    ref = _sk_ood(id_s, ood_s)
    assert got.keys() == ref.keys()
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-6), key
    # Direct definition of fpr95_id: largest t keeping ≥ 95% of ID; fraction of OOD with s ≥ t.
    t = np.sort(id_s)[::-1][math.ceil(0.95 * len(id_s)) - 1]
    assert got["fpr95_id"] == pytest.approx(np.mean(ood_s >= t), abs=1e-6)
    # ... and of fpr95: smallest c flagging ≥ 95% of OOD (s ≤ c); fraction of ID with s ≤ c.
    c = np.sort(ood_s)[math.ceil(0.95 * len(ood_s)) - 1]
    assert got["fpr95"] == pytest.approx(np.mean(id_s <= c), abs=1e-6)
    # Discriminative: the two conventions differ on these asymmetric spreads.
    assert abs(got["fpr95"] - got["fpr95_id"]) > 0.05
    assert abs(got["aupr_in"] - got["aupr_out"]) > 0.05


def test_fpr95_both_conventions_on_a_hand_computed_example() -> None:
    # ID (higher = more ID): 5 and 10..28 (20 samples); OOD: 0..17, 19.5 and 40 (20 samples).
    id_s = torch.tensor([5.0, *range(10, 29)], dtype=torch.float64)
    ood_s = torch.tensor([*range(0, 18), 19.5, 40.0], dtype=torch.float64)
    # fpr95_id (ID positive): keep ≥ 19 of 20 ID → t = 10 (the 19th highest ID score); OOD with
    # score ≥ 10: 10..17 (8), 19.5 and 40 → 10 of 20 accepted = 0.5.
    # fpr95 (OOD positive): flag ≥ 19 of 20 OOD → c = 19.5 (the 19th lowest OOD score); ID with
    # score ≤ 19.5: 5 and 10..19 → 11 of 20 rejected = 0.55.
    # (torch-uncertainty's FPRx divides integer counts in float32: 1e-7.)
    got = hm.ood_metrics(id_s, ood_s)
    assert got["fpr95_id"] == pytest.approx(0.5, abs=1e-7)
    assert got["fpr95"] == pytest.approx(0.55, abs=1e-7)
    assert float(hm.fpr_at_tpr(id_s, ood_s, positive="id")) == pytest.approx(0.5, abs=1e-7)
    assert float(hm.fpr_at_tpr(id_s, ood_s, positive="ood")) == pytest.approx(0.55, abs=1e-7)
    assert np_fpr95_ood_positive(id_s.numpy(), ood_s.numpy()) == pytest.approx(0.55)
    assert np_fpr95_id_positive(id_s.numpy(), ood_s.numpy()) == pytest.approx(0.5)
    assert hm.FPR_POSITIVE == {"fpr95": "ood", "fpr95_id": "id"}


def test_ood_perfect_and_reversed_separation() -> None:
    id_s = torch.linspace(1.0, 2.0, 50, dtype=torch.float64)
    ood_s = torch.linspace(-1.0, 0.5, 30, dtype=torch.float64)
    perfect = hm.ood_metrics(id_s, ood_s)
    assert perfect == pytest.approx(
        {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr95": 0.0, "fpr95_id": 0.0}
    )
    reversed_ = hm.ood_metrics(ood_s, id_s)  # "ID" now scores below "OOD"
    assert reversed_["auroc"] == pytest.approx(0.0, abs=1e-7)
    assert reversed_["fpr95"] == pytest.approx(1.0, abs=1e-7)
    assert reversed_["fpr95_id"] == pytest.approx(1.0, abs=1e-7)
    same = torch.full((10,), 0.3, dtype=torch.float64)
    assert hm.auroc(same, same) == pytest.approx(0.5, abs=1e-7)


def test_ood_scores_outside_unit_interval_keep_their_ranking() -> None:
    # torchmetrics would apply a sigmoid to these, which rounds them all to 1.0 in float64.
    id_s = torch.arange(40.0, 60.0, dtype=torch.float64)
    ood_s = id_s - 0.5
    ref = _sk_ood(id_s.numpy(), ood_s.numpy())
    got = hm.ood_metrics(id_s, ood_s)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-6), key
    assert got["auroc"] > 0.5


def test_ood_scores_use_the_ensemble_mean() -> None:
    disagree = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)  # (2, 1, 2)
    assert float(hm.msp_score(disagree)[0]) == pytest.approx(0.5, abs=1e-12)  # not mean max = 1
    assert float(hm.entropy_score(disagree)[0]) == pytest.approx(-math.log(2), abs=1e-12)
    assert float(hm.mi_score(disagree)[0]) == pytest.approx(-math.log(2), abs=1e-12)
    confident = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)  # M = 1
    assert float(hm.msp_score(confident)[0]) == 1.0
    assert float(hm.entropy_score(confident)[0]) == 0.0
    assert float(hm.mi_score(confident)[0]) == 0.0
    probs = random_probs(3, 50, 4, seed=9)
    p = probs.numpy()
    np.testing.assert_allclose(hm.msp_score(probs).numpy(), p.mean(0).max(-1), atol=1e-12)
    np.testing.assert_allclose(
        hm.entropy_score(probs).numpy(), -entr(p.mean(0)).sum(-1), atol=1e-12
    )
    np.testing.assert_allclose(
        hm.mi_score(probs).numpy(),
        -(entr(p.mean(0)).sum(-1) - entr(p).sum(-1).mean(0)),
        atol=1e-6,
    )
    assert "fpr95 = OpenOOD/torch-uncertainty convention, OOD positive" in hm.OOD_CONVENTION
    assert "fpr95_id = Hendrycks & Gimpel convention, ID positive" in hm.OOD_CONVENTION


def test_ood_scores_streaming_equals_one_shot_and_reset_ood() -> None:
    id_probs = random_probs(3, sum(UNEVEN), 10, seed=31, conc=0.2)
    ood_probs = random_probs(3, 120, 10, seed=32, conc=1.0)
    acc = hm.OODScores()
    start = 0
    for size in UNEVEN:
        acc.update_id(id_probs[:, start : start + size])
        start += size
    for chunk in torch.split(ood_probs, [7, 50, 1, 62], dim=1):
        acc.update_ood(chunk)
    got = acc.compute()
    assert set(got) == {"msp", "entropy", "mi"}
    for name, fn in hm.OOD_SCORES.items():
        ref = _sk_ood(fn(id_probs).numpy(), fn(ood_probs).numpy())
        assert got[name] == pytest.approx(ref, abs=1e-6), name
        assert got[name] == pytest.approx(hm.ood_metrics(fn(id_probs), fn(ood_probs)), abs=1e-12)
    # Same ID scores against another OOD set.
    acc.reset_ood()
    other = random_probs(3, 40, 10, seed=33, conc=0.2)
    acc.update_ood(other)
    again = acc.compute()
    assert again["msp"] == pytest.approx(
        hm.ood_metrics(hm.msp_score(id_probs), hm.msp_score(other)), abs=1e-12
    )


# ---------------------------------------------------------------------------------------------
# the collection: streaming over uneven batches equals one shot


def _functional(probs: torch.Tensor, labels: torch.Tensor) -> dict:
    return {
        "acc": float(hm.accuracy(probs, labels)),
        "nll": float(hm.nll(probs, labels)),
        "brier": float(hm.brier(probs, labels)),
        "ece": float(hm.ece(probs, labels)),
        "aece": float(hm.adaptive_ece(probs, labels)),
        "aurc": float(hm.aurc(probs, labels)),
        "disagreement": float(hm.disagreement(probs)),
        "mi": float(hm.mutual_information(probs)),
        "kl": float(hm.pairwise_kl(probs)),
        "members": {
            "acc": hm.member_accuracy(probs, labels).tolist(),
            "nll": hm.member_nll(probs, labels).tolist(),
            "brier": hm.member_brier(probs, labels).tolist(),
            "ece": hm.member_ece(probs, labels).tolist(),
        },
    }


def _assert_close(got: dict, ref: dict, tol: float) -> None:
    assert list(got) == list(ref)
    for key, value in ref.items():
        if key == "members":
            assert list(got[key]) == list(value)
            for name, values in value.items():
                assert got[key][name] == pytest.approx(values, abs=tol), name
        else:
            assert got[key] == pytest.approx(value, abs=tol), key


@pytest.mark.parametrize("m", [1, 4])
def test_ensemble_metrics_accumulated_equals_one_shot_and_references(m: int) -> None:
    k = 10
    probs, labels = (
        random_probs(m, sum(UNEVEN), k, seed=40 + m, conc=0.3),
        random_labels(sum(UNEVEN), k, 40 + m),
    )
    ref = _functional(probs, labels)
    one_shot = hm.EnsembleMetrics()
    one_shot.update(probs, labels)
    _assert_close(one_shot.compute(), ref, 1e-12)
    streamed = hm.EnsembleMetrics()
    start = 0
    for size in UNEVEN:
        streamed.update(probs[:, start : start + size], labels[start : start + size])
        start += size
    out = streamed.compute()
    _assert_close(out, ref, 1e-10)
    # And against the independent references (not only against our own functions).
    p, y = np_mean(probs), labels.numpy()
    conf, correct = np_top_label(p, y)
    # Dirichlet(0.3) puts some true-class probabilities below eps: the clamp is part of the value.
    p_true = np.maximum(p[np.arange(len(y)), y], hm.NLL_EPS)
    assert out["nll"] == pytest.approx(-np.log(p_true).mean(), abs=1e-12)
    assert out["ece"] == pytest.approx(np_ece(conf, correct), abs=1e-12)
    assert out["aece"] == pytest.approx(np_aece(conf, correct), abs=1e-12)
    assert out["aurc"] == pytest.approx(np_aurc_ordered(1 - correct[np.argsort(-conf)]), abs=1e-12)
    assert set(out) == {*hm.ENSEMBLE_METRIC_KEYS, "members"}
    assert all(len(v) == m for v in out["members"].values())
    assert all(isinstance(v, float) for k_, v in out.items() if k_ != "members")
    json.dumps(out)
    if m == 1:
        assert out["disagreement"] == out["mi"] == out["kl"] == 0.0
        assert out["members"]["acc"] == pytest.approx([out["acc"]])
    # reset() forgets everything.
    streamed.reset()
    streamed.update(probs[:, :50], labels[:50])
    _assert_close(streamed.compute(), _functional(probs[:, :50], labels[:50]), 1e-12)


def test_ensemble_metrics_accepts_float32_and_single_model_input() -> None:
    probs, labels = random_probs(2, 64, 5, seed=50), random_labels(64, 5, 50)
    a, b = hm.EnsembleMetrics(), hm.EnsembleMetrics()
    a.update(probs, labels)
    b.update(probs.float(), labels.int())
    _assert_close(b.compute(), a.compute(), 1e-6)
    single = hm.EnsembleMetrics()
    single.update(probs[0], labels)  # (B, K) is one member
    assert single.compute()["acc"] == pytest.approx(float(hm.accuracy(probs[0], labels)))


# ---------------------------------------------------------------------------------------------
# input errors


def test_inputs_are_validated() -> None:
    probs, labels = random_probs(2, 8, 3, seed=60), random_labels(8, 3, 60)
    logits = torch.log(probs) + 2.0
    with pytest.raises(ValueError, match="pass softmax\\(logits\\), not logits"):
        hm.nll(logits, labels)
    with pytest.raises(ValueError, match=r"labels must have shape \(B,\) = \(8,\)"):
        hm.accuracy(probs, labels[:5])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        hm.ece(probs, labels + 3)
    with pytest.raises(ValueError, match=r"probs must have shape \(M, B, K\) or \(B, K\)"):
        hm.brier(probs[0, 0], labels)
    with pytest.raises(ValueError, match="labels must be an integer tensor"):
        hm.accuracy(probs, labels.double())
    metrics = hm.EnsembleMetrics()
    with pytest.raises(ValueError, match="before any sample"):
        metrics.compute()
    metrics.update(probs, labels)
    with pytest.raises(ValueError, match="number of members must not change"):
        metrics.update(probs[:1], labels)
    ood = hm.OODScores()
    ood.update_id(probs)
    with pytest.raises(ValueError, match="at least one ID and one OOD sample"):
        ood.compute()
    with pytest.raises(ValueError, match="tpr must be in"):
        hm.fpr_at_tpr(torch.ones(3), torch.zeros(3), tpr=0.0, positive="ood")
    with pytest.raises(ValueError, match="positive must be 'ood' or 'id', got 'in'"):
        hm.fpr_at_tpr(torch.ones(3), torch.zeros(3), positive="in")
    with pytest.raises(ValueError, match="ood_scores contains NaN"):
        hm.auroc(torch.ones(3), torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="id_scores is empty"):
        hm.aupr_in(torch.zeros(0), torch.ones(3))
    with pytest.raises(ValueError, match="n_bins must be a positive integer"):
        hm.CalibrationAccumulator(n_bins=0)
