"""Evaluation of a trained ensemble: clean test set, corruption shift, OOD detection.

Predictions stream batch by batch into the metric accumulators of :mod:`harness.metrics`;
member probabilities are (M, B, K) and the ensemble prediction is their mean (never the mean of
logits). Corrupted copies come from :mod:`harness.data.corruptions`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.contract import Evaluation, Recipe
from harness.data.base import DatasetSpec, ImageSet, LoaderOptions, Split
from harness.data.loader import make_loader
from harness.engine.train import autocast
from methods.base import EnsembleModel


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
    model.eval()
    loader = make_loader(
        data,
        LoaderOptions(
            recipe.eval_batch_size,
            device,
            spec.mean,
            spec.std,
            channels_last=recipe.channels_last and device.type == "cuda",
        ),
    )
    for x, y in loader:
        with autocast(device, recipe):
            logits = model(x)  # (M, B, K)
        yield logits.float().softmax(-1).cpu(), y.cpu()


def evaluate_split(
    model: EnsembleModel, data: Split, spec: DatasetSpec, recipe: Recipe, device: torch.device
) -> dict[str, Any]:
    """All clean-set metrics (ensemble, members, diversity) of one split."""
    # torchmetrics costs seconds to import (it loads torchvision, transformers and scipy.signal):
    # imported when a cell first evaluates, not before its first training step.
    from harness.metrics.collection import EnsembleMetrics

    acc = EnsembleMetrics()
    for probs, y in member_probs(model, data, spec, recipe, device):
        acc.update(probs, y)
    return acc.compute()


def evaluate_corruptions(
    model: EnsembleModel,
    test: Split,
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
    data_root: Path,
) -> dict[str, Any] | None:
    """Accuracy, NLL and ECE on every corruption × severity cell, with per-severity and overall
    means (cAcc, cNLL, cECE) and the ECE slope over severity."""
    from harness.data.corruption_sets import resolve_corruptions
    from harness.data.corruptions import corrupted_split
    from harness.metrics.corruption import summarize_corruptions

    if not evaluation.corruptions:
        return None
    # `all` is the dataset's published benchmark set, never "what this machine can generate".
    names = resolve_corruptions(spec.name, evaluation.corruptions)
    cells = []
    for name in names:
        for sev in evaluation.severities:
            data = corrupted_split(spec.name, data_root, test, name, sev)
            m = evaluate_split(model, data, spec, recipe, device)
            cells.append(
                {
                    "corruption": name,
                    "severity": sev,
                    "acc": m["acc"],
                    "nll": m["nll"],
                    "ece": m["ece"],
                }
            )
    # cAcc/cNLL/cECE average the benchmark corruptions only; extras are reported apart.
    return summarize_corruptions(cells, spec.name, evaluation.severities)


def evaluate_ood(
    model: EnsembleModel,
    test: Split,
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
    data_root: Path,
) -> dict[str, Any] | None:
    """OOD detection metrics of every declared OOD set against the ID test set."""
    from harness.metrics.collection import OODScores
    from harness.registry import DATASETS

    if not evaluation.ood:
        return None
    scores = OODScores()
    for p, _ in member_probs(model, test, spec, recipe, device):
        scores.update_id(p)  # ID scores are kept across OOD sets; only (B,) scores are stored
    out = {}
    for name in evaluation.ood:
        ood_spec = DATASETS.get(name)
        ood_spec.require(data_root)
        raw = ood_spec.load(data_root)["test"]
        # In-memory sets are adapted to the ID input shape here; a lazy split's evaluation
        # transform already produces it.
        ood = (
            ImageSet(adapt_images(raw.images, spec.in_shape), raw.labels)
            if isinstance(raw, ImageSet)
            else raw
        )
        scores.reset_ood()
        for p, _ in member_probs(model, ood, spec, recipe, device):
            scores.update_ood(p)
        out[name] = scores.compute()
    return out


def evaluate_all(
    model: EnsembleModel,
    splits: dict[str, Split],
    spec: DatasetSpec,
    evaluation: Evaluation,
    recipe: Recipe,
    device: torch.device,
    data_root: Path,
) -> dict[str, Any]:
    """The ``metrics`` block of a result record."""
    metrics: dict[str, Any] = {
        "clean": evaluate_split(model, splits["test"], spec, recipe, device),
    }
    if "val" in splits:  # only when the recipe holds out a validation split
        metrics["val"] = evaluate_split(model, splits["val"], spec, recipe, device)
    corr = evaluate_corruptions(model, splits["test"], spec, evaluation, recipe, device, data_root)
    if corr is not None:
        metrics["corruption"] = corr
    ood = evaluate_ood(model, splits["test"], spec, evaluation, recipe, device, data_root)
    if ood is not None:
        metrics["ood"] = ood
    return metrics
