"""The energy and max-logit OOD scores (issue 60 item 7): values against pytorch-ood's own
detectors and metrics on fabricated logits, the pooling over an ensemble's members, a model that
gives probabilities only, and misuse of the accumulator's new input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytorch_ood.detector import EnergyBased, MaxLogit
from pytorch_ood.metrics import OODMetrics
from scipy.special import logsumexp

import harness.metrics as hm
from harness.engine.evaluate import gives_logits
from harness.engine.external import ExternalEnsemble


def fabricated_logits(
    m: int, b: int, k: int, seed: int, scale: float, shift: float
) -> torch.Tensor:
    """Member logits (M, B, K): a shared per-image part plus member noise, so the members differ
    but agree on which images are confident; ``scale``/``shift`` set the logit magnitude."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, b, k, generator=g, dtype=torch.float64) * scale
    return shared + 0.7 * torch.randn(m, b, k, generator=g, dtype=torch.float64) + shift


def _pytorch_ood_outlier(logits: torch.Tensor, detector) -> torch.Tensor:
    """pytorch-ood's outlier score (higher = OOD) of every member, averaged over the members."""
    return torch.stack([detector(member) for member in logits]).mean(0)  # (B,)


DETECTORS = {
    "energy": lambda z: EnergyBased(None).predict_logits(z),
    "max_logit": lambda z: MaxLogit(None).predict_logits(z),
}


@pytest.mark.parametrize("m", [1, 4])
def test_scores_are_pytorch_ood_detectors_negated_and_member_averaged(m: int) -> None:
    z = fabricated_logits(m, 300, 10, seed=m, scale=3.0, shift=1.5)
    for name, detector in DETECTORS.items():
        got = hm.LOGIT_OOD_SCORES[name](z)
        assert got.shape == (300,) and got.dtype == torch.float64
        torch.testing.assert_close(got, -_pytorch_ood_outlier(z, detector), rtol=0, atol=1e-12)
    # ... and against the closed forms in NumPy/SciPy (not through pytorch-ood at all).
    zn = z.numpy()
    np.testing.assert_allclose(hm.energy_score(z).numpy(), logsumexp(zn, -1).mean(0), atol=1e-12)
    np.testing.assert_allclose(hm.max_logit_score(z).numpy(), zn.max(-1).mean(0), atol=1e-12)


@pytest.mark.parametrize("m", [1, 3])
def test_auroc_and_fpr95_equal_pytorch_ood_metrics(m: int) -> None:
    """The AUROC and FPR95 our metric code gives the energy and max-logit scores equal
    pytorch-ood's ``OODMetrics`` on its own detectors' scores (labels < 0 = OOD) to 1e-6."""
    id_z = fabricated_logits(m, 500, 10, seed=10 + m, scale=3.0, shift=0.5)
    ood_z = fabricated_logits(m, 350, 10, seed=20 + m, scale=1.5, shift=0.8)
    acc = hm.OODScores()
    for chunk in torch.split(id_z, [1, 120, 379], dim=1):  # uneven batches
        acc.update_id(chunk.softmax(-1), chunk)
    for chunk in torch.split(ood_z, [200, 150], dim=1):
        acc.update_ood(chunk.softmax(-1), chunk)
    got = acc.compute()
    assert list(got) == ["msp", "entropy", "mi", "energy", "max_logit"]
    labels = torch.cat([torch.zeros(500, dtype=torch.long), -torch.ones(350, dtype=torch.long)])
    for name, detector in DETECTORS.items():
        outlier = torch.cat([_pytorch_ood_outlier(id_z, detector),
                             _pytorch_ood_outlier(ood_z, detector)])  # fmt: skip
        ref = OODMetrics().update(outlier, labels).compute()
        assert got[name]["auroc"] == pytest.approx(ref["AUROC"], abs=1e-6), name
        assert got[name]["fpr95"] == pytest.approx(ref["FPR95TPR"], abs=1e-6), name
    # Discriminative: the scores differ from one another and from chance on these logits.
    assert got["energy"]["auroc"] != pytest.approx(got["max_logit"]["auroc"], abs=1e-4)
    assert got["energy"]["auroc"] != pytest.approx(got["msp"]["auroc"], abs=1e-4)
    assert 0.6 < got["energy"]["auroc"] < 1.0 and 0.0 < got["energy"]["fpr95"] < 0.9


def test_ensemble_pooling_averages_member_scores_not_logits_or_log_probs() -> None:
    # Two confident members that disagree: z_1 = (10, 0), z_2 = (0, 10).
    z = torch.tensor([[[10.0, 0.0]], [[0.0, 10.0]]], dtype=torch.float64)  # (2, 1, 2)
    member_energy = 10.0 + math.log1p(math.exp(-10.0))  # logsumexp(10, 0)
    assert float(hm.energy_score(z)[0]) == pytest.approx(member_energy, abs=1e-12)
    assert float(hm.max_logit_score(z)[0]) == pytest.approx(10.0, abs=1e-12)
    # Not the energy of the mean logits (5 + log 2) nor their max (5) ...
    assert float(hm.energy_score(z.mean(0))[0]) == pytest.approx(5.0 + math.log(2), abs=1e-12)
    assert float(hm.max_logit_score(z.mean(0))[0]) == pytest.approx(5.0, abs=1e-12)
    # ... nor of the pooled log-probabilities, whose logsumexp is 0 for every input.
    pooled = z.softmax(-1).mean(0).log()
    assert float(hm.energy_score(pooled)[0]) == pytest.approx(0.0, abs=1e-12)
    # Shifting one member's logits by c shifts the ensemble's energy and max-logit by c / M.
    shifted = z.clone()
    shifted[1] += 3.0
    assert float(hm.energy_score(shifted)[0]) == pytest.approx(member_energy + 1.5, abs=1e-12)
    assert float(hm.max_logit_score(shifted)[0]) == pytest.approx(11.5, abs=1e-12)


def test_probabilities_only_leaves_the_logit_scores_out() -> None:
    id_z = fabricated_logits(2, 60, 5, seed=1, scale=2.0, shift=0.0)
    ood_z = fabricated_logits(2, 40, 5, seed=2, scale=1.0, shift=0.0)
    acc = hm.OODScores()
    acc.update_id(id_z.softmax(-1))
    acc.update_ood(ood_z.softmax(-1))
    got = acc.compute()
    assert list(got) == ["msp", "entropy", "mi"]
    assert got["msp"] == pytest.approx(
        hm.ood_metrics(hm.msp_score(id_z.softmax(-1)), hm.msp_score(ood_z.softmax(-1))), abs=1e-12
    )
    # Why: an outside model declared outputs="probs" is evaluated on log p, whose energy is 0
    # for every input (every AUROC 0.5) and whose max is a member's log top probability.
    probs = id_z.softmax(-1).float()
    log_p = ExternalEnsemble(lambda x: probs, 5, outputs="probs")(torch.zeros(60, 1))
    assert torch.allclose(hm.energy_score(log_p), torch.zeros(60, dtype=torch.float64), atol=1e-6)
    assert not gives_logits(ExternalEnsemble(lambda x: x, 5, outputs="probs"))
    assert gives_logits(ExternalEnsemble(lambda x: x, 5, outputs="logits"))
    assert gives_logits(torch.nn.Identity())  # a method's model: no `outputs`, logits


def test_streaming_equals_one_shot_and_reset_ood_forgets_the_logit_scores() -> None:
    id_z = fabricated_logits(3, 200, 6, seed=5, scale=2.0, shift=0.0)
    first = fabricated_logits(3, 80, 6, seed=6, scale=1.0, shift=0.0)
    other = fabricated_logits(3, 50, 6, seed=7, scale=0.5, shift=2.0)
    acc = hm.OODScores()
    start = 0
    for size in (1, 2, 17, 5, 64, 3, 108):
        chunk = id_z[:, start : start + size]
        acc.update_id(chunk.softmax(-1), chunk)
        start += size
    acc.update_ood(first.softmax(-1), first)
    assert acc.compute()["energy"] == pytest.approx(
        hm.ood_metrics(hm.energy_score(id_z), hm.energy_score(first)), abs=1e-12
    )
    acc.reset_ood()
    acc.update_ood(other.softmax(-1), other)
    again = acc.compute()
    for name, fn in hm.LOGIT_OOD_SCORES.items():
        assert again[name] == pytest.approx(hm.ood_metrics(fn(id_z), fn(other)), abs=1e-12)


def test_misuse_of_the_logits_input_is_refused() -> None:
    z = fabricated_logits(2, 10, 4, seed=0, scale=1.0, shift=0.0)
    acc = hm.OODScores()
    with pytest.raises(ValueError, match=r"logits of shape \(2, 10, 3\) do not match probs"):
        acc.update_id(z.softmax(-1), z[..., :3])
    bad = z.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="logits contain NaN or infinite values"):
        acc.update_id(z.softmax(-1), bad)
    with pytest.raises(ValueError, match=r"logits must have shape \(M, B, K\) or \(B, K\)"):
        hm.energy_score(z[0, 0])
    with pytest.raises(ValueError, match="logits must be a floating-point tensor, got Tensor"):
        hm.max_logit_score(z.long())
    with pytest.raises(ValueError, match="logits must be a floating-point tensor, got list"):
        hm.energy_score([[1.0, 2.0]])
    # Logits with some batches only: no score of part of a set.
    acc = hm.OODScores()
    acc.update_id(z.softmax(-1), z)
    acc.update_id(z.softmax(-1))
    acc.update_ood(z.softmax(-1), z)
    with pytest.raises(ValueError, match="logits came with 10 of the 20 ID samples"):
        acc.compute()
