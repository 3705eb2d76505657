"""Member diversity: pairwise disagreement, mutual information and mean pairwise KL.

For member probabilities ``p_m`` (``(M, B, K)``) and ``p̄ = mean_m p_m``:

- **disagreement** = mean over unordered member pairs ``m < n`` of the fraction of samples on
  which ``argmax p_m ≠ argmax p_n`` (equivalently the mean over samples of the fraction of
  disagreeing pairs); in [0, 1].
- **mutual information** (epistemic part of the predictive entropy; Depeweg et al., 2018;
  Lakshminarayanan et al., 2017) = ``mean_i [ H(p̄_i) − mean_m H(p_mi) ]`` in nats, with
  ``H(p) = −Σ_k p_k log p_k`` and ``0 log 0 = 0``; in [0, log M].
- **pairwise KL** = mean over samples and over *ordered* pairs ``m ≠ n`` of ``KL(p_m ‖ p_n)`` in
  nats, with ``p_n`` clamped at :data:`~harness.metrics.classification.NLL_EPS` inside the log
  (otherwise one exact zero in a saturated float32 softmax makes it infinite).

With one member (M = 1) all three are 0.

Disagreement and mutual information use torch-uncertainty's ``Disagreement`` and
``MutualInformation`` (per-sample, ``reduction="none"``), which compute exactly these quantities
on ``(B, M, K)`` input (MI clamped at 0 against rounding). torch-uncertainty's ``Disagreement``
divides by zero for M = 1, so that case is handled here. The KL is written by hand: neither
library has a pairwise KL, and torchmetrics' ``kl_divergence`` returns NaN/inf on exact zeros.

References:
    Lakshminarayanan, Pritzel & Blundell. Simple and Scalable Predictive Uncertainty Estimation
    using Deep Ensembles. NeurIPS 2017.
    Depeweg, Hernández-Lobato, Doshi-Velez & Udluft. Decomposition of Uncertainty in Bayesian
    Deep Learning for Efficient and Risk-sensitive Learning. ICML 2018.
    Fort, Hu & Lakshminarayanan. Deep Ensembles: A Loss Landscape Perspective. 2019 (disagreement).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_uncertainty.metrics.classification import Disagreement, MutualInformation
from torchmetrics import Metric

from harness.metrics.classification import NLL_EPS, as_ensemble


def disagreement_per_sample(probs: Tensor) -> Tensor:
    """Fraction of member pairs whose top-1 predictions differ, per sample.

    Args:
        probs: Member probabilities ``(M, B, K)``.

    Returns:
        ``(B,)`` float64 in [0, 1] (zeros when M = 1).
    """
    return _disagreement_per_sample(as_ensemble(probs))


def _disagreement_per_sample(probs: Tensor) -> Tensor:
    m, b, _ = probs.shape  # float64 (M, B, K)
    if m == 1 or b == 0:
        return probs.new_zeros(b)
    metric = Disagreement(reduction="none").to(probs.device)
    metric.update(probs.transpose(0, 1))  # (M, B, K) -> (B, M, K), torch-uncertainty's layout
    return metric.compute().to(torch.float64).reshape(b)  # (B,); torchmetrics squeezes B = 1


def mutual_information_per_sample(probs: Tensor) -> Tensor:
    """Mutual information ``H(p̄) − mean_m H(p_m)`` per sample, in nats.

    Not the mean member entropy (torch-uncertainty's ``Entropy`` on ``(B, M, K)``): this is the
    entropy of the mean minus the mean of the entropies.

    Args:
        probs: Member probabilities ``(M, B, K)``.

    Returns:
        ``(B,)`` float64, ≥ 0 (zeros when M = 1).
    """
    return _mutual_information_per_sample(as_ensemble(probs))


def _mutual_information_per_sample(probs: Tensor) -> Tensor:
    m, b, _ = probs.shape  # float64 (M, B, K)
    if m == 1 or b == 0:
        return probs.new_zeros(b)
    metric = MutualInformation(reduction="none").to(probs.device)
    metric.update(probs.transpose(0, 1))  # (M, B, K) -> (B, M, K)
    return metric.compute().to(torch.float64).reshape(b)  # (B,); torchmetrics squeezes B = 1


def pairwise_kl_per_sample(probs: Tensor, eps: float = NLL_EPS) -> Tensor:
    """Mean over ordered pairs ``m ≠ n`` of ``KL(p_m ‖ p_n)`` per sample, in nats.

    Uses ``Σ_{m,n} KL(p_m‖p_n) = Σ_k [M Σ_m p_mk log p_mk − (Σ_m p_mk)(Σ_n log p_nk)]`` (the
    ``m = n`` terms are 0), O(M·K) per sample instead of O(M²·K). Logs are of ``max(p, eps)``;
    the per-sample mean is clamped at 0 against rounding.

    Args:
        probs: Member probabilities ``(M, B, K)``.
        eps: Clamp inside the logarithms.

    Returns:
        ``(B,)`` float64 (zeros when M = 1).
    """
    return _pairwise_kl_per_sample(as_ensemble(probs), eps)


def _pairwise_kl_per_sample(probs: Tensor, eps: float) -> Tensor:
    m, b, _ = probs.shape  # float64 (M, B, K)
    if m == 1 or b == 0:
        return probs.new_zeros(b)
    log_p = probs.clamp_min(eps).log()  # (M, B, K)
    self_term = m * (probs * log_p).sum(dim=(0, 2))  # (B,)
    cross_term = (probs.sum(dim=0) * log_p.sum(dim=0)).sum(dim=-1)  # (B,)
    return ((self_term - cross_term) / (m * (m - 1))).clamp_min(0.0)


def disagreement(probs: Tensor) -> Tensor:
    """Mean pairwise disagreement of the members' top-1 predictions (scalar float64)."""
    return _mean(disagreement_per_sample(probs))


def mutual_information(probs: Tensor) -> Tensor:
    """Mean over samples of ``H(p̄) − mean_m H(p_m)`` in nats (scalar float64)."""
    return _mean(mutual_information_per_sample(probs))


def pairwise_kl(probs: Tensor, eps: float = NLL_EPS) -> Tensor:
    """Mean over samples and ordered member pairs of ``KL(p_m ‖ p_n)`` in nats (scalar float64)."""
    return _mean(pairwise_kl_per_sample(probs, eps))


def _mean(values: Tensor) -> Tensor:
    if values.numel() == 0:
        raise ValueError("cannot compute a diversity metric on zero samples")
    return values.mean()


class DiversityAccumulator(Metric):
    """Streaming disagreement, mutual information and pairwise KL (float64 sums only).

    Args:
        eps: Clamp inside the KL's logarithms.
        validate: Check each batch with :func:`~harness.metrics.classification.as_ensemble`.
        **kwargs: Passed to :class:`torchmetrics.Metric`.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, eps: float = NLL_EPS, validate: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eps = eps
        self.validate = validate
        self.add_state("n", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        for name in ("disagreement", "mi", "kl"):
            self.add_state(
                name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
            )

    def update(self, probs: Tensor, labels: Tensor | None = None) -> None:
        """Add a batch.

        Args:
            probs: Member probabilities ``(M, B, K)``.
            labels: Ignored (accepted so that every accumulator has the same ``update``).
        """
        del labels
        probs = as_ensemble(probs, validate=self.validate)
        dev = self.disagreement.device  # states stay where .to(device) put them
        self.disagreement += _disagreement_per_sample(probs).sum().to(dev)
        self.mi += _mutual_information_per_sample(probs).sum().to(dev)
        self.kl += _pairwise_kl_per_sample(probs, self.eps).sum().to(dev)
        self.n += probs.shape[1]

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"disagreement", "mi", "kl"}`` as 0-d float64 tensors.

        Raises:
            ValueError: If no sample was seen.
        """
        if int(self.n) == 0:
            raise ValueError("DiversityAccumulator.compute() called before any sample")
        return {name: getattr(self, name) / self.n for name in ("disagreement", "mi", "kl")}
