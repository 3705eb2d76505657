"""Calibration and selective-prediction metrics: ECE, adaptive ECE and AURC.

All three read the *top-label confidence* ``conf_i = max_k p̄_ik`` of the ensemble mean
``p̄ = mean_m p_m`` (probabilities, never logits; see :mod:`harness.metrics.classification`) and
whether the top label is right, ``correct_i = 1[argmax_k p̄_ik = y_i]``.

- **ECE** (Naeini et al., 2015; Guo et al., 2017): 15 equal-width bins, L1,
  ``ECE = Σ_b (|B_b| / N) · |acc(B_b) − conf(B_b)|`` with bins ``B_b = (b/15, (b+1)/15]`` —
  half-open on the left, as in Guo et al.: a confidence exactly on an edge ``k/15`` belongs to
  the *lower* bin, and ``conf = 1.0`` to the last bin. (A confidence of exactly 0, impossible for a
  top label, would go to the first bin.)
- **Adaptive ECE** (Nixon et al., 2019, top-label variant): the same L1 sum over 15 *equal-mass*
  bins: samples sorted by confidence (stable sort, so tied confidences keep their input order)
  and split into 15 consecutive groups whose sizes differ by at most one (the first
  ``N mod 15`` groups hold one more, as ``torch.tensor_split``). With fewer than 15 samples every
  sample is its own bin.
- **AURC** (Geifman et al., 2018): area under the risk–coverage curve when samples are accepted
  in order of decreasing confidence: ``AURC = (1/N) Σ_{k=1..N} r(k/N)`` where ``r(k/N)`` is the
  error rate among the k most confident samples. Samples with *tied* confidence are accepted
  together: within a tie the risk is the expectation over a random order of the tied samples
  (cumulative errors interpolated linearly), so the value does not depend on input order.

Why these are written here and not taken from a library:

- torchmetrics' ``CalibrationError`` bins with ``torch.bucketize(..., right=True)``, i.e.
  ``[lo, hi)`` with an extra 16th bin for ``conf == 1.0``: a confidence on an edge ``k/15`` goes to
  the upper bin and saturated confidences are never pooled with 0.95 — not Guo et al.'s
  ``(lo, hi]`` binning. Our binning also runs on float64 sums per bin, which is what makes the
  streaming accumulator exact and O(bins) in memory.
- torch-uncertainty's ``AdaptiveCalibrationError`` sorts with an unstable sort (tie order, and so
  the value, is unspecified when tied confidences straddle a bin boundary) and returns NaN when
  N < n_bins; its helper is private. Same definition otherwise (tests compare the two).
- torch-uncertainty's ``AURC`` orders tied confidences by an unstable ``argsort`` (saturated
  float32 confidences of 1.0 are common, so the value then depends on an arbitrary order) and
  integrates with a trapezoid renormalised by ``1/(1 − 1/N)``; we use the mean selective risk
  its own docstring states, made tie-invariant.

References:
    Naeini, Cooper & Hauskrecht. Obtaining Well Calibrated Probabilities Using Bayesian Binning.
    AAAI 2015.
    Guo, Pleiss, Sun & Weinberger. On Calibration of Modern Neural Networks. ICML 2017.
    Nixon, Dusenberry, Zhang, Jerfel & Tran. Measuring Calibration in Deep Learning.
    CVPR Workshops 2019.
    Geifman, Uziel & El-Yaniv. Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers.
    ICLR 2019 (arXiv 2018).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from harness.metrics.classification import _lazy_member_state, as_ensemble, ensemble_mean

#: Number of bins of the ECE and adaptive ECE (uncertainty-baselines / Guo et al. use 15).
N_BINS = 15


def _top_label(probs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Confidence and correctness of ``probs`` ``(..., B, K)``: two ``(..., B)`` tensors."""
    conf = probs.amax(dim=-1)  # (..., B)
    correct = probs.argmax(dim=-1) == labels.to(device=probs.device, dtype=torch.long)
    return conf, correct


def confidence_and_correct(probs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Top-label confidence and correctness of the ensemble mean.

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.

    Returns:
        ``conf`` ``(B,)`` float64 = ``max_k p̄_k`` and ``correct`` ``(B,)`` bool.
    """
    probs = as_ensemble(probs, labels)
    return _top_label(ensemble_mean(probs), labels)


def calibration_bins(
    conf: Tensor, correct: Tensor, n_bins: int = N_BINS
) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-width reliability bins ``(b/n, (b+1)/n]`` (a confidence on an edge goes lower).

    Args:
        conf: Confidences in [0, 1], shape ``(..., N)``.
        correct: Correctness (bool or 0/1), same shape.
        n_bins: Number of equal-width bins.

    Returns:
        ``count``, ``conf_sum`` and ``correct_sum``, each float64 of shape ``(..., n_bins)``:
        per bin, the number of samples and the sums of their confidences and correctness
        (the accuracy and mean confidence of bin b are ``correct_sum[b] / count[b]`` and
        ``conf_sum[b] / count[b]``; useful for reliability diagrams).
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
    conf = conf.to(torch.float64)
    lead = conf.shape[:-1]
    flat_conf = conf.reshape(-1, conf.shape[-1])  # (L, N)
    flat_correct = correct.reshape(flat_conf.shape).to(torch.float64)  # (L, N)
    # Edges k/n rounded once to float64, exactly like the Python literal k/n.
    edges = torch.arange(n_bins + 1, dtype=torch.float64, device=conf.device) / n_bins
    # bucketize(right=False) returns i with edges[i-1] < x <= edges[i], so bin i-1 is (lo, hi].
    idx = (torch.bucketize(flat_conf, edges, right=False) - 1).clamp_(0, n_bins - 1)  # (L, N)
    rows = flat_conf.shape[0]
    idx = idx + n_bins * torch.arange(rows, device=conf.device).unsqueeze(1)  # (L, N) flat bin id
    out = []
    for src in (torch.ones_like(flat_conf), flat_conf, flat_correct):
        acc = torch.zeros(rows * n_bins, dtype=torch.float64, device=conf.device)
        acc.scatter_add_(0, idx.reshape(-1), src.reshape(-1))
        out.append(acc.view(*lead, n_bins))  # (..., n_bins)
    return out[0], out[1], out[2]


def reliability_bins(count: Tensor, conf_sum: Tensor, correct_sum: Tensor) -> dict[str, list]:
    """A reliability diagram's data (Guo et al., 2017, Fig. 1) from one row of bin sums.

    Args:
        count, conf_sum, correct_sum: ``(n_bins,)`` as :func:`calibration_bins` returns.

    Returns:
        ``{"count": [int], "confidence": [float | None], "accuracy": [float | None]}`` per
        equal-width bin ``(b/n, (b+1)/n]``: the number of samples, their mean top-label
        confidence and their accuracy (None for an empty bin). ``ECE = Σ_b count_b ·
        |accuracy_b − confidence_b| / Σ_b count_b``.
    """
    counts = count.tolist()
    conf = [c / n if n else None for c, n in zip(conf_sum.tolist(), counts)]
    acc = [c / n if n else None for c, n in zip(correct_sum.tolist(), counts)]
    return {"count": [int(n) for n in counts], "confidence": conf, "accuracy": acc}


def ece_from_bins(count: Tensor, conf_sum: Tensor, correct_sum: Tensor) -> Tensor:
    """L1 ECE from per-bin sums: ``Σ_b |correct_sum_b − conf_sum_b| / Σ_b count_b``.

    (``(|B_b|/N)·|acc_b − conf_b| = |correct_sum_b − conf_sum_b| / N``; empty bins add 0.)

    Args:
        count: ``(..., n_bins)`` sample counts.
        conf_sum: ``(..., n_bins)`` sums of confidences.
        correct_sum: ``(..., n_bins)`` sums of correctness.

    Returns:
        ``(...)`` float64.
    """
    return (correct_sum - conf_sum).abs().sum(dim=-1) / count.sum(dim=-1)


def ece_from_confidences(conf: Tensor, correct: Tensor, n_bins: int = N_BINS) -> Tensor:
    """Expected calibration error (L1, equal-width ``(lo, hi]`` bins) of given confidences.

    Args:
        conf: Confidences ``(N,)``.
        correct: Correctness ``(N,)``.
        n_bins: Number of bins.

    Returns:
        Scalar float64 tensor.
    """
    _check_nonempty(conf, correct)
    return ece_from_bins(*calibration_bins(conf, correct, n_bins))


def adaptive_ece_from_confidences(conf: Tensor, correct: Tensor, n_bins: int = N_BINS) -> Tensor:
    """Adaptive (equal-mass) L1 calibration error of given confidences; see the module docstring.

    Args:
        conf: Confidences ``(N,)``.
        correct: Correctness ``(N,)``.
        n_bins: Number of equal-mass bins (``min(n_bins, N)`` are used).

    Returns:
        Scalar float64 tensor.
    """
    _check_nonempty(conf, correct)
    if n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
    n = conf.numel()
    order = torch.argsort(conf, stable=True)  # ascending; ties keep input order
    gap = correct.to(torch.float64)[order] - conf.to(torch.float64)[order]  # (N,)
    nb = min(n_bins, n)
    sizes = torch.full((nb,), n // nb, dtype=torch.long, device=conf.device)
    sizes[: n % nb] += 1  # as torch.tensor_split / numpy.array_split
    bin_id = torch.repeat_interleave(torch.arange(nb, device=conf.device), sizes)  # (N,)
    per_bin = torch.zeros(nb, dtype=torch.float64, device=conf.device).scatter_add_(0, bin_id, gap)
    return per_bin.abs().sum() / n


def aurc_from_confidences(conf: Tensor, correct: Tensor) -> Tensor:
    """Area under the risk–coverage curve, tie-invariant; see the module docstring.

    Args:
        conf: Confidences ``(N,)`` (any real scores; higher = accepted first).
        correct: Correctness ``(N,)``.

    Returns:
        Scalar float64 tensor in [0, 1].
    """
    _check_nonempty(conf, correct)
    n = conf.numel()
    order = torch.argsort(conf, descending=True, stable=True)
    c = conf[order]  # (N,) descending
    err = 1.0 - correct.to(torch.float64)[order]  # (N,)
    new_group = torch.ones(n, dtype=torch.bool, device=conf.device)
    new_group[1:] = c[1:] != c[:-1]
    group = torch.cumsum(new_group.long(), 0) - 1  # (N,) tie-group id of each position
    n_groups = int(group[-1]) + 1
    g_count = torch.zeros(n_groups, dtype=torch.float64, device=conf.device)
    g_count.scatter_add_(0, group, torch.ones_like(err))
    g_err = torch.zeros_like(g_count).scatter_add_(0, group, err)
    err_before = torch.cumsum(g_err, 0) - g_err  # errors in strictly more confident groups
    start = torch.cumsum(g_count, 0) - g_count  # positions before each group
    k = torch.arange(1, n + 1, dtype=torch.float64, device=conf.device)  # coverage k/N
    # Expected errors among the top k when ties are broken at random: linear within a group.
    expected_err = err_before[group] + (k - start[group]) * (g_err / g_count)[group]  # (N,)
    return (expected_err / k).mean()


def _check_nonempty(conf: Tensor, correct: Tensor) -> None:
    if conf.ndim != 1 or conf.shape != correct.shape:
        raise ValueError(
            f"conf and correct must be 1-D of equal length, got {tuple(conf.shape)} "
            f"and {tuple(correct.shape)}"
        )
    if conf.numel() == 0:
        raise ValueError("cannot compute a calibration metric on zero samples")


def ece(probs: Tensor, labels: Tensor, n_bins: int = N_BINS) -> Tensor:
    """Expected calibration error of the ensemble mean (L1, 15 equal-width ``(lo, hi]`` bins).

    Guo et al. (2017), Naeini et al. (2015).

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.
        n_bins: Number of bins.

    Returns:
        Scalar float64 tensor in [0, 1].
    """
    return ece_from_confidences(*confidence_and_correct(probs, labels), n_bins=n_bins)


def member_ece(probs: Tensor, labels: Tensor, n_bins: int = N_BINS) -> Tensor:
    """ECE of each member on its own.

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.
        n_bins: Number of bins.

    Returns:
        ``(M,)`` float64.
    """
    probs = as_ensemble(probs, labels)
    conf, correct = _top_label(probs, labels)  # (M, B) each
    if conf.shape[-1] == 0:
        raise ValueError("cannot compute a calibration metric on zero samples")
    return ece_from_bins(*calibration_bins(conf, correct, n_bins))  # (M,)


def adaptive_ece(probs: Tensor, labels: Tensor, n_bins: int = N_BINS) -> Tensor:
    """Adaptive ECE of the ensemble mean (L1, 15 equal-mass bins; Nixon et al., 2019).

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.
        n_bins: Number of equal-mass bins.

    Returns:
        Scalar float64 tensor in [0, 1].
    """
    return adaptive_ece_from_confidences(*confidence_and_correct(probs, labels), n_bins=n_bins)


def aurc(probs: Tensor, labels: Tensor) -> Tensor:
    """Area under the risk–coverage curve of the ensemble, ranking by ``max p̄`` (Geifman 2018).

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
        labels: Integer labels ``(B,)``.

    Returns:
        Scalar float64 tensor in [0, 1]; lower is better.
    """
    return aurc_from_confidences(*confidence_and_correct(probs, labels))


class CalibrationAccumulator(Metric):
    """Streaming ECE (ensemble and per member), adaptive ECE and AURC.

    The equal-width ECE keeps per-bin float64 sums (O(M · n_bins) memory). The adaptive ECE and
    AURC need a global sort, so the ensemble's per-sample confidence (float64) and correctness
    (bool) are stored: 9 bytes per sample; member probabilities are never stored.

    Args:
        n_bins: Number of bins of both ECEs.
        validate: Check each batch with :func:`~harness.metrics.classification.as_ensemble`.
        **kwargs: Passed to :class:`torchmetrics.Metric`.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, n_bins: int = N_BINS, validate: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
        self.n_bins = n_bins
        self.validate = validate
        # (1 + M, n_bins) sums; row 0 is the ensemble. Sized on the first update.
        for name in ("bin_count", "bin_conf", "bin_correct"):
            self.add_state(name, default=torch.zeros(0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("conf", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, labels: Tensor) -> None:
        """Add a batch.

        Args:
            probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
            labels: Integer labels ``(B,)``.
        """
        probs = as_ensemble(probs, labels, validate=self.validate)
        both = torch.cat([ensemble_mean(probs).unsqueeze(0), probs], dim=0)  # (1 + M, B, K)
        conf, correct = _top_label(both, labels)  # (1 + M, B) each
        count, conf_sum, correct_sum = calibration_bins(conf, correct, self.n_bins)
        names = ("bin_count", "bin_conf", "bin_correct")
        _lazy_member_state(self, names, (both.shape[0], self.n_bins))
        for name, value in zip(names, (count, conf_sum, correct_sum)):
            state = getattr(self, name)
            setattr(self, name, state + value.to(state.device))
        self.conf.append(conf[0])
        self.correct.append(correct[0])

    def reliability(self, member: int | None = None) -> dict[str, list]:
        """The reliability bins (:func:`reliability_bins`) of the ensemble, or of one member
        (``member`` in ``0..M-1``)."""
        if self.bin_count.numel() == 0:
            raise ValueError("CalibrationAccumulator.reliability() called before any sample")
        row = 0 if member is None else member + 1
        return reliability_bins(self.bin_count[row], self.bin_conf[row], self.bin_correct[row])

    @property
    def members(self) -> int:
        """M, the number of members seen (0 before any sample)."""
        return max(self.bin_count.shape[0] - 1, 0) if self.bin_count.dim() == 2 else 0

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"ece", "aece", "aurc"}`` (0-d) and ``"member_ece"`` (``(M,)``) tensors.

        (torchmetrics squeezes the ``(M,)`` member tensors to 0-d when M = 1.)

        Raises:
            ValueError: If no sample was seen.
        """
        if self.bin_count.numel() == 0 or float(self.bin_count[0].sum()) == 0:
            raise ValueError("CalibrationAccumulator.compute() called before any sample")
        eces = ece_from_bins(self.bin_count, self.bin_conf, self.bin_correct)  # (1 + M,)
        conf, correct = dim_zero_cat(self.conf), dim_zero_cat(self.correct)
        return {
            "ece": eces[0],
            "aece": adaptive_ece_from_confidences(conf, correct, self.n_bins),
            "aurc": aurc_from_confidences(conf, correct),
            "member_ece": eces[1:],
        }
