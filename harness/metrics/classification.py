"""Accuracy, NLL and Brier score of an ensemble and of each of its members.

Conventions shared by every module of :mod:`harness.metrics`:

- An ensemble's output is the member probabilities ``probs`` of shape ``(M, B, K)`` (M members,
  B samples, K classes; every row sums to 1); a single model's ``(B, K)`` is read as ``M = 1``.
- The ensemble prediction is the mean of the member *probabilities*,
  ``p̄ = (1/M) Σ_m p_m`` (Lakshminarayanan et al., 2017), never of logits.
- All arithmetic is done in float64 (inputs are cast once), so that streaming sums over many
  batches match the one-shot value to ~1e-12 and bin edges are compared exactly.
- Functional metrics return 0-d float64 tensors (per-member ones ``(M,)``); the streaming
  accumulators (``torchmetrics.Metric`` subclasses) keep sums, so
  ``update(batch_1) … update(batch_n); compute()`` equals the functional value on the
  concatenation of the batches.

Written by hand, not taken from torchmetrics / torch-uncertainty: accuracy and Brier are one-line
closed forms that we evaluate for the ensemble and all M members in one vectorized pass over
``(M, B, K)`` (torch-uncertainty's ``BrierScore`` on ``(B, M, K)`` returns only the mean over
members); the NLL clamps the probability of the true class at :data:`NLL_EPS`, whereas
torch-uncertainty's ``CategoricalNLL`` takes ``log`` of the raw probability and returns ``inf``
when a saturated float32 softmax gives the true class exactly 0.

References:
    Lakshminarayanan, Pritzel & Blundell. Simple and Scalable Predictive Uncertainty Estimation
    using Deep Ensembles. NeurIPS 2017.
    Brier. Verification of forecasts expressed in terms of probability. Monthly Weather Review,
    1950.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

#: Probabilities are clamped to at least this value before taking a log (NLL, pairwise KL):
#: ``-log(NLL_EPS) ≈ 27.63`` nats is the largest per-sample NLL we report.
NLL_EPS = 1e-12

#: Tolerance on ``|Σ_k p_k − 1|`` when validating that inputs are probabilities (loose enough for
#: bfloat16 softmax outputs, tight enough to catch logits passed by mistake).
_SUM_TOL = 1e-2


def as_ensemble(probs: Tensor, labels: Tensor | None = None, *, validate: bool = True) -> Tensor:
    """Check ensemble probabilities (and labels) and return them as float64 ``(M, B, K)``.

    Args:
        probs: Member probabilities ``(M, B, K)``, or a single model's ``(B, K)`` (read as M = 1).
        labels: Optional integer class labels ``(B,)`` with values in ``[0, K)``.
        validate: Also check that ``probs`` are non-negative and rows sum to 1 (costs one
            device-host synchronisation).

    Returns:
        ``probs`` as a float64 tensor of shape ``(M, B, K)`` on the same device.

    Raises:
        ValueError: On a wrong shape or dtype, labels that do not match, or (with ``validate``)
            values that are not probabilities, e.g. logits.
    """
    if not isinstance(probs, Tensor) or not probs.is_floating_point():
        raise ValueError(f"probs must be a floating-point tensor, got {type(probs).__name__}")
    if probs.ndim == 2:
        probs = probs.unsqueeze(0)  # (B, K) -> (1, B, K)
    if probs.ndim != 3:
        raise ValueError(f"probs must have shape (M, B, K) or (B, K), got {tuple(probs.shape)}")
    m, b, k = probs.shape
    if m < 1 or k < 1:
        raise ValueError(f"probs must have at least one member and one class, got {(m, b, k)}")
    if probs.device.type == "mps":  # MPS has no float64
        probs = probs.cpu()
    probs = probs.to(torch.float64)
    if validate and probs.numel() > 0:
        lowest = probs.min()
        worst = (probs.sum(dim=-1) - 1.0).abs().max()  # (M, B) -> ()
        if not (bool(lowest >= 0.0) and bool(worst <= _SUM_TOL)):
            raise ValueError(
                "probs must be probabilities (non-negative, each row summing to 1); got min "
                f"{float(lowest):.3g} and max |row sum - 1| {float(worst):.3g}; pass "
                "softmax(logits), not logits"
            )
    if labels is not None:
        if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex():
            raise ValueError("labels must be an integer tensor of shape (B,)")
        if labels.ndim != 1 or labels.shape[0] != b:
            raise ValueError(
                f"labels must have shape (B,) = ({b},) to match probs, got {tuple(labels.shape)}"
            )
        if labels.numel() and (bool(labels.min() < 0) or bool(labels.max() >= k)):
            raise ValueError(
                f"labels must lie in [0, {k}), got [{int(labels.min())}, {int(labels.max())}]"
            )
    return probs


def ensemble_mean(probs: Tensor) -> Tensor:
    """Ensemble predictive distribution: mean of the member probabilities.

    Args:
        probs: Member probabilities ``(M, B, K)`` (float64 after :func:`as_ensemble`).

    Returns:
        ``p̄`` of shape ``(B, K)``.
    """
    return probs.mean(dim=0)  # (M, B, K) -> (B, K)


def _labels_on(labels: Tensor, device: torch.device) -> Tensor:
    return labels.to(device=device, dtype=torch.long)


def _sample_stats(probs: Tensor, labels: Tensor, eps: float) -> dict[str, Tensor]:
    """Per-sample correctness, NLL and Brier of the ensemble ``(B,)`` and each member ``(M, B)``.

    Args:
        probs: float64 member probabilities ``(M, B, K)``.
        labels: Labels ``(B,)``.
        eps: Clamp for the NLL.
    """
    labels = _labels_on(labels, probs.device)
    mean = ensemble_mean(probs)  # (B, K)
    both = torch.cat([mean.unsqueeze(0), probs], dim=0)  # (1 + M, B, K): row 0 is the ensemble
    idx = labels.view(1, -1, 1).expand(both.shape[0], -1, 1)  # (1 + M, B, 1)
    p_true = both.gather(-1, idx).squeeze(-1)  # (1 + M, B)
    correct = (both.argmax(dim=-1) == labels).to(torch.float64)  # (1 + M, B)
    nll = -torch.log(p_true.clamp_min(eps))  # (1 + M, B)
    # Brier = Σ_k (p_k − 1[k=y])² = Σ_k p_k² − 2 p_y + 1
    brier = both.square().sum(dim=-1) - 2.0 * p_true + 1.0  # (1 + M, B)
    return {"correct": correct, "nll": nll, "brier": brier}


def accuracy(probs: Tensor, labels: Tensor) -> Tensor:
    """Top-1 accuracy of the ensemble mean ``p̄`` (ties in argmax go to the lowest class index).

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.

    Returns:
        Scalar float64 tensor in [0, 1].
    """
    return _mean_over_samples(probs, labels, "correct")[0]


def nll(probs: Tensor, labels: Tensor, eps: float = NLL_EPS) -> Tensor:
    """Negative log-likelihood of the ensemble mean, ``mean_i −log max(p̄_i[y_i], eps)`` (nats).

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.
        eps: The probability of the true class is clamped to at least ``eps`` so that a
            saturated prediction gives a finite value (at most ``−log eps``).

    Returns:
        Scalar float64 tensor.
    """
    return _mean_over_samples(probs, labels, "nll", eps)[0]


def brier(probs: Tensor, labels: Tensor) -> Tensor:
    """Brier score of the ensemble mean: ``mean_i Σ_k (p̄_ik − 1[k = y_i])²`` (Brier, 1950).

    Summed over classes (range [0, 2]), averaged over samples.

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.

    Returns:
        Scalar float64 tensor.
    """
    return _mean_over_samples(probs, labels, "brier")[0]


def member_accuracy(probs: Tensor, labels: Tensor) -> Tensor:
    """Accuracy of each member on its own. Returns ``(M,)`` float64."""
    return _mean_over_samples(probs, labels, "correct")[1:]


def member_nll(probs: Tensor, labels: Tensor, eps: float = NLL_EPS) -> Tensor:
    """NLL of each member on its own (clamped as in :func:`nll`). Returns ``(M,)`` float64."""
    return _mean_over_samples(probs, labels, "nll", eps)[1:]


def member_brier(probs: Tensor, labels: Tensor) -> Tensor:
    """Brier score of each member on its own. Returns ``(M,)`` float64."""
    return _mean_over_samples(probs, labels, "brier")[1:]


def _mean_over_samples(probs: Tensor, labels: Tensor, key: str, eps: float = NLL_EPS) -> Tensor:
    probs = as_ensemble(probs, labels)
    if probs.shape[1] == 0:
        raise ValueError("cannot compute a metric on zero samples")
    return _sample_stats(probs, labels, eps)[key].mean(dim=1)  # (1 + M, B) -> (1 + M,)


def _lazy_member_state(metric: Metric, names: tuple[str, ...], shape: tuple[int, ...]) -> None:
    """Size per-member states on the first update; reject a changed ensemble size afterwards."""
    for name in names:
        state: Tensor = getattr(metric, name)
        if state.numel() == 0:
            setattr(metric, name, state.new_zeros(shape))
        elif tuple(state.shape) != shape:
            raise ValueError(
                f"{type(metric).__name__}: got an ensemble of {shape[0]} members after "
                f"{state.shape[0]}; the number of members must not change between updates"
            )


class ClassificationAccumulator(Metric):
    """Streaming accuracy, NLL and Brier score of the ensemble and of each member.

    Keeps float64 sums only (O(M) memory). ``compute()`` equals :func:`accuracy`, :func:`nll`,
    :func:`brier`, :func:`member_accuracy`, :func:`member_nll` and :func:`member_brier` on the
    concatenation of all batches.

    Args:
        eps: NLL clamp, see :func:`nll`.
        validate: Check each batch with :func:`as_ensemble` (one host synchronisation per batch).
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
        # (1 + M,) sums; row 0 is the ensemble. Sized on the first update.
        for name in ("correct", "nll", "brier"):
            self.add_state(name, default=torch.zeros(0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: Tensor, labels: Tensor) -> None:
        """Add a batch.

        Args:
            probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
            labels: Integer labels ``(B,)``.
        """
        probs = as_ensemble(probs, labels, validate=self.validate)
        stats = _sample_stats(probs, labels, self.eps)
        _lazy_member_state(self, ("correct", "nll", "brier"), (1 + probs.shape[0],))
        for name, values in stats.items():  # values: (1 + M, B)
            state = getattr(self, name)
            setattr(self, name, state + values.sum(dim=1).to(state.device))
        self.n += probs.shape[1]

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"acc", "nll", "brier"}`` (0-d) and ``{"member_acc", …}`` (``(M,)``) tensors.

        (torchmetrics squeezes the ``(M,)`` member tensors to 0-d when M = 1.)

        Raises:
            ValueError: If no sample was seen.
        """
        if int(self.n) == 0:
            raise ValueError("ClassificationAccumulator.compute() called before any sample")
        out: dict[str, Tensor] = {}
        for name, key in (("correct", "acc"), ("nll", "nll"), ("brier", "brier")):
            mean = getattr(self, name) / self.n  # (1 + M,)
            out[key] = mean[0]
            out[f"member_{key}"] = mean[1:]
        return out
