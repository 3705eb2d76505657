"""Shared plumbing for methods built from torch-uncertainty's dedicated ensemble models.

torch-uncertainty has one builder per (method, architecture); this module picks it by the
backbone's family (``BackboneSpec.family``), never by backbone name, gives it the depth and stem
the backbone declares, and rebuilds a "cnn"-family CNN (its ``layered_class``) from the same
library's layers. What torch-uncertainty needs is known here, not in the backbone specs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from methods._base import (
    BatchFeeding,
    BuildContext,
    EnsembleModel,
    TrainOutput,
    repeat_members,
    to_members,
)

# Backbone families with a torch-uncertainty builder for every dedicated ensemble model: "cnn"
# is the backbone's ``layered_class`` rebuilt from the library's layers, "resnet" needs the
# backbone's ``depth``,
# "wideresnet" is WRN-28-10 (the library's dedicated builders exist only at 28×10; other widths
# register a family of their own so these methods refuse them).
TU_FAMILIES = ("cnn", "resnet", "wideresnet")


def build_tu(
    ctx: BuildContext,
    resnet_builder: Callable[..., nn.Module],
    wrn_builder: Callable[..., nn.Module],
    digits_builder: Callable[[BuildContext], nn.Module],
    **kwargs: Any,
) -> nn.Module:
    """Build torch-uncertainty's model of a method for the cell's backbone family, in the
    style of the backbone's declared ``stem`` ("cifar" or "imagenet")."""
    from harness.registry import BACKBONES

    spec = BACKBONES.get(ctx.backbone)
    if spec.family == "cnn":
        return digits_builder(ctx)
    c, k, m = ctx.in_shape[0], ctx.num_classes, ctx.num_members
    extra = {key: v for key, v in ctx.backbone_kwargs.items() if key == "dropout_rate"}
    # ImageNet backbones (harness.backbones.imagenet) declare stem "imagenet": the 7×7 stem.
    style = spec.stem
    if spec.family == "wideresnet":
        return wrn_builder(
            in_channels=c, num_classes=k, num_estimators=m, style=style, **extra, **kwargs
        )
    if spec.family != "resnet" or spec.depth is None:
        raise ValueError(
            f"backbone {ctx.backbone!r} (family {spec.family!r}) has no torch-uncertainty "
            f"builder; supported families: {', '.join(TU_FAMILIES)}"
        )
    arch = spec.depth
    return resnet_builder(
        in_channels=c, num_classes=k, arch=arch, num_estimators=m, style=style, **extra, **kwargs
    )


def digits_cnn(ctx: BuildContext, **kwargs: Any) -> nn.Module:
    """The ``cnn``-family backbone with custom layers: the spec's ``layered_class`` (the digits
    CNN, the 28×28 CNN of :mod:`harness.backbones.grey28`); kwargs go to that class, the suite's
    ``width``/``dropout_rate`` too (each class keeps its own default width).

    Raises:
        ValueError: a "cnn"-family backbone that takes no layer factories.
    """
    from harness.registry import BACKBONES

    cls = BACKBONES.get(ctx.backbone).layered_class
    if cls is None:
        raise ValueError(
            f"backbone {ctx.backbone!r} (family 'cnn') declares no layered_class: its layers "
            "cannot be rebuilt from torch-uncertainty's"
        )
    own = {k: ctx.backbone_kwargs[k] for k in ("width", "dropout_rate") if k in ctx.backbone_kwargs}
    return cls(ctx.in_shape[0], ctx.num_classes, **own, **kwargs)


class RepeatInEval(nn.Module):
    """Repeat the batch member-major in eval, and in training too unless ``split_in_training``
    (torch-uncertainty's "legacy" vs "paper" strategies, for the digits CNN)."""

    def __init__(self, core: nn.Module, num_members: int, split_in_training: bool = True) -> None:
        super().__init__()
        self.core = core
        self.num_members = num_members
        self.split_in_training = split_in_training

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.split_in_training:
            return self.core(x)
        return self.core(repeat_members(x, self.num_members))


def repeat_or_split(hp: Any) -> BatchFeeding:
    """The feeding of a method with ``batch: repeat | split``."""
    return BatchFeeding("split" if hp.batch == "split" else "shared")


class RepeatOrSplitEnsemble(EnsembleModel):
    """Shared-weight models whose members either all see the tiled batch (``repeat``, as
    uncertainty-baselines' BatchEnsemble: ``tf.tile`` of the images) or each take a B/M slice
    (``split``, torch-uncertainty's "paper" strategy) in training; eval always repeats.

    In both cases the network's training output is member-major: (M·B, K) when repeating,
    (B, K) in M slices of B/M rows when splitting. A split batch whose size is not a multiple
    of M drops its last B mod M samples. Member losses are averaged (shared weights).
    """

    def __init__(self, net: nn.Module, num_members: int, split: bool) -> None:
        super().__init__()
        self.net = net
        self.num_members = num_members
        self.split = split

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            raise RuntimeError("use training_outputs() in training mode")
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)

    def training_outputs(self, x: Tensor, y: Tensor) -> TrainOutput:
        m = self.num_members
        if not self.split:
            logits = to_members(self.net(x), m)  # (M·B, K) → (M, B, K)
            return TrainOutput(logits, y.unsqueeze(0).expand(m, -1), "mean")  # (M, B)
        b = (x.shape[0] // m) * m
        if b == 0:
            raise ValueError(f"batch of {x.shape[0]} is smaller than M={m}")
        logits = self.net(x[:b])  # (B, K), member-major slices
        return TrainOutput(to_members(logits, m), y[:b].view(m, b // m), "mean")  # (M, B/M)
