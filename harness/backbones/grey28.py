"""Backbones for 28×28 inputs (Fashion-MNIST, MNIST and their OOD partners).

- ``fmnist_cnn``: three conv-BN-ReLU blocks of widths (w, 2w, 2w) (w = ``width``, default 16:
  16/32/32), 2×2 max-pooling after the first two (28 → 14 → 7), global average pooling, dropout,
  a linear head. It is built from layer factories like the digits CNN
  (:class:`harness.backbones.vision.DigitsCNN`), so Packed-Ensembles, BatchEnsemble, Masksembles
  and MIMO
  build their variant of this very network from torch-uncertainty's layers (family ``cnn``), and
  σN-Ens, FiLM, MC Dropout and deep ensembles wrap or repeat it.

- ``tf_tutorial_cnn``: the "2 Conv+pooling" network of the Fashion-MNIST README's benchmark
  table (91.6%, "Tensorflow's doc"; zalandoresearch/fashion-mnist ``benchmark/convnet.py``, the
  TensorFlow layers tutorial's MNIST CNN): conv 5×5 ×32 + ReLU, max-pool 2, conv 5×5 ×64 + ReLU,
  max-pool 2, dense 1024 + ReLU, dropout 0.4, dense K. 3,274,634 parameters at K = 10.
- ``keras_conv_bn_cnn``: the network behind the table's "2 Conv+pooling+BN" row (93.4%,
  khanguyen1207/My-Machine-Learning-Corner ``Zalando MNIST/fashion.ipynb``): two blocks of two
  convolutions (5×5 ×32 twice, then 3×3 ×64 twice, ReLU), each block max-pooled and followed by
  dropout 0.25, then dense 512 + ReLU, BatchNorm, dropout 0.5, dense K (1,694,186 trainable
  parameters at K = 10, the notebook's count; 1,695,210 with BatchNorm's running statistics).
  Keras's BatchNormalization defaults: eps 1e-3, momentum 0.99 (PyTorch's momentum 0.01).
- Both initialise as Keras/TensorFlow layers do (Glorot-uniform kernels, zero biases). Neither
  has the 3×3-conv-BN layout the ``cnn``-family methods rebuild, so they form the family
  ``plain_cnn``: single, deep ensemble and MC Dropout (at the network's own dropout) build them.
- ResNet-18 for 28×28 inputs is ``resnet18`` (torch-uncertainty's CIFAR-style ResNet: 3×3 stem,
  no stem pooling; 28 → 28/14/7/4 over its stages), which every method builds for any channel
  count; it is meant for users with a GPU.

Every spec here carries ``layered``: the class the ``cnn``-family methods build with their own
layers (:func:`methods._tu.common.digits_cnn` reads it; the digits CNN is the default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from harness.backbones import BackboneSpec, register_backbone


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
    BackboneSpec(
        "fmnist_cnn",
        _fmnist_cnn,
        "cnn",
        "3-block CNN for 28×28 inputs (widths w/2w/2w, w=16; pooling after blocks 1, 2; BN)",
        layered_class=FashionCNN,
    )
)


def keras_init(net: nn.Module) -> nn.Module:
    """Glorot-uniform weights and zero biases for every conv and dense layer (the defaults of
    Keras's Conv2D/Dense and of TF's ``tf.layers``); BatchNorm keeps γ = 1, β = 0. In place."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return net


class TFTutorialCNN(nn.Module):
    """The TensorFlow layers tutorial's CNN ("2 Conv+pooling"), for (B, C, 28, 28) inputs.

    Shapes: (B, 32, 28, 28) → pool (B, 32, 14, 14) → (B, 64, 14, 14) → pool (B, 64, 7, 7) →
    (B, 3136) → (B, 1024) → (B, K).
    """

    def __init__(self, in_channels: int, num_classes: int, dropout_rate: float = 0.4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),  # "same" padding
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 1024),
            nn.ReLU(inplace=True),
        )
        self.dropout = nn.Dropout(dropout_rate)
        self.head = nn.Linear(1024, num_classes)
        keras_init(self)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, 28, 28) → logits (B, K)."""
        return self.head(self.dropout(self.features(x)))


class KerasConvBNCNN(nn.Module):
    """The "2 Conv+pooling+BN" Keras network of the Fashion-MNIST benchmark table.

    Shapes: (B, 32, 28, 28) ×2 → pool (B, 32, 14, 14) → (B, 64, 14, 14) ×2 → pool (B, 64, 7, 7)
    → (B, 3136) → (B, 512) → (B, K).

    Args:
        dropout_rate: the dropout before the head (the notebook's 0.5); the two block dropouts
            stay at its 0.25.
    """

    def __init__(self, in_channels: int, num_classes: int, dropout_rate: float = 0.5) -> None:
        super().__init__()
        relu = nn.ReLU
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),
            relu(inplace=True),
            nn.Conv2d(32, 32, 5, padding=2),
            relu(inplace=True),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Conv2d(32, 64, 3, padding=1),
            relu(inplace=True),
            nn.Conv2d(64, 64, 3, padding=1),
            relu(inplace=True),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            relu(inplace=True),
            nn.BatchNorm1d(512, eps=1e-3, momentum=0.01),  # Keras: epsilon 1e-3, momentum 0.99
        )
        self.dropout = nn.Dropout(dropout_rate)
        self.head = nn.Linear(512, num_classes)
        keras_init(self)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, 28, 28) → logits (B, K)."""
        return self.head(self.dropout(self.features(x)))


def _plain(cls: type[nn.Module], name: str, default_dropout: float):
    def build(
        in_shape: tuple[int, ...],
        num_classes: int,
        dropout_rate: float = default_dropout,
        **kw: Any,
    ) -> nn.Module:
        _no_extra(kw, name)
        if tuple(in_shape[1:]) != (28, 28):
            raise ValueError(f"backbone {name!r} is for 28×28 inputs, got {tuple(in_shape)}")
        return cls(in_shape[0], num_classes, dropout_rate=dropout_rate)

    return build


register_backbone(
    BackboneSpec(
        "tf_tutorial_cnn",
        _plain(TFTutorialCNN, "tf_tutorial_cnn", 0.4),
        "plain_cnn",
        "Fashion-MNIST benchmark's '2 Conv+pooling' (TF layers tutorial CNN), 28×28 only",
    )
)
register_backbone(
    BackboneSpec(
        "keras_conv_bn_cnn",
        _plain(KerasConvBNCNN, "keras_conv_bn_cnn", 0.5),
        "plain_cnn",
        "Fashion-MNIST benchmark's '2 Conv+pooling+BN' Keras network, 28×28 only",
    )
)
