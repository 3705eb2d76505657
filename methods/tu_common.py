"""Shared plumbing for methods built from torch-uncertainty's dedicated ensemble models.

torch-uncertainty has one builder per (method, architecture); this module maps the harness's
backbone names onto them and builds the digits CNN variant from the same library layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from harness.backbones import DigitsCNN
from methods.base import BuildContext, EnsembleModel, repeat_members, to_members

# Backbones that have a torch-uncertainty builder for every dedicated ensemble model.
TU_BACKBONES = ("digits_cnn", "resnet18", "resnet50", "wrn28_10")


def build_tu(
    ctx: BuildContext,
    resnet_builder: Callable[..., nn.Module],
    wrn_builder: Callable[..., nn.Module],
    digits_builder: Callable[[BuildContext], nn.Module],
    **kwargs: Any,
) -> nn.Module:
    """Build torch-uncertainty's model of a method for the cell's backbone (CIFAR style)."""
    from harness.registries import BACKBONES

    if ctx.backbone == "digits_cnn":
        return digits_builder(ctx)
    c, k, m = ctx.in_shape[0], ctx.num_classes, ctx.num_members
    extra = {key: v for key, v in ctx.backbone_kwargs.items() if key == "dropout_rate"}
    if ctx.backbone == "wrn28_10":
        return wrn_builder(
            in_channels=c, num_classes=k, num_estimators=m, style="cifar", **extra, **kwargs
        )
    arch = BACKBONES.get(ctx.backbone).tu_arch
    return resnet_builder(
        in_channels=c, num_classes=k, arch=arch, num_estimators=m, style="cifar", **extra, **kwargs
    )


def digits_cnn(ctx: BuildContext, **kwargs: Any) -> DigitsCNN:
    """The digits CNN with custom layers (kwargs go to :class:`DigitsCNN`)."""
    width = ctx.backbone_kwargs.get("width", 32)
    return DigitsCNN(
        ctx.in_shape[0],
        ctx.num_classes,
        width=width,
        dropout_rate=ctx.backbone_kwargs.get("dropout_rate", 0.0),
        **kwargs,
    )


class RepeatInEval(nn.Module):
    """Repeat the batch member-major in eval only (torch-uncertainty's "paper" strategy)."""

    def __init__(self, core: nn.Module, num_members: int) -> None:
        super().__init__()
        self.core = core
        self.num_members = num_members

    def forward(self, x: Tensor) -> Tensor:
        return self.core(x if self.training else repeat_members(x, self.num_members))


class SplitBatchEnsemble(EnsembleModel):
    """Models whose members each take a B/M slice of the batch in training (BatchEnsemble's and
    Masksembles' "paper" strategy) and the whole batch, repeated, in evaluation.

    In training the model's (B, K) output is member-major: rows m·B/M … (m+1)·B/M − 1 belong to
    member m, so it is viewed as (M, B/M, K) with the targets split the same way. A batch whose
    size is not a multiple of M drops its last B mod M samples.
    """

    def __init__(self, net: nn.Module, num_members: int) -> None:
        super().__init__()
        self.net = net
        self.num_members = num_members

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            raise RuntimeError("use training_outputs() in training mode")
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)

    def training_outputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        m = self.num_members
        b = (x.shape[0] // m) * m
        if b == 0:
            raise ValueError(f"batch of {x.shape[0]} is smaller than M={m}")
        logits = self.net(x[:b])  # (B, K), member-major slices
        return to_members(logits, m), y[:b].view(m, b // m)  # (M, B/M, K), (M, B/M)
