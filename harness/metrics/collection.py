"""One object that streams every clean-test-set metric of an ensemble into a JSON-friendly dict.

Usage::

    metrics = EnsembleMetrics()
    for probs, labels in batches:  # probs: (M, B, K) member probabilities, labels: (B,)
        metrics.update(probs, labels)
    record["metrics"]["clean"] = metrics.compute()

    ood = OODScores()  # per (ID, OOD) pair; see harness.metrics.ood
    ...

The definitions, conventions and references are in the modules of :mod:`harness.metrics`:
:mod:`~harness.metrics.classification` (acc, nll, brier), :mod:`~harness.metrics.calibration`
(ece, aece, aurc), :mod:`~harness.metrics.diversity` (disagreement, mi, kl) and
:mod:`~harness.metrics.ood`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

# The top-level keys of EnsembleMetrics.compute besides "members": one list, defined with the
# record format, so the engine writes exactly what the reporter reads.
from harness.contract.record import ENSEMBLE_METRIC_KEYS
from harness.metrics.calibration import N_BINS, CalibrationAccumulator
from harness.metrics.classification import NLL_EPS, ClassificationAccumulator, as_ensemble
from harness.metrics.diversity import DiversityAccumulator
from harness.metrics.ood import OOD_CONVENTION, OODScores

__all__ = [
    "ENSEMBLE_METRIC_KEYS",
    "MEMBER_METRIC_KEYS",
    "OOD_CONVENTION",
    "EnsembleMetrics",
    "OODScores",
]

#: Keys of ``compute()["members"]``; each maps to a list of M floats.
MEMBER_METRIC_KEYS = ("acc", "nll", "brier", "ece")


class EnsembleMetrics(nn.Module):
    """Streaming accuracy, NLL, Brier, ECE, adaptive ECE, AURC, diversity and per-member metrics.

    The ensemble prediction is the mean of member probabilities (Lakshminarayanan et al., 2017).
    Memory: O(M · n_bins) sums plus 9 bytes per sample (the ensemble's confidence and
    correctness, needed by the adaptive ECE and the AURC); probabilities are never stored.
    ``compute()`` equals the functional metrics on the concatenation of all batches. Being an
    ``nn.Module``, ``.to(device)`` moves every state (do it once, to the device of the model's
    outputs, to avoid per-batch copies); each batch is cast to float64.

    Args:
        n_bins: Bins of the ECE and adaptive ECE (15 by default).
        eps: Clamp of probabilities inside logarithms (NLL, KL); see
            :data:`~harness.metrics.classification.NLL_EPS`.
        validate: Check every batch (shapes, labels, and that probs are probabilities).
        **kwargs: Passed to each :class:`torchmetrics.Metric` accumulator.
    """

    def __init__(
        self, n_bins: int = N_BINS, eps: float = NLL_EPS, validate: bool = True, **kwargs: Any
    ) -> None:
        super().__init__()
        self.validate = validate
        self.classification = ClassificationAccumulator(eps=eps, validate=False, **kwargs)
        self.calibration = CalibrationAccumulator(n_bins=n_bins, validate=False, **kwargs)
        self.diversity = DiversityAccumulator(eps=eps, validate=False, **kwargs)

    def update(self, probs: Tensor, labels: Tensor) -> None:
        """Add a batch.

        Args:
            probs: Member probabilities ``(M, B, K)`` (``(B, K)`` is read as M = 1).
            labels: Integer labels ``(B,)``.

        Raises:
            ValueError: On bad shapes, labels or non-probabilities, or a changed M.
        """
        probs = as_ensemble(probs, labels, validate=self.validate)  # float64 (M, B, K), once
        self.classification.update(probs, labels)
        self.calibration.update(probs, labels)
        self.diversity.update(probs)

    def compute(self) -> dict[str, Any]:
        """Compute every metric over all batches seen since the last reset.

        Returns:
            ``{"acc", "nll", "brier", "ece", "aece", "aurc", "disagreement", "mi", "kl"}`` as
            Python floats, plus ``"members": {"acc", "nll", "brier", "ece"}``, each a list of M
            Python floats (member m's metric on its own).

        Raises:
            ValueError: If no batch was seen.
        """
        if int(self.classification.n) == 0:  # raise before torchmetrics warns about it
            raise ValueError("EnsembleMetrics.compute() called before any sample")
        values: dict[str, Tensor] = {
            **self.classification.compute(),
            **self.calibration.compute(),
            **self.diversity.compute(),
        }
        out: dict[str, Any] = {key: float(values[key]) for key in ENSEMBLE_METRIC_KEYS}
        out["members"] = {
            # torchmetrics squeezes a (1,) result to 0-d when M = 1: reshape back to (M,).
            key: values[f"member_{key}"].reshape(-1).tolist()
            for key in MEMBER_METRIC_KEYS
        }
        return out

    def reliability(self) -> dict[str, list]:
        """The ensemble's 15 reliability bins: count, mean confidence and accuracy per bin
        (:func:`~harness.metrics.calibration.reliability_bins`)."""
        return self.calibration.reliability()

    def member_reliability(self) -> list[dict[str, list]]:
        """Each member's 15 reliability bins, as :meth:`reliability` (M of them)."""
        return [self.calibration.reliability(m) for m in range(self.calibration.members)]

    def reset(self) -> None:
        """Forget every batch."""
        self.classification.reset()
        self.calibration.reset()
        self.diversity.reset()
