"""Out-of-distribution detection: scores, AUROC, AUPR-In, AUPR-Out and FPR95 in both conventions.

Every score is *higher = more in-distribution*. The metrics (stored verbatim in result records as
:data:`OOD_CONVENTION`):

- ``auroc``: area under the ROC curve of separating ID from OOD, = P(score_ID > score_OOD) +
  ½ P(tie). It is the same whichever class is called positive (flipping both the positive class
  and the sign of the score leaves it unchanged).
- ``aupr_in``: average precision (step-wise, scikit-learn's ``average_precision_score``) with ID
  positive and the score as is.
- ``aupr_out``: average precision with OOD positive and the score negated.
- ``fpr95`` — **OpenOOD / torch-uncertainty convention, OOD is the positive class**: with the
  OOD-ness ``−score`` thresholded so that at least 95% of OOD samples are detected (flagged OOD,
  ``score ≤ c`` with ``c`` the smallest such cut), the fraction of ID samples that are also
  flagged OOD (ID wrongly rejected). This is OpenOOD's ``auc_and_fpr_recall``
  (``roc_curve(ood_indicator, -conf)``, ``fpr[argmax(tpr >= 0.95)]``,
  Jingkang50/OpenOOD ``openood/evaluators/metrics.py`` @ a59cdac) and torch-uncertainty 0.13's
  ``FPR95(pos_label=1)`` on OOD targets in its classification routine.
- ``fpr95_id`` — **Hendrycks & Gimpel (2017) / ODIN convention, ID is the positive class**: with
  ``t`` the largest threshold that keeps at least 95% of ID samples (``score ≥ t``), the fraction
  of OOD samples that are also kept (OOD wrongly accepted as ID).

Both are lower-is-better and both use tie-aware thresholds (a group of tied scores is never split,
as no threshold could split it): torch-uncertainty's ``FPRx`` with the positive label and score
sign of each convention.

Scores of an ensemble ``(M, B, K)`` with mean ``p̄``:

- ``msp``: maximum softmax probability of the mean, ``max_k p̄_k`` (Hendrycks & Gimpel, 2017);
- ``entropy``: negative predictive entropy, ``−H(p̄)`` (entropy of the mean, not the mean member
  entropy that torch-uncertainty's ``Entropy`` returns on ``(B, M, K)``);
- ``mi``: negative mutual information, ``−(H(p̄) − mean_m H(p_m))``.

Scores of the member logits ``z`` ``(M, B, K)``, where the model returns logits (every built-in
method; an outside model declared ``outputs="probs"`` has none: its log-probabilities would give
an energy of 0 for every input), each a member's score averaged over the members (see
docs/methods.md, "OOD detectors"):

- ``energy``: negative free energy at T = 1, ``mean_m logsumexp_k z_{m,k}`` (Liu et al., 2020;
  pytorch-ood's ``EnergyBased.score``, negated);
- ``max_logit``: ``mean_m max_k z_{m,k}`` (Hendrycks et al., 2022; pytorch-ood's
  ``MaxLogit.score``, negated).

Implementations: AUROC and both AUPRs are torchmetrics' exact (``thresholds=None``)
``binary_auroc`` / ``binary_average_precision``. torchmetrics applies a sigmoid to scores outside
[0, 1]; to keep the ranking exact (a float sigmoid can tie distinct large scores) scores are
first replaced by their normalised dense ranks, which changes none of these rank-based metrics.
The entropy is one line of ``torch.special.entr`` (0 log 0 = 0).

References:
    Hendrycks & Gimpel. A Baseline for Detecting Misclassified and Out-of-Distribution Examples
    in Neural Networks. ICLR 2017.
    Yang, Wang, Zou, Zhou, Ding, Peng, Wang, Chen, Li, Sun, Du, Zhou, Zhang, Hendrycks, Li & Liu.
    OpenOOD: Benchmarking Generalized Out-of-Distribution Detection. NeurIPS 2022 (Datasets and
    Benchmarks).
    Liang, Li & Srikant. Enhancing The Reliability of Out-of-distribution Image Detection in
    Neural Networks (ODIN). ICLR 2018.
    Lakshminarayanan, Pritzel & Blundell. Simple and Scalable Predictive Uncertainty Estimation
    using Deep Ensembles. NeurIPS 2017.
    Liu, Wang, Owens & Li. Energy-based Out-of-distribution Detection. NeurIPS 2020.
    Hendrycks, Basart, Mazeika, Zou, Kwon, Mostajabi, Steinhardt & Song. Scaling
    Out-of-Distribution Detection for Real-World Settings. ICML 2022.
    Kirchheim, Filax & Ortmeier. PyTorch-OOD: A Library for Out-of-Distribution Detection based
    on PyTorch. CVPR Workshops 2022.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor
from torch_uncertainty.metrics.classification.fpr import FPRx
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_auroc, binary_average_precision
from torchmetrics.utilities.data import dim_zero_cat

# How OOD metrics are to be read: one text, defined with the record format and stored in it.
from harness.contract.record import OOD_CONVENTION as OOD_CONVENTION
from harness.metrics.classification import as_ensemble, ensemble_mean
from harness.metrics.diversity import _mutual_information_per_sample

#: Keys of the dict returned by :func:`ood_metrics`, in order.
OOD_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_id")

#: Which class is positive in each FPR95 convention.
FPR_POSITIVE = {"fpr95": "ood", "fpr95_id": "id"}


def msp_score(probs: Tensor) -> Tensor:
    """Maximum softmax probability of the ensemble mean, ``max_k p̄_k``.

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.

    Returns:
        ``(B,)`` float64; higher = more in-distribution.
    """
    return _msp(as_ensemble(probs))


def entropy_score(probs: Tensor) -> Tensor:
    """Negative predictive entropy of the ensemble mean, ``−H(p̄)`` in nats.

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.

    Returns:
        ``(B,)`` float64 in ``[−log K, 0]``; higher = more in-distribution.
    """
    return _neg_entropy(as_ensemble(probs))


def mi_score(probs: Tensor) -> Tensor:
    """Negative mutual information, ``−(H(p̄) − mean_m H(p_m))`` in nats (0 for M = 1).

    Args:
        probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.

    Returns:
        ``(B,)`` float64 in ``[−log M, 0]``; higher = more in-distribution.
    """
    return _neg_mi(as_ensemble(probs))


def energy_score(logits: Tensor) -> Tensor:
    """Negative free energy (T = 1) of each member's logits, averaged over the members:
    ``mean_m logsumexp_k z_{m,k}`` — pytorch-ood's ``EnergyBased.score`` negated.

    Args:
        logits: Member logits ``(M, B, K)`` or ``(B, K)``.

    Returns:
        ``(B,)`` float64; higher = more in-distribution.
    """
    return _neg_energy(as_logits(logits))


def max_logit_score(logits: Tensor) -> Tensor:
    """Maximum logit of each member, averaged over the members: ``mean_m max_k z_{m,k}`` —
    pytorch-ood's ``MaxLogit.score`` negated.

    Args:
        logits: Member logits ``(M, B, K)`` or ``(B, K)``.

    Returns:
        ``(B,)`` float64; higher = more in-distribution.
    """
    return _max_logit(as_logits(logits))


def as_logits(logits: Tensor, *, validate: bool = True) -> Tensor:
    """Check member logits and return them as float64 ``(M, B, K)``.

    Args:
        logits: ``(M, B, K)``, or a single model's ``(B, K)`` (read as M = 1).
        validate: Also check that every value is finite (one device-host synchronisation).

    Raises:
        ValueError: On a wrong shape or dtype, or (with ``validate``) NaN or infinite values.
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {type(logits).__name__}")
    if logits.ndim == 2:
        logits = logits.unsqueeze(0)  # (B, K) -> (1, B, K)
    if logits.ndim != 3 or logits.shape[0] < 1 or logits.shape[2] < 1:
        raise ValueError(f"logits must have shape (M, B, K) or (B, K), got {tuple(logits.shape)}")
    if logits.device.type == "mps":  # MPS has no float64
        logits = logits.cpu()
    logits = logits.to(torch.float64)
    if validate and not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contain NaN or infinite values")
    return logits


def _per_member(score: Callable[[Tensor], Tensor], logits: Tensor) -> Tensor:
    """A pytorch-ood outlier score (``(N, K)`` → ``(N,)``, higher = OOD) of every member's
    logits ``(M, B, K)``, negated and averaged over the members: ``(B,)``."""
    m, b, k = logits.shape
    return -score(logits.reshape(m * b, k)).view(m, b).mean(dim=0)


def _neg_energy(logits: Tensor) -> Tensor:
    from pytorch_ood.detector import EnergyBased  # 0.4 s on first use: not at import

    return _per_member(lambda z: EnergyBased.score(z, t=1.0), logits)


def _max_logit(logits: Tensor) -> Tensor:
    from pytorch_ood.detector import MaxLogit

    return _per_member(MaxLogit.score, logits)


def _msp(probs: Tensor) -> Tensor:
    return ensemble_mean(probs).amax(dim=-1)  # (M, B, K) -> (B,)


def _neg_entropy(probs: Tensor) -> Tensor:
    return -torch.special.entr(ensemble_mean(probs)).sum(dim=-1)  # (B,)


def _neg_mi(probs: Tensor) -> Tensor:
    return -_mutual_information_per_sample(probs)  # (B,)


#: Score name → function of float64 ``(M, B, K)`` probabilities returning ``(B,)`` scores.
_SCORE_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "msp": _msp,
    "entropy": _neg_entropy,
    "mi": _neg_mi,
}
#: Score name → public score function (validates its input).
OOD_SCORES: dict[str, Callable[[Tensor], Tensor]] = {
    "msp": msp_score,
    "entropy": entropy_score,
    "mi": mi_score,
}
#: Logit score name → function of float64 ``(M, B, K)`` logits returning ``(B,)`` scores.
_LOGIT_SCORE_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "energy": _neg_energy,
    "max_logit": _max_logit,
}
#: Logit score name → public score function of member logits (validates its input).
LOGIT_OOD_SCORES: dict[str, Callable[[Tensor], Tensor]] = {
    "energy": energy_score,
    "max_logit": max_logit_score,
}


def _check_scores(id_scores: Tensor, ood_scores: Tensor) -> tuple[Tensor, Tensor]:
    for name, s in (("id_scores", id_scores), ("ood_scores", ood_scores)):
        if not isinstance(s, Tensor) or s.ndim != 1:
            raise ValueError(f"{name} must be a 1-D tensor of per-sample scores")
        if s.numel() == 0:
            raise ValueError(f"{name} is empty: OOD metrics need ID and OOD samples")
        if bool(torch.isnan(s).any()):
            raise ValueError(f"{name} contains NaN")
    return id_scores.to(torch.float64), ood_scores.to(torch.float64)


def _ranked(id_scores: Tensor, ood_scores: Tensor) -> tuple[Tensor, Tensor]:
    """Concatenate ``[ID, OOD]`` scores as dense ranks in [0, 1] and ID-positive targets."""
    scores = torch.cat([id_scores, ood_scores.to(id_scores.device)])  # (N_id + N_ood,)
    uniq, inverse = torch.unique(scores, sorted=True, return_inverse=True)
    ranks = inverse.to(torch.float64) / max(uniq.numel() - 1, 1)  # same order, ties kept
    target = torch.zeros(scores.numel(), dtype=torch.long, device=scores.device)
    target[: id_scores.numel()] = 1  # ID = positive
    return ranks, target


def auroc(id_scores: Tensor, ood_scores: Tensor) -> Tensor:
    """AUROC of separating ID (positive) from OOD by ``score`` (higher = ID).

    Args:
        id_scores: Scores of ID samples ``(N_id,)``.
        ood_scores: Scores of OOD samples ``(N_ood,)``.

    Returns:
        Scalar float64 tensor in [0, 1]; 1 = every ID sample scores above every OOD one.
    """
    ranks, target = _ranked(*_check_scores(id_scores, ood_scores))
    return binary_auroc(ranks, target, thresholds=None).to(torch.float64)


def aupr_in(id_scores: Tensor, ood_scores: Tensor) -> Tensor:
    """Average precision with ID as the positive class (score as is).

    Args:
        id_scores: Scores of ID samples ``(N_id,)``.
        ood_scores: Scores of OOD samples ``(N_ood,)``.

    Returns:
        Scalar float64 tensor in [0, 1].
    """
    ranks, target = _ranked(*_check_scores(id_scores, ood_scores))
    return binary_average_precision(ranks, target, thresholds=None).to(torch.float64)


def aupr_out(id_scores: Tensor, ood_scores: Tensor) -> Tensor:
    """Average precision with OOD as the positive class (score negated).

    Args:
        id_scores: Scores of ID samples ``(N_id,)``.
        ood_scores: Scores of OOD samples ``(N_ood,)``.

    Returns:
        Scalar float64 tensor in [0, 1].
    """
    id_scores, ood_scores = _check_scores(id_scores, ood_scores)
    ranks, target = _ranked(-ood_scores, -id_scores)  # OOD first = positive
    return binary_average_precision(ranks, target, thresholds=None).to(torch.float64)


def fpr_at_tpr(
    id_scores: Tensor, ood_scores: Tensor, tpr: float = 0.95, *, positive: Literal["ood", "id"]
) -> Tensor:
    """False-positive rate at a true-positive rate of ``tpr``, in either convention.

    - ``positive="ood"`` (OpenOOD, torch-uncertainty: ``fpr95``): ``c`` is the smallest cut such
      that at least ``tpr`` of the OOD samples have ``score ≤ c``; returns the fraction of ID
      samples with ``score ≤ c`` (ID rejected).
    - ``positive="id"`` (Hendrycks & Gimpel: ``fpr95_id``): ``t`` is the largest threshold such
      that at least ``tpr`` of the ID samples have ``score ≥ t``; returns the fraction of OOD
      samples with ``score ≥ t`` (OOD accepted).

    Args:
        id_scores: Scores of ID samples ``(N_id,)``, higher = more in-distribution.
        ood_scores: Scores of OOD samples ``(N_ood,)``.
        tpr: Recall of the positive class, in (0, 1].
        positive: Which class is positive; no default, so a call always names its convention.

    Returns:
        Scalar float64 tensor in [0, 1]; lower is better.
    """
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    if positive not in ("ood", "id"):
        raise ValueError(f"positive must be 'ood' or 'id', got {positive!r}")
    id_scores, ood_scores = _check_scores(id_scores, ood_scores)
    scores = torch.cat([id_scores, ood_scores.to(id_scores.device)])
    is_id = torch.zeros(scores.numel(), dtype=torch.long, device=scores.device)
    is_id[: id_scores.numel()] = 1
    if positive == "ood":  # the detector's confidence of OOD-ness is the negated score
        scores, target = -scores, 1 - is_id
    else:
        target = is_id
    with warnings.catch_warnings():  # we store the scores on purpose; silence its memory note
        warnings.filterwarnings("ignore", message=".*will save all targets", category=UserWarning)
        metric = FPRx(recall_level=tpr, pos_label=1).to(scores.device)
    metric.update(scores, target)
    return metric.compute().to(torch.float64)


def ood_metrics(id_scores: Tensor, ood_scores: Tensor) -> dict[str, float]:
    """All five OOD metrics for one score, as Python floats.

    Args:
        id_scores: Scores of ID samples ``(N_id,)`` (higher = more in-distribution).
        ood_scores: Scores of OOD samples ``(N_ood,)``.

    Returns:
        ``{"auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_id"}``; see :data:`OOD_CONVENTION`.
    """
    return {
        "auroc": float(auroc(id_scores, ood_scores)),
        "aupr_in": float(aupr_in(id_scores, ood_scores)),
        "aupr_out": float(aupr_out(id_scores, ood_scores)),
        "fpr95": float(fpr_at_tpr(id_scores, ood_scores, 0.95, positive="ood")),
        "fpr95_id": float(fpr_at_tpr(id_scores, ood_scores, 0.95, positive="id")),
    }


class OODScores(Metric):
    """Accumulates per-sample OOD scores of ID and OOD batches; computes every metric per score.

    Stores one float64 score per sample and score (never the probabilities or logits): the three
    probability scores always, the two logit scores (``energy``, ``max_logit``) when every batch
    came with its logits. For several OOD sets against one ID set, call :meth:`reset_ood`
    between OOD sets to reuse the ID scores.

    Example::

        scores = OODScores()
        for logits in id_batches:  # (M, B, K) member logits
            scores.update_id(logits.softmax(-1), logits)
        for logits in ood_batches:
            scores.update_ood(logits.softmax(-1), logits)
        scores.compute()["energy"]["auroc"]

    Args:
        validate: Check each batch with :func:`~harness.metrics.classification.as_ensemble`
            and :func:`as_logits`.
        **kwargs: Passed to :class:`torchmetrics.Metric`.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, validate: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validate = validate
        for split in ("id", "ood"):
            for name in (*_SCORE_FNS, *_LOGIT_SCORE_FNS):
                self.add_state(f"{split}_{name}", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, logits: Tensor | None = None, *, ood: bool) -> None:
        """Add a batch of ID (``ood=False``) or OOD (``ood=True``) member outputs.

        Args:
            probs: Member probabilities ``(M, B, K)`` or ``(B, K)``.
            logits: The member logits ``probs`` are the softmax of, same shape, or None where
                the model gives probabilities only (no energy or max-logit score then).
            ood: Whether the batch comes from the OOD set.

        Raises:
            ValueError: ``logits`` of another shape than ``probs`` (or see :func:`as_logits`).
        """
        probs = as_ensemble(probs, validate=self.validate)
        split = "ood" if ood else "id"
        if logits is not None:
            logits = as_logits(logits, validate=self.validate)
            if logits.shape != probs.shape:
                raise ValueError(
                    f"logits of shape {tuple(logits.shape)} do not match probs of shape "
                    f"{tuple(probs.shape)}: pass the logits whose softmax the probs are"
                )
            for name, fn in _LOGIT_SCORE_FNS.items():
                getattr(self, f"{split}_{name}").append(fn(logits))  # (B,)
        for name, fn in _SCORE_FNS.items():
            getattr(self, f"{split}_{name}").append(fn(probs))  # (B,)

    def update_id(self, probs: Tensor, logits: Tensor | None = None) -> None:
        """Add a batch of in-distribution member probabilities ``(M, B, K)`` (and logits)."""
        self.update(probs, logits, ood=False)

    def update_ood(self, probs: Tensor, logits: Tensor | None = None) -> None:
        """Add a batch of out-of-distribution member probabilities ``(M, B, K)`` (and logits)."""
        self.update(probs, logits, ood=True)

    def reset_ood(self) -> None:
        """Forget the OOD scores but keep the ID ones (to score another OOD set)."""
        for name in (*_SCORE_FNS, *_LOGIT_SCORE_FNS):
            setattr(self, f"ood_{name}", [])
        self._computed = None  # invalidate torchmetrics' cached compute()

    def compute(self) -> dict[str, dict[str, float]]:
        """Compute the five OOD metrics for each score.

        Returns:
            ``{"msp": {...}, "entropy": {...}, "mi": {...}}``, and ``"energy"``, ``"max_logit"``
            when every batch came with its logits; each inner dict with the keys
            ``"auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_id"`` as Python floats.

        Raises:
            ValueError: If no ID or no OOD sample was seen, or logits came with some batches
                only (a score of part of a set is no score of the set).
        """
        out = {}
        counts = {}
        for name in _SCORE_FNS:
            id_s, ood_s = _cat(getattr(self, f"id_{name}")), _cat(getattr(self, f"ood_{name}"))
            if id_s.numel() == 0 or ood_s.numel() == 0:
                raise ValueError("OODScores.compute() needs at least one ID and one OOD sample")
            counts = {"ID": id_s.numel(), "OOD": ood_s.numel()}
            out[name] = ood_metrics(id_s, ood_s)
        logit = {
            split: {n: _cat(getattr(self, f"{split}_{n}")) for n in _LOGIT_SCORE_FNS}
            for split in ("id", "ood")
        }
        seen = {k: logit[k.lower()]["energy"].numel() for k in counts}
        if not any(seen.values()):
            return out  # probabilities only
        for split, n in seen.items():
            if n != counts[split]:
                raise ValueError(
                    f"logits came with {n} of the {counts[split]} {split} samples: pass them "
                    "with every batch or with none"
                )
        for name in _LOGIT_SCORE_FNS:
            out[name] = ood_metrics(logit["id"][name], logit["ood"][name])
        return out


def _cat(state: list[Tensor] | Tensor) -> Tensor:
    if isinstance(state, list) and not state:
        return torch.zeros(0, dtype=torch.float64)
    return dim_zero_cat(state)
