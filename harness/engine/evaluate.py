"""Evaluation of a trained ensemble: clean test set, corruption shift, OOD detection.

Predictions stream batch by batch into the metric accumulators of :mod:`harness.metrics`;
member probabilities are (M, B, K) and the ensemble prediction is their mean (never the mean of
logits). Corrupted copies come from :mod:`harness.data._machinery.corruptions`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.contract import Evaluation, Recipe
from harness.contract.metric_spec import MetricError, MetricSpec
from harness.data._machinery.base import DatasetSpec, ImageSet, LoaderOptions, Split, limited
from harness.data._machinery.loader import make_loader
from harness.engine.eval_passes import _Passes, _step, counted
from harness.engine.train import autocast
from harness.registry import computed_metrics
from methods._base import EnsembleModel

log = logging.getLogger("harness")

if TYPE_CHECKING:
    from harness.metrics.outcomes import OutcomeAccumulator
    from harness.metrics.posthoc import PosthocCalibration
    from harness.storage.live import Heartbeat


@torch.no_grad()
def adapt_images(images: Tensor, in_shape: tuple[int, int, int]) -> Tensor:
    """Make an OOD set look like the in-distribution inputs (channels and size).

    Args:
        images: uint8 (N, C', H', W').
        in_shape: target (C, H, W).

    Returns:
        uint8 (N, C, H, W): RGB↔grey by luminance/repetition, bilinear (antialiased) resize.
    """
    c, h, w = in_shape
    x = images.float()
    if x.shape[1] != c:
        if c == 1:  # ITU-R 601 luma, as PIL's convert("L")
            wts = torch.tensor([0.299, 0.587, 0.114])[: x.shape[1]].view(1, -1, 1, 1)
            x = (x * wts).sum(1, keepdim=True)
        else:
            x = x.mean(1, keepdim=True).expand(-1, c, -1, -1)
    if x.shape[-2:] != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)


def member_probs(
    model: EnsembleModel, data: Split, spec: DatasetSpec, recipe: Recipe, device: torch.device
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (probs (M, B, K) float32 on CPU, labels (B,)) in eval mode (evaluation transforms,
    the split's order)."""
    for logits, y in _member_logits(model, data, spec, recipe, device):
        yield logits.float().softmax(-1).cpu(), y.cpu()


def member_probs_and_logits(
    model: EnsembleModel, data: Split, spec: DatasetSpec, recipe: Recipe, device: torch.device
) -> Iterator[tuple[Tensor, Tensor | None]]:
    """Yield (probs, logits) as :func:`member_probs` gives the probabilities, with the member
    logits (M, B, K) float32 on CPU beside them, or None where the model's outputs are
    probabilities (:func:`gives_logits`): log-probabilities carry no energy or max-logit."""
    keep = gives_logits(model)
    for logits, _ in _member_logits(model, data, spec, recipe, device):
        logits = logits.float()
        yield logits.softmax(-1).cpu(), logits.cpu() if keep else None


def gives_logits(model: EnsembleModel) -> bool:
    """Whether ``model``'s outputs are logits: every method's are; an outside model declared
    ``outputs="probs"`` (:class:`harness.engine.external.ExternalEnsemble`) returns
    log-probabilities, whose energy is 0 for every input and whose max is the log of a member's
    top probability."""
    return getattr(model, "outputs", "logits") != "probs"


def _member_logits(
    model: EnsembleModel, data: Split, spec: DatasetSpec, recipe: Recipe, device: torch.device
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (member logits (M, B, K) on ``device``, in the autocast precision; labels (B,))."""
    model.eval()
    loader = make_loader(data, evaluation_options(recipe, spec, device))
    for x, y in counted(loader):  # the batches of the evaluation's open pass
        # No autograd graph: evaluation never backpropagates (a graph kept every activation of
        # the forward pass alive until the batch's probabilities were dropped).
        with torch.no_grad(), autocast(device, recipe):
            logits = model(x)  # (M, B, K)
        yield logits, y


def evaluation_options(
    recipe: Recipe, spec: DatasetSpec, device: torch.device, batch_size: int | None = None
) -> LoaderOptions:
    """How every evaluated split is batched (the evaluation's, and ``harness.api.data``'s
    ``loader()``): the recipe's evaluation batch (or ``batch_size``), in the split's order,
    normalised with the dataset's mean and standard deviation, no augmentation."""
    return LoaderOptions(
        recipe.eval_batch_size if batch_size is None else batch_size,
        device,
        spec.mean,
        spec.std,
        channels_last=recipe.channels_last and device.type == "cuda",
    )


class _Views:
    """What one pass over a split accumulates besides the raw metrics, when a post-hoc
    calibration is fitted: the calibrated predictions' metrics and the conformal sets. The time
    spent here is the calibration's evaluation cost (``metrics.calibration.time_s``).

    ``shift``: a corruption cell, which records accuracy, NLL and ECE alone (a light
    accumulator: the full collection's set-up per cell would cost more than the arithmetic)."""

    def __init__(
        self,
        post: PosthocCalibration | None,
        shift: bool = False,
        outcomes: OutcomeAccumulator | None = None,
    ) -> None:
        from harness.metrics.collection import EnsembleMetrics
        from harness.metrics.posthoc import SetAccumulator, ShiftAccumulator

        self.post = post
        self.outcomes = outcomes
        self.shift = shift
        self.seconds = 0.0
        names = ("ts", "ts_members") if post and post.member_temperatures else ("ts",)
        make = ShiftAccumulator if shift else (lambda: EnsembleMetrics(validate=False))
        self.metrics = {n: make() for n in names} if post else {}
        self.sets = {n: SetAccumulator() for n in post.conformal} if post else {}

    def update(self, probs: Tensor, labels: Tensor) -> None:
        if self.post is None:
            return
        from harness.metrics.posthoc import one_thread

        t0 = time.perf_counter()
        with one_thread():
            scaled, sets = self.post.apply(probs)
            for name, p in scaled.items():
                self.metrics[name].update(p, labels)
            if self.outcomes is not None:
                self.outcomes.update(scaled["ts"], labels, "ts")
            for name, mask in sets.items():
                self.sets[name].update(mask, labels)
        self.seconds += time.perf_counter() - t0

    def compute(self) -> dict[str, Any]:
        """``{"ts": metrics, ["ts_members": metrics], "conformal": {name: {coverage, size}}}``;
        pool-then-calibrate is one distribution, so its member and diversity keys are left out."""
        from harness.metrics.posthoc import one_thread

        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        with one_thread():
            for name, acc in self.metrics.items():
                m = acc.compute()
                if not self.shift:
                    if name == "ts":
                        m = {k: v for k, v in m.items() if k not in ("members", *_DIVERSITY)}
                    m["reliability"] = acc.reliability()
                out[name] = m
        out["conformal"] = {name: acc.compute() for name, acc in self.sets.items()}
        self.seconds += time.perf_counter() - t0
        return out


_DIVERSITY = ("disagreement", "mi", "kl")


def _evaluate(
    model: EnsembleModel,
    data: Split,
    spec: DatasetSpec,
    recipe: Recipe,
    device: torch.device,
    post: PosthocCalibration | None = None,
    shift: bool = False,
    outcomes: OutcomeAccumulator | None = None,
    extra: Sequence[MetricSpec] = (),
    cell: str = "",
) -> tuple[dict[str, Any], _Views]:
    """One pass over a split: the raw metrics (with the reliability bins) and the views
    (``shift``: of a corruption cell, see :class:`_Views`); with ``outcomes``, each image's
    outcome, raw and calibrated, is collected too; ``extra``: registered metrics with a
    ``compute`` (plugins'), each computed on the whole split's (M, N, K) probabilities and
    written beside the built-in keys (``cell``: the cell's label, for their errors)."""
    # torchmetrics costs seconds to import (it loads torchvision, transformers and scipy.signal):
    # imported when a cell first evaluates, not before its first training step.
    from harness.metrics.collection import EnsembleMetrics

    acc = EnsembleMetrics()
    views = _Views(post, shift, outcomes)
    kept: list[tuple[Tensor, Tensor]] = []  # only for `extra`: a plugin metric sees every image
    for probs, y in member_probs(model, data, spec, recipe, device):
        acc.update(probs, y)
        views.update(probs, y)
        if outcomes is not None:
            outcomes.update(probs, y)
        if extra:
            kept.append((probs, y))
    raw = acc.compute()
    if extra:
        probs = torch.cat([p for p, _ in kept], dim=1)  # (M, N, K)
        labels = torch.cat([y for _, y in kept])  # (N,)
        for metric in extra:
            raw[metric.key] = plugin_metric(metric, probs, labels, cell)
    raw["reliability"] = acc.reliability()
    raw["reliability_members"] = acc.member_reliability()
    return raw, views


def plugin_metric(metric: MetricSpec, probs: Tensor, labels: Tensor, cell: str = "") -> float:
    """``metric.compute(probs, labels)`` as a float: a real number (Python, NumPy, or a
    one-element tensor; NaN and infinities are values, as for the built-in metrics).

    Raises:
        MetricError: it raised, or returned anything else (a string such as ``"nan"``, None,
            a bool, a tensor of several values): one line naming the metric, its function and
            the cell, where ``float()`` would have said nothing or "could not convert".
    """
    import numbers

    fn = metric.compute
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    where = f"on the clean test set of cell {cell}" if cell else "on the clean test set"
    try:
        value = fn(probs, labels)  # type: ignore[misc]  # compute is set for every `extra`
    except Exception as exc:  # a plugin may raise anything
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise MetricError(
            f"metric {metric.key!r} ({name}) raised {type(exc).__name__}{at} {where}: {first}; "
            "fix it and run again (a trained cell is re-evaluated, not retrained)"
        ) from exc
    if isinstance(value, Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise MetricError(
        f"metric {metric.key!r} ({name}) returned {shown} ({type(value).__name__}) {where}, not "
        "a number; compute(probs, targets) must return a float (NaN is allowed)"
    )


def evaluate_split(
    model: EnsembleModel, data: Split, spec: DatasetSpec, recipe: Recipe, device: torch.device
) -> dict[str, Any]:
    """All clean-set metrics (ensemble, members, diversity, reliability bins) of one split."""
    return _evaluate(model, data, spec, recipe, device)[0]


def fit_posthoc(
    model: EnsembleModel,
    splits: dict[str, Split],
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
) -> PosthocCalibration | None:
    """Post-hoc calibration fitted on the held-out split (``calibration``, else ``val``), or
    None when the evaluation does not ask for it. Never the test set."""
    from harness.metrics.posthoc import PosthocCalibration

    if not evaluation.calibrate:
        return None
    name = "calibration" if "calibration" in splits else "val"
    if name not in splits:  # `harness validate` refuses such a suite; a guard for direct calls
        raise ValueError(
            "evaluation.calibrate needs held-out images: set evaluation.calibration or "
            "recipe.validation"
        )
    batches = list(member_probs(model, splits[name], spec, recipe, device))
    probs = torch.cat([p for p, _ in batches], dim=1)  # (M, N, K)
    labels = torch.cat([y for _, y in batches])
    return PosthocCalibration.fit(
        probs,
        labels,
        alpha=evaluation.conformal_alpha,
        members=evaluation.calibrate_members,
        fitted_on=name,
    )


def evaluate_corruptions(
    model: EnsembleModel,
    test: Split,
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
    data_root: Path,
    post: PosthocCalibration | None = None,
    bar: _Passes | None = None,
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Accuracy, NLL and ECE on every corruption × severity cell, with per-severity and overall
    means (cAcc, cNLL, cECE) and the ECE slope over severity; with ``post``, the same of every
    calibrated view and the conformal sets' coverage and size per severity. ``test`` is the whole
    test split: each corrupted copy is made of it, then cut to ``evaluation.limit``'s images
    (the same images, corrupted exactly as in a full evaluation).

    Returns:
        ``(raw block, {view: block, "conformal": {name: block}, "time_s": s})``, or None when
        no corruption is asked for.
    """
    from harness.data._machinery.corruption_sets import resolve_corruptions
    from harness.data._machinery.corruptions import corrupted_split
    from harness.metrics.corruption import summarize_corruptions, summarize_sets

    if not evaluation.corruptions:
        return None
    # `all` is the dataset's published benchmark set, never "what this machine can generate".
    names = resolve_corruptions(spec.name, evaluation.corruptions)
    cells: list[dict[str, Any]] = []
    scaled: dict[str, list[dict[str, Any]]] = {}
    sets: dict[str, list[dict[str, Any]]] = {}
    seconds = 0.0
    for name in names:
        for sev in evaluation.severities:
            _step(bar, f"{name} s{sev}")
            # corrupted as in the full set, then the limited evaluation's rows of it
            data = limited(corrupted_split(spec.name, data_root, test, name, sev), evaluation.limit)
            m, views = _evaluate(model, data, spec, recipe, device, post, shift=True)
            where = {"corruption": name, "severity": sev}
            cells.append({**where, "acc": m["acc"], "nll": m["nll"], "ece": m["ece"]})
            if post is None:
                continue
            extra = views.compute()
            seconds += views.seconds
            for view, vm in extra.items():
                if view == "conformal":
                    for cp, values in vm.items():
                        sets.setdefault(cp, []).append({**where, **values})
                else:
                    row = {**where, "acc": vm["acc"], "nll": vm["nll"], "ece": vm["ece"]}
                    scaled.setdefault(view, []).append(row)
    # cAcc/cNLL/cECE average the benchmark corruptions only; extras are reported apart.
    sevs = evaluation.severities
    calibrated: dict[str, Any] = {
        v: summarize_corruptions(c, spec.name, sevs) for v, c in scaled.items()
    }
    if sets:
        calibrated["conformal"] = {k: summarize_sets(c, spec.name, sevs) for k, c in sets.items()}
    calibrated["time_s"] = seconds
    return summarize_corruptions(cells, spec.name, sevs), calibrated


def evaluate_ood(
    model: EnsembleModel,
    test: Split,
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
    data_root: Path,
    post: PosthocCalibration | None = None,
    bar: _Passes | None = None,
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """OOD detection metrics of every declared OOD set against the ID test set: the probability
    scores and, where the model gives logits (:func:`gives_logits`), the energy and max-logit
    scores of the member logits; with ``post``, those of the scores that depend on the
    calibrated probabilities (MSP and entropy of the pool-then-calibrate distribution; the
    mutual information is a property of the members, and the calibration scales probabilities,
    not logits).

    Returns:
        ``(raw block, {"ts": block, "time_s": s})``, or None when no OOD set is asked for.
    """
    from harness.metrics.collection import OODScores

    if not evaluation.ood:
        return None
    scores = OODScores()
    ts_scores = OODScores(validate=False) if post is not None else None
    seconds = 0.0

    def feed(p: Tensor, logits: Tensor | None, ood: bool) -> None:
        nonlocal seconds
        scores.update(p, logits, ood=ood)  # ID scores are kept across OOD sets; only (B,) stored
        if ts_scores is not None:
            from harness.metrics.posthoc import one_thread

            t0 = time.perf_counter()
            with one_thread():
                ts_scores.update(post.scaled(p)["ts"], ood=ood)
            seconds += time.perf_counter() - t0

    _step(bar, "OOD: test scores")
    for p, logits in member_probs_and_logits(model, test, spec, recipe, device):
        feed(p, logits, False)
    out: dict[str, Any] = {}
    ts_out: dict[str, Any] = {}
    for name in evaluation.ood:
        _step(bar, f"OOD: {name}")
        ood = ood_split(name, spec, data_root, evaluation.limit)
        scores.reset_ood()
        if ts_scores is not None:
            ts_scores.reset_ood()
        for p, logits in member_probs_and_logits(model, ood, spec, recipe, device):
            feed(p, logits, True)
        out[name] = scores.compute()
        if ts_scores is not None:
            t0 = time.perf_counter()
            ts_out[name] = {k: v for k, v in ts_scores.compute().items() if k in _TS_OOD_SCORES}
            seconds += time.perf_counter() - t0
    return out, {"ts": ts_out, "time_s": seconds}


def ood_split(name: str, spec: DatasetSpec, data_root: Path, limit: int | None = None) -> Split:
    """The OOD set ``name`` as the evaluation feeds it next to ``spec``'s test set: its ``test``
    split, an in-memory set adapted to ``spec``'s input shape (:func:`adapt_images`; a lazy
    split's evaluation transform already produces it), its labels its own (-1: none); with
    ``limit`` (``evaluation.limit``), only its images that :func:`limited` keeps.

    Raises:
        DataMissingError: the set is not on this machine (the message names the fetch).
    """
    from harness.registry import DATASETS

    ood_spec = DATASETS.get(name)
    ood_spec.require(data_root)
    raw = limited(ood_spec.load(data_root)["test"], limit)
    if isinstance(raw, ImageSet):
        return ImageSet(adapt_images(raw.images, spec.in_shape), raw.labels)
    return raw


#: OOD scores that a temperature changes (the MI of the pooled distribution is zero; the energy
#: and max-logit are of the raw member logits, which the calibration does not scale).
_TS_OOD_SCORES = ("msp", "entropy")


def evaluate_all(
    model: EnsembleModel,
    splits: dict[str, Split],
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
    data_root: Path,
    outcomes: OutcomeAccumulator | None = None,
    progress: bool = False,
    cell: str = "",
    live: Heartbeat | None = None,
) -> dict[str, Any]:
    """The ``metrics`` block of a result record (docs/records.md): ``clean``, ``val`` (with a
    validation split), ``corruption``, ``ood`` and, when the evaluation asks for post-hoc
    calibration, ``calibration``. With ``outcomes``, the test set's per-image outcomes
    (:mod:`harness.metrics.outcomes`) are collected into it on the same pass. ``progress``:
    a bar over the passes (held-out fit, test, validation, each corruption × severity, each OOD
    set; its postfix the pass's batches), shown only when standard error is a terminal.
    ``live``: the cell's heartbeat, told each pass and batch (:mod:`harness.engine.eval_passes`).
    ``cell``: its label, which a plugin metric's error names (:func:`plugin_metric`)."""
    with _Passes(splits, evaluation, spec, progress, live) as bar:
        # the library's import is not the calibration's cost (OOD needs it)
        if evaluation.calibrate:
            import torch_uncertainty.post_processing  # noqa: F401
        t0 = time.perf_counter()
        # The held-out pass draws from the global generators (MC Dropout, Masksembles' sampling
        # in eval): forked, so the test set's draws, and so every raw number, are those of a
        # run without calibration.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if evaluation.calibrate:
                _step(bar, "calibration fit")
            post = fit_posthoc(model, splits, spec, evaluation, recipe, device)
        fit_s = time.perf_counter() - t0
        _step(bar, "clean")
        extra = computed_metrics()  # plugins' metric columns, on the clean test set
        test = limited_test(splits["test"], spec, evaluation.limit)
        clean, views = _evaluate(
            model, test, spec, recipe, device, post, outcomes=outcomes, extra=extra, cell=cell
        )
        metrics: dict[str, Any] = {"clean": clean}
        if extra:  # how the reporter shows them, from the record alone
            metrics["declared"] = [m.declaration() for m in extra]
        if "val" in splits:  # only when the recipe holds out a validation split
            _step(bar, "validation")
            metrics["val"] = evaluate_split(model, splits["val"], spec, recipe, device)
        corr = evaluate_corruptions(  # the whole test set: its corrupted copies are cut
            model, splits["test"], spec, evaluation, recipe, device, data_root, post, bar
        )
        if corr is not None:
            metrics["corruption"] = corr[0]
        ood = evaluate_ood(model, test, spec, evaluation, recipe, device, data_root, post, bar)
        _step(bar, "")
        if ood is not None:
            metrics["ood"] = ood[0]
        if post is not None:
            metrics["calibration"] = calibration_block(post, views, corr, ood, fit_s)
        return metrics


def limited_test(test: Split, spec: DatasetSpec, limit: int | None) -> Split:
    """The test images a cell is scored on: ``evaluation.limit`` of them
    (:func:`harness.data._machinery.base.limited`), or all. A limit of the whole set or more
    scores the whole set, with a note (the record keeps the limit asked for, so such a cell
    still never pools with full-set cells)."""
    if limit and limit >= len(test):
        log.warning(
            "evaluation.limit %d >= the %d images of %s's test set: the whole set is scored",
            limit, len(test), spec.name,
        )  # fmt: skip
    return limited(test, limit)


def calibration_block(
    post: PosthocCalibration,
    clean: _Views,
    corr: tuple[dict[str, Any], dict[str, Any]] | None,
    ood: tuple[dict[str, Any], dict[str, Any]] | None,
    fit_s: float,
) -> dict[str, Any]:
    """The record's ``metrics.calibration`` (docs/records.md): the fit, then per calibrated
    view (``ts``, ``ts_members``) its clean / corruption / OOD metrics, and the conformal sets.

    Raises:
        RuntimeError: the pool-then-calibrate accuracy differs from the raw one (a temperature
            cannot change the top label: this would be a bug, never a result).
    """
    views = clean.compute()
    block: dict[str, Any] = post.to_json()
    for name in ("ts", "ts_members"):
        if name in views:
            block[name] = {"clean": views[name]}
    block["conformal"] = {k: {"clean": v} for k, v in views["conformal"].items()}
    seconds = fit_s + clean.seconds
    if corr is not None:
        extra = corr[1]
        seconds += extra.pop("time_s")
        for name, values in extra.pop("conformal", {}).items():
            block["conformal"][name]["corruption"] = values
        for name, values in extra.items():
            block[name]["corruption"] = values
    if ood is not None:
        seconds += ood[1]["time_s"]
        block["ts"]["ood"] = ood[1]["ts"]
    block["time_s"] = seconds
    return block
