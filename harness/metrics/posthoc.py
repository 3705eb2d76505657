"""Post-hoc calibration of an ensemble: temperature scaling and split-conformal prediction sets.

Both are fitted on held-out images of the training distribution (a validation or calibration
split, never the test set) and then applied to every evaluated batch, so the calibrated metrics
come from the same forward pass as the raw ones.

**Temperature scaling** (Guo et al., 2017): ``p̃ = softmax(z / T)`` with one scalar ``T > 0``
minimising the NLL on the held-out split. For an ensemble of member probabilities
``p_m`` ``(M, B, K)`` there are two ways to apply it:

- *pool-then-calibrate* (the default in the literature; Rahaman & Thiery, 2021): one temperature
  on the ensemble's predictive distribution, with ``z = log p̄``, ``p̄ = mean_m p_m``.
  ``argmax_k z_k = argmax_k p̄_k``, so accuracy is unchanged.
- *calibrate-then-pool* (Rahaman & Thiery, 2021; Wen et al., 2021): one temperature ``T_m`` per
  member fitted on the member's own logits, ``p̃ = mean_m softmax(log p_m / T_m)``
  (``log p_m`` = ``log_softmax(f_m)`` differs from the logits ``f_m`` by a per-row constant,
  which the softmax ignores). The ensemble's top label, and so its accuracy, may change.

The fit is torch-uncertainty's :class:`~torch_uncertainty.post_processing.TemperatureScaler`
(L-BFGS on ``1/T``, cross-entropy, here with full steps: ``lr = 1``); the tests check it against
an independent scalar fit.

**Conformal sets** (split conformal; Vovk et al., 2005; Angelopoulos & Bates, 2021) at each
target miscoverage ``α`` of ``evaluation.conformal_alpha`` (one or several): the scores of
torch-uncertainty's ``ConformalClsTHR`` (Sadinle et al., 2019), ``ConformalClsAPS`` (Romano et
al., 2020) and ``ConformalClsRAPS`` (Angelopoulos et al., 2021; penalty 0.1, k_reg 1) on the
temperature-scaled pooled distribution (the one temperature above, the library's own fit off),
thresholded at the finite-sample quantile :func:`conformal_quantile`, the ``⌈(n + 1)(1 − α)⌉``-th
smallest of the ``n`` calibration scores. On exchangeable data that gives
``1 − α ≤ P(y ∈ C(x)) ≤ 1 − α + 1/(n + 1)`` (the upper bound for scores without ties) for the
sets as the methods define them, which may be empty. Recorded per predictor: ``coverage`` and
``size`` of those sets, ``empty_rate``, and ``coverage_fallback`` / ``size_fallback`` of the sets
torch-uncertainty returns, which add the top class to every empty set (coverage then exceeds the
bound by the rate of empty sets whose top class is right; docs/methods.md, "Post-hoc calibration
and conformal sets"). The guarantee is marginal, over calibration and test draws together; the
temperature is fitted on the same split as the scores, a one-parameter dependence the theorem
does not cover. APS and RAPS draw uniform noise (randomised sets); the draws come from a fixed
seed, so a cell's sets do not depend on what ran before, and the sets of several α share them
(they are nested).

References:
    Guo, Pleiss, Sun & Weinberger. On Calibration of Modern Neural Networks. ICML 2017.
    Rahaman & Thiery. Uncertainty Quantification and Deep Ensembles. NeurIPS 2021.
    Wen, Jerfel, Muller, Dusenberry, Snoek, Lakshminarayanan & Tran. Combining Ensembles and
    Data Augmentation Can Harm Your Calibration. ICLR 2021.
    Sadinle, Lei & Wasserman. Least Ambiguous Set-Valued Classifiers with Bounded Error Levels.
    JASA 2019.
    Romano, Sesia & Candès. Classification with Valid and Adaptive Coverage. NeurIPS 2020.
    Angelopoulos, Bates, Malik & Jordan. Uncertainty Sets for Image Classifiers using Conformal
    Prediction. ICLR 2021.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Smallest probability inside a logarithm: float32 softmax underflows to exactly 0 for very
#: unlikely classes; their log is clamped here (any temperature leaves them negligible).
LOG_FLOOR = 1e-300

#: Smallest 1/T a fit returns (T = 10⁶: a uniform prediction to float64 precision).
MIN_INV_TEMPERATURE = 1e-6

#: L-BFGS iterations of the temperature fit (full steps; a handful are used in practice).
FIT_MAX_ITER = 50

#: The conformal predictors computed, by record key.
CONFORMAL_METHODS = ("thr", "aps", "raps")

#: Seed of the APS/RAPS randomisation (the same draws in a run and in ``harness evaluate``).
CONFORMAL_SEED = 0

#: How the conformal threshold is taken, stated in the record (records without it took
#: torch-uncertainty's uncorrected ``torch.quantile(scores, 1 − α)``).
QUANTILE_RULE = "ceil((n+1)(1-alpha))-th smallest calibration score"


def _as_float64(probs: Tensor) -> Tensor:
    probs = probs.to(torch.float64)
    return probs.unsqueeze(0) if probs.dim() == 2 else probs  # (M, B, K)


def pooled_logits(probs: Tensor) -> Tensor:
    """The ensemble's predictive distribution as logits, ``log p̄``.

    Args:
        probs: Member probabilities ``(M, B, K)`` (``(B, K)`` is read as M = 1).

    Returns:
        float64 ``(B, K)``: ``log(mean_m p_m)`` (floored at :data:`LOG_FLOOR`).
    """
    return _as_float64(probs).mean(0).clamp_min(LOG_FLOOR).log()  # (B, K)


def member_logits(probs: Tensor) -> Tensor:
    """Each member's log-probabilities ``log p_m`` ``(M, B, K)`` float64 (floored)."""
    return _as_float64(probs).clamp_min(LOG_FLOOR).log()


@contextmanager
def _quiet_library() -> Iterator[None]:
    """torch-uncertainty logs a warning on every fit without a model (we fit on logits, as
    its docs allow) and an error for a negative temperature (handled by the caller): silenced
    for the fit alone."""
    log = logging.getLogger()
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _loader(inputs: Tensor, labels: Tensor) -> torch.utils.data.DataLoader:
    """All of a split in one batch: the scalers and conformal predictors take a DataLoader."""
    data = torch.utils.data.TensorDataset(inputs, labels.long())
    return torch.utils.data.DataLoader(data, batch_size=max(len(labels), 1), shuffle=False)


def fit_temperature(logits: Tensor, labels: Tensor) -> float:
    """The temperature ``T`` minimising ``NLL(softmax(logits / T), labels)``.

    Args:
        logits: ``(N, K)`` logits (or log-probabilities) of the held-out split.
        labels: ``(N,)`` integer labels.

    Returns:
        ``T > 0`` as a Python float.

    Raises:
        ValueError: an empty split, or the fit did not end at a finite positive temperature.
    """
    from torch_uncertainty.post_processing import TemperatureScaler

    if len(labels) == 0:
        raise ValueError("temperature scaling needs at least one held-out sample")
    logits = logits.detach().to(torch.float64)
    # L-BFGS's full step (lr 1) rather than the library's default 0.1: on this convex scalar
    # problem it converges in a few iterations, where 0.1 spends its 100 on the approach and
    # can stop short (measured against scipy's bounded fit: 0.07 s and 4e-6 relative error
    # against 0.45 s and 1e-4, and a default-lr fit ended at T < 0 for T* = 43).
    scaler = TemperatureScaler(model=nn.Identity(), lr=1.0, max_iter=FIT_MAX_ITER)
    scaler.inv_temp = nn.Parameter(torch.ones(1, dtype=torch.float64))  # float64 like the data
    with _quiet_library():
        scaler.fit(_loader(logits, labels), progress=False)
    inv = float(scaler.inv_temp.detach())
    if not math.isfinite(inv):
        raise ValueError(f"temperature scaling diverged (1/T = {inv})")
    # The NLL is convex in 1/T; an unconstrained optimum at 1/T ≤ 0 (predictions no better than
    # chance on the split, or anti-correlated) puts the best positive temperature at infinity,
    # the uniform prediction: kept finite, and JSON-writable, as 1/T = MIN_INV_TEMPERATURE.
    return 1.0 / max(inv, MIN_INV_TEMPERATURE)


def _conformal(name: str) -> Any:
    """torch-uncertainty's predictor of ``name``, kept for its score functions (its ``alpha`` is
    unused: the quantile is ours, :func:`conformal_quantile`)."""
    from torch_uncertainty.post_processing import (
        ConformalClsAPS,
        ConformalClsRAPS,
        ConformalClsTHR,
    )

    cls = {"thr": ConformalClsTHR, "aps": ConformalClsAPS, "raps": ConformalClsRAPS}[name]
    # enable_ts=False: the inputs are already temperature-scaled logits (one fit for all).
    return cls(alpha=0.1, model=nn.Identity(), enable_ts=False)


def conformal_scores(
    name: str, predictor: Any, probs: Tensor, labels: Tensor | None = None
) -> Tensor:
    """Non-conformity scores of the temperature-scaled probabilities ``probs`` ``(B, K)``.

    Hand-written around the library, not through its ``fit``/``conformal``: ``fit`` keeps only
    its uncorrected quantile (not the scores, so the ``(n + 1)`` correction cannot be applied
    after it) and ``conformal`` adds the top class to every empty set, which is what this module
    reports separately. The scores themselves are the library's: APS's and RAPS's
    ``_calculate_single_label`` / ``_calculate_all_labels`` (the methods its ``fit`` and
    ``conformal`` call; private in torch-uncertainty 0.13, pinned ``<0.14`` in pyproject.toml),
    THR's ``1 − p`` as in ``ConformalClsTHR.fit`` (it has no score method). Randomised scores
    draw from the global CPU generator: call inside :func:`_seeded`.

    Args:
        name: One of :data:`CONFORMAL_METHODS`.
        predictor: Its torch-uncertainty predictor (:func:`_conformal`).
        probs: ``(B, K)`` probabilities.
        labels: ``(B,)``: the score of each row's label ``(B,)``; None: of every class ``(B, K)``.
    """
    if name == "thr":
        scores = 1.0 - probs
        return scores if labels is None else scores.gather(1, labels.view(-1, 1)).squeeze(1)
    if labels is None:
        return predictor._calculate_all_labels(probs)
    return predictor._calculate_single_label(probs, labels)


def conformal_quantile(scores: Tensor, alpha: float) -> float:
    """The split-conformal threshold: the ``⌈(n + 1)(1 − α)⌉``-th smallest of ``n`` calibration
    scores (Vovk et al., 2005; Angelopoulos & Bates, 2021, eq. 1), ``inf`` when that rank
    exceeds ``n`` (fewer than ``1/α − 1`` scores: only the set of every class is guaranteed).

    With it, ``P(y ∈ C(x)) ≥ 1 − α`` on exchangeable data, and ``≤ 1 − α + 1/(n + 1)`` when the
    scores have no ties. Hand-written: torch-uncertainty 0.13 takes
    ``torch.quantile(scores, 1 − α)`` (linear interpolation at rank ``(n − 1)(1 − α) + 1``),
    which lacks the ``(n + 1)`` correction and can fall short of ``1 − α`` by up to ``~1/n``.
    """
    n = len(scores)
    # minus a rounding margin: (n + 1)(1 − α) is an integer for many (n, α) that float
    # arithmetic puts a hair above it (ceil would then take the next rank).
    rank = math.ceil((n + 1) * (1.0 - alpha) - 1e-9)
    if rank > n:
        return math.inf
    return float(scores.to(torch.float64).kthvalue(max(rank, 1)).values)


def conformal_alphas(alpha: float | Sequence[float]) -> tuple[float, ...]:
    """``evaluation.conformal_alpha`` (one α or several) as a tuple, each checked in (0, 1).

    Raises:
        ValueError: none, a repeated α, or one outside (0, 1).
    """
    alphas = (float(alpha),) if isinstance(alpha, int | float) else tuple(map(float, alpha))
    if not alphas:
        raise ValueError("conformal alpha: give at least one value")
    if len(set(alphas)) != len(alphas):
        raise ValueError(f"conformal alpha: repeated values in {list(alphas)}")
    for a in alphas:
        if not 0 < a < 1:
            raise ValueError(f"conformal alpha must be in (0, 1), got {a}")
    return alphas


def conformal_key(method: str, alpha: float, several: bool) -> str:
    """The record's key of one set predictor: ``aps`` when the suite gives one α (the record's
    ``alpha`` states it), ``aps@0.05`` when it gives several."""
    return f"{method}@{float(alpha)!r}" if several else method


@dataclass(frozen=True)
class ConformalRule:
    """One fitted set predictor: a method's score thresholded at ``quantile`` for ``alpha``."""

    method: str
    alpha: float
    quantile: float  # inf: every class (too few calibration scores for this α)


class ConformalSets(NamedTuple):
    """A batch's sets of one predictor, both ways (bool ``(B, K)`` masks).

    ``sets``: as the method defines them, ``{k : s(x, k) ≤ q̂}`` (may be empty; what the coverage
    guarantee is about). ``fallback``: as torch-uncertainty returns them, the lowest-score class
    (the top class) added to every empty set.
    """

    sets: Tensor
    fallback: Tensor


@contextmanager
def one_thread() -> Iterator[None]:
    """The post-hoc arithmetic on one intra-op thread: its tensors are (B, K), too small for
    threads to pay, and on a busy machine each op's thread hand-off costs more than the op
    (measured: the temperature fit 2.3 s on two threads of a loaded 2-core machine, 0.24 s on
    one)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The CPU generator seeded with ``seed`` inside, restored after (the sets' noise never
    moves the draws of the evaluation around them). Only the CPU generator: the sets are
    computed on CPU tensors. Not ``fork_rng`` + ``torch.manual_seed``, which also seed every
    accelerator's generators: 0.47 ms a batch against 5 µs, measured, for the same draws."""
    state = torch.get_rng_state()
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


@dataclass
class PosthocCalibration:
    """A fitted post-hoc calibration of one ensemble, applied batch by batch.

    Attributes:
        temperature: pool-then-calibrate ``T`` (one for the ensemble's mean).
        member_temperatures: calibrate-then-pool ``T_m`` per member, or None when not asked.
        alpha: the conformal sets' target miscoverage as configured: one α, or a tuple of them.
        fitted_on: the split's name (``val`` or ``calibration``) and ``n`` its size.
        conformal: the fitted set predictors by record key (:func:`conformal_key`).
        scorers: torch-uncertainty's predictors by :data:`CONFORMAL_METHODS` (their scores).
        seed: of the APS/RAPS noise: ``seed`` on the calibration split, ``seed + 1`` on every
            evaluated batch (test noise independent of the calibration noise).
        split_nll: the held-out split's NLL (mean, nats) of the pooled prediction before and
            after the temperature, ``{"raw": …, "ts": …}``: what the fit did on its own data.
    """

    temperature: float
    member_temperatures: list[float] | None
    alpha: float | tuple[float, ...]
    fitted_on: str
    n: int
    conformal: dict[str, ConformalRule] = field(default_factory=dict, repr=False)
    scorers: dict[str, Any] = field(default_factory=dict, repr=False)
    seed: int = CONFORMAL_SEED
    split_nll: dict[str, float] | None = None

    @classmethod
    def fit(
        cls,
        probs: Tensor,
        labels: Tensor,
        *,
        alpha: float | Sequence[float] = 0.1,
        members: bool = False,
        fitted_on: str = "calibration",
        temperature: float | None = None,
        seed: int = CONFORMAL_SEED,
    ) -> PosthocCalibration:
        """Fit every post-hoc method on a held-out split.

        Args:
            probs: Member probabilities of the held-out split ``(M, N, K)``.
            labels: ``(N,)`` integer labels.
            alpha: Conformal miscoverage in (0, 1), or several (one set predictor each).
            members: Also fit one temperature per member (calibrate-then-pool).
            fitted_on: The split's name, kept in the record.
            temperature: The pooled temperature fixed in advance instead of fitted on the
                split (1.0: the probabilities as they are); the conformal scores are then
                independent of the split but through the quantile, as the guarantee assumes.
            seed: Of the randomised scores' noise (see the class's attributes).
        """
        alphas = conformal_alphas(alpha)
        configured = alphas[0] if isinstance(alpha, int | float) else alphas
        if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {temperature}")
        with one_thread():
            return cls._fit(probs, labels, configured, members, fitted_on, temperature, seed)

    @classmethod
    def _fit(
        cls,
        probs: Tensor,
        labels: Tensor,
        alpha: float | tuple[float, ...],
        members: bool,
        fitted_on: str,
        temperature: float | None,
        seed: int,
    ) -> PosthocCalibration:
        labels = labels.long()
        pooled = pooled_logits(probs)  # (N, K)
        if temperature is None:
            temperature = fit_temperature(pooled, labels)
        member_t = None
        if members:
            member_t = [fit_temperature(z, labels) for z in member_logits(probs)]
        out = cls(temperature, member_t, alpha, fitted_on, len(labels), seed=seed)
        out.split_nll = {  # pooled = log p̄: its cross-entropy is the raw ensemble's NLL
            "raw": float(F.cross_entropy(pooled, labels)),
            "ts": float(F.cross_entropy(pooled / temperature, labels)),
        }
        scaled = (pooled / temperature).softmax(-1)  # (N, K)
        alphas, several = conformal_alphas(alpha), isinstance(alpha, tuple)
        with _seeded(seed):
            for name in CONFORMAL_METHODS:
                predictor = _conformal(name)
                scores = conformal_scores(name, predictor, scaled, labels)  # (N,)
                out.scorers[name] = predictor
                for a in alphas:  # one draw of scores, one threshold per α: nested sets
                    key = conformal_key(name, a, several)
                    out.conformal[key] = ConformalRule(name, a, conformal_quantile(scores, a))
        return out

    @property
    def alphas(self) -> tuple[float, ...]:
        """Every α of the sets."""
        return conformal_alphas(self.alpha)

    def apply(self, probs: Tensor) -> tuple[dict[str, Tensor], dict[str, ConformalSets]]:
        """:meth:`scaled` and :meth:`sets` of one batch, the pooled logits computed once."""
        with one_thread():
            pooled = pooled_logits(probs) / self.temperature  # (B, K)
            return self.scaled(probs, pooled), self.sets(probs, pooled)

    def scaled(self, probs: Tensor, pooled: Tensor | None = None) -> dict[str, Tensor]:
        """The calibrated predictions of a batch.

        Args:
            probs: Member probabilities ``(M, B, K)``.

        Returns:
            ``{"ts": (1, B, K)}`` (pool-then-calibrate) and, when fitted,
            ``{"ts_members": (M, B, K)}`` (each member scaled by its own temperature; their
            mean is the calibrate-then-pool prediction), float64 probabilities.
        """
        if pooled is None:
            pooled = pooled_logits(probs) / self.temperature
        out = {"ts": pooled.softmax(-1).unsqueeze(0)}
        if self.member_temperatures is not None:
            t = torch.tensor(self.member_temperatures, dtype=torch.float64).view(-1, 1, 1)
            out["ts_members"] = (member_logits(probs) / t).softmax(-1)  # (M, B, K)
        return out

    def sets(self, probs: Tensor, pooled: Tensor | None = None) -> dict[str, ConformalSets]:
        """Conformal prediction sets of a batch, by record key, with and without the fallback
        (``pooled``: the batch's scaled pooled logits, when already computed)."""
        scaled = pooled_logits(probs) / self.temperature if pooled is None else pooled  # (B, K)
        p = scaled.softmax(-1)
        with _seeded(self.seed + 1):
            scores = {m: conformal_scores(m, s, p) for m, s in self.scorers.items()}  # (B, K)
        out = {}
        for key, rule in self.conformal.items():
            s = scores[rule.method]
            inside = s <= rule.quantile
            # torch-uncertainty's fallback (ConformalClsAPS.conformal; THR's "always the top-1"
            # is the same set): the lowest-score class added where the set is empty.
            empty = ~inside.any(-1, keepdim=True)
            lowest = torch.zeros_like(inside).scatter_(1, s.argmin(-1, keepdim=True), True)
            out[key] = ConformalSets(inside, inside | (empty & lowest))
        return out

    def to_json(self) -> dict[str, Any]:
        """What the record keeps of the fit (``alpha`` as configured: a number or a list)."""
        out: dict[str, Any] = {
            "method": "temperature_scaling",
            "fitted_on": self.fitted_on,
            "n": self.n,
            "temperature": self.temperature,
            "alpha": list(self.alpha) if isinstance(self.alpha, tuple) else self.alpha,
            "quantile_rule": QUANTILE_RULE,
            "seed": self.seed,
            # null: too few calibration scores for that α (every class is in every set)
            "quantiles": {
                k: (r.quantile if math.isfinite(r.quantile) else None)
                for k, r in self.conformal.items()
            },
        }
        if self.member_temperatures is not None:
            out["member_temperatures"] = list(self.member_temperatures)
        if self.split_nll is not None:
            out["split_nll"] = dict(self.split_nll)
        return out


class ShiftAccumulator:
    """Accuracy, NLL and ECE of an ensemble's predictions, streamed: what a corruption cell
    records (``metrics.corruption.cells``), without the full metric collection's set-up per cell.
    Same definitions as :mod:`harness.metrics` (NLL clamped at ``NLL_EPS``, 15 equal-width bins)."""

    def __init__(self) -> None:
        self.n = 0
        self.correct = 0.0
        self.nll_sum = 0.0
        self.bins: tuple[Tensor, Tensor, Tensor] | None = None

    def update(self, probs: Tensor, labels: Tensor) -> None:
        """Add a batch of member probabilities ``(M, B, K)`` (float64) and labels ``(B,)``."""
        from harness.metrics.calibration import calibration_bins
        from harness.metrics.classification import NLL_EPS

        mean = probs.mean(0)  # (B, K)
        labels = labels.long()
        conf, pred = mean.max(-1)
        correct = pred == labels
        true = mean.gather(1, labels.unsqueeze(1)).squeeze(1)
        self.nll_sum += float(-true.clamp_min(NLL_EPS).log().sum())
        self.correct += float(correct.sum())
        self.n += len(labels)
        bins = calibration_bins(conf, correct)
        self.bins = bins if self.bins is None else tuple(a + b for a, b in zip(self.bins, bins))

    def compute(self) -> dict[str, float]:
        """``{"acc", "nll", "ece"}``."""
        from harness.metrics.calibration import ece_from_bins

        if self.n == 0 or self.bins is None:
            raise ValueError("ShiftAccumulator.compute() called before any sample")
        return {
            "acc": self.correct / self.n,
            "nll": self.nll_sum / self.n,
            "ece": float(ece_from_bins(*self.bins)),
        }


class SetAccumulator:
    """Streaming coverage, mean size and empty-set rate of conformal prediction sets, of the sets
    as defined and of torch-uncertainty's (the top class added to an empty set)."""

    def __init__(self) -> None:
        self.n = 0
        self.covered = 0
        self.size = 0
        self.empty = 0
        self.covered_fallback = 0
        self.size_fallback = 0

    def update(self, sets: ConformalSets, labels: Tensor) -> None:
        """Add a batch's sets (:meth:`PosthocCalibration.sets`) with their labels ``(B,)``."""
        labels = labels.long().to(sets.sets.device).view(-1, 1)
        self.covered += int(sets.sets.gather(1, labels).sum())
        self.size += int(sets.sets.sum())
        self.empty += int((~sets.sets.any(-1)).sum())
        self.covered_fallback += int(sets.fallback.gather(1, labels).sum())
        self.size_fallback += int(sets.fallback.sum())
        self.n += len(labels)

    def compute(self) -> dict[str, float]:
        """``coverage`` ``P(y ∈ C)`` and ``size`` ``E|C|`` of the sets as defined,
        ``coverage_fallback`` and ``size_fallback`` of torch-uncertainty's, ``empty_rate``
        ``P(C = ∅)`` (``size_fallback = size + empty_rate``; ``coverage_fallback − coverage`` is
        the rate of empty sets whose top class is right)."""
        if self.n == 0:
            raise ValueError("SetAccumulator.compute() called before any sample")
        return {
            "coverage": self.covered / self.n,
            "size": self.size / self.n,
            "coverage_fallback": self.covered_fallback / self.n,
            "size_fallback": self.size_fallback / self.n,
            "empty_rate": self.empty / self.n,
        }
