"""Backbones for 28×28 inputs (Fashion-MNIST, MNIST and their OOD partners).

- ``fmnist_cnn``: three conv-BN-ReLU blocks of widths (w, 2w, 2w) (w = ``width``, default 16:
  16/32/32), 2×2 max-pooling after the first two (28 → 14 → 7), global average pooling, dropout,
  a linear head. It is built from layer factories like the digits CNN
  (:class:`harness.backbones.DigitsCNN`), so Packed-Ensembles, BatchEnsemble, Masksembles and MIMO
  build their variant of this very network from torch-uncertainty's layers (family ``cnn``), and
  σN-Ens, FiLM, MC Dropout and deep ensembles wrap or repeat it.

Every spec here carries ``layered``: the class the ``cnn``-family methods build with their own
layers (:func:`methods.tu_common.digits_cnn` reads it; the digits CNN is the default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from harness.backbones import BackboneSpec, register_backbone


@dataclass(frozen=True)
class LayeredBackboneSpec(BackboneSpec):
    """A ``cnn``-family backbone whose methods build ``layered(in_channels, num_classes, width=,
    dropout_rate=, conv=, linear=, channels=)`` with their own layers."""

    layered: Callable[..., nn.Module] | None = None


def _conv3x3(ci: int, co: int, first: bool) -> nn.Module:
    return nn.Conv2d(ci, co, 3, padding=1, bias=False)  # bias-free: a BatchNorm follows


class FashionCNN(nn.Module):
    """3 conv-BN-ReLU blocks for 28×28 inputs, max-pool after blocks 1 and 2, GAP, linear head.

    Shapes at width w and input (B, C, 28, 28): (B, w, 14, 14) → (B, 2w, 7, 7) → (B, 2w, 7, 7)
    → (B, 2w) → (B, K). At w = 16 and K = 10: 14,458 parameters for one grey input channel.

    Args:
        in_channels: C of the input (M·C for MIMO).
        num_classes: K (M·K for MIMO).
        width: channels of the first block; the other two have 2×width.
        dropout_rate: dropout before the head (0 disables it).
        conv: ``conv(c_in, c_out, first=bool)`` → module (a 3×3, padding 1 convolution);
            default a bias-free ``nn.Conv2d``.
        linear: ``linear(f_in, f_out)`` → module; default ``nn.Linear``.
        channels: multiplier of the hidden channel counts the norms see (Packed's α).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int = 16,
        dropout_rate: float = 0.0,
        conv: Callable[[int, int, bool], nn.Module] | None = None,
        linear: Callable[[int, int], nn.Module] | None = None,
        channels: float = 1.0,
    ) -> None:
        super().__init__()
        conv = conv or _conv3x3
        linear = linear or nn.Linear
        w1, w2 = int(width * channels), int(2 * width * channels)
        self.features = nn.Sequential(
            conv(in_channels, width, True),
            nn.BatchNorm2d(w1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 28×28 → 14×14
            conv(width, 2 * width, False),
            nn.BatchNorm2d(w2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 14×14 → 7×7
            conv(2 * width, 2 * width, False),
            nn.BatchNorm2d(w2),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (B, 2·width·channels)
        )
        self.dropout = nn.Dropout(dropout_rate)
        self.head = linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) → logits (B, K)."""
        return self.head(self.dropout(self.features(x)))


def _no_extra(kw: dict[str, Any], name: str) -> None:
    if kw:
        raise TypeError(f"backbone {name!r} got unknown options {sorted(kw)}")


def _fmnist_cnn(
    in_shape: tuple[int, ...],
    num_classes: int,
    width: int = 16,
    dropout_rate: float = 0.0,
    **kw: Any,
) -> FashionCNN:
    _no_extra(kw, "fmnist_cnn")
    return FashionCNN(in_shape[0], num_classes, width=width, dropout_rate=dropout_rate)


register_backbone(
    LayeredBackboneSpec(
        "fmnist_cnn",
        _fmnist_cnn,
        "cnn",
        "3-block CNN for 28×28 inputs (widths w/2w/2w, w=16; pooling after blocks 1, 2; BN)",
        layered=FashionCNN,
    )
)
