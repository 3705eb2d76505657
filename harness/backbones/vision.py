"""The vision backbones every method is built on.

CIFAR-style ResNets and WideResNet come from torch-uncertainty (``style="cifar"``: 3×3 stem, no
max-pool, for 32×32 inputs), torchvision's ImageNet-style ResNet-18 is offered for pretrained
conversion, and the ViT is timm's VisionTransformer sized for 32×32 inputs (built offline, no
weights are downloaded). ``digits_cnn`` is the small CNN of the built-in benchmark.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from harness.backbones import BackboneSpec, _no_extra, register_backbone


class DigitsCNN(nn.Module):
    """Small CNN for 8×8 inputs: 3 conv-BN-ReLU blocks, global pooling, dropout, linear head.

    The layer factories let the comparators build their own variant of the *same* network
    (Packed-Ensembles' grouped convolutions, BatchEnsemble's rank-1 layers, Masksembles' masks)
    from torch-uncertainty's layers, so every method shares one architecture.

    Args:
        in_channels: C of the input.
        num_classes: K.
        width: channels of the first block (the others use 2×width).
        dropout_rate: dropout before the head (0 disables it; MC Dropout sets it).
        conv: ``conv(c_in, c_out, first=bool)`` → module; default a bias-free 3×3 nn.Conv2d.
        linear: ``linear(f_in, f_out)`` → module; default nn.Linear.
        channels: multiplier of the hidden channel counts seen by the norms (Packed's α).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int = 32,
        dropout_rate: float = 0.0,
        conv=None,
        linear=None,
        channels: float = 1.0,
    ) -> None:
        super().__init__()
        conv = conv or (lambda ci, co, first: nn.Conv2d(ci, co, 3, padding=1, bias=False))
        linear = linear or nn.Linear
        w1, w2 = int(width * channels), int(2 * width * channels)
        self.features = nn.Sequential(
            conv(in_channels, width, True),
            nn.BatchNorm2d(w1),
            nn.ReLU(inplace=True),
            conv(width, 2 * width, False),
            nn.BatchNorm2d(w2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 8×8 → 4×4
            conv(2 * width, 2 * width, False),
            nn.BatchNorm2d(w2),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (B, 2·width·channels)
        )
        self.dropout = nn.Dropout(dropout_rate)
        self.head = linear(2 * width, num_classes)

    def forward(self, x):
        return self.head(self.dropout(self.features(x)))


def _digits_cnn(in_shape, num_classes, width: int = 32, dropout_rate: float = 0.0, **kw: Any):
    _no_extra(kw, "digits_cnn")
    return DigitsCNN(in_shape[0], num_classes, width=width, dropout_rate=dropout_rate)


def _tu_resnet(arch: int):
    def build(in_shape, num_classes, dropout_rate: float = 0.0, **kw: Any):
        from torch_uncertainty.models.classification import resnet

        return resnet(
            in_channels=in_shape[0],
            num_classes=num_classes,
            arch=arch,
            dropout_rate=dropout_rate,
            style="cifar",
            **kw,
        )

    return build


def _tu_wrn(in_shape, num_classes, dropout_rate: float = 0.3, **kw: Any):
    from torch_uncertainty.models.classification import wideresnet28x10

    return wideresnet28x10(
        in_channels=in_shape[0],
        num_classes=num_classes,
        dropout_rate=dropout_rate,
        style="cifar",
        **kw,
    )


def _tu_wrn28_8(
    in_shape, num_classes, dropout_rate: float = 0.3, conv_bias: bool = True, **kw: Any
):
    """WideResNet-28-8, torch-uncertainty's wide ResNet at depth 28, widen factor 8.

    torch-uncertainty 0.13 exports a builder only for 28×10 (``wideresnet28x10``), which fixes
    ``widen_factor``; the class behind it takes both, so we call it with 8 (same blocks,
    dropout, conv bias and CIFAR stem as ``wrn28_10``). 23,409,092 parameters at K=100;
    σN-Ens at M=4 adds 2·3·C per norm layer and has 23,480,932, the paper's count.
    """
    from torch_uncertainty.models.classification.wideresnet.std import _WideResNet

    return _WideResNet(
        depth=28,
        widen_factor=8,
        in_channels=in_shape[0],
        num_classes=num_classes,
        conv_bias=conv_bias,
        dropout_rate=dropout_rate,
        groups=1,
        style="cifar",
        **kw,
    )


def _tv_resnet18(in_shape, num_classes, dropout_rate: float = 0.0, **kw: Any):
    import torchvision

    _no_extra(kw, "tv_resnet18")
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    if in_shape[0] != 3:
        model.conv1 = nn.Conv2d(in_shape[0], 64, 7, 2, 3, bias=False)
    if dropout_rate:
        model.fc = nn.Sequential(nn.Dropout(dropout_rate), model.fc)
    return model


def _vit(
    in_shape,
    num_classes,
    dropout_rate: float = 0.0,
    patch_size: int = 4,
    embed_dim: int = 192,
    depth: int = 9,
    num_heads: int = 3,
    **kw: Any,
):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=in_shape[1],
        patch_size=patch_size,
        in_chans=in_shape[0],
        num_classes=num_classes,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        drop_rate=dropout_rate,
        **kw,
    )


register_backbone(
    BackboneSpec(
        "digits_cnn",
        _digits_cnn,
        "cnn",
        "3-block CNN for the built-in 8×8 digits",
        layered_class=DigitsCNN,
    )
)
register_backbone(
    BackboneSpec(
        "resnet18",
        _tu_resnet(18),
        "resnet",
        "CIFAR-style ResNet-18 (torch-uncertainty)",
        depth=18,
    )
)
register_backbone(
    BackboneSpec(
        "resnet50",
        _tu_resnet(50),
        "resnet",
        "CIFAR-style ResNet-50 (torch-uncertainty)",
        depth=50,
    )
)
register_backbone(
    BackboneSpec(
        "wrn28_10", _tu_wrn, "wideresnet", "CIFAR-style WideResNet-28-10 (torch-uncertainty)"
    )
)
register_backbone(
    BackboneSpec(
        "wrn28_8",
        _tu_wrn28_8,
        # Its own family: torch-uncertainty's packed/batched/MIMO/masked builders exist only for
        # 28×10, so those methods must refuse it rather than silently build a WRN-28-10.
        "wideresnet28x8",
        "CIFAR-style WideResNet-28-8 (torch-uncertainty; σN-Ens's CIFAR-100 network)",
    )
)
register_backbone(
    BackboneSpec(
        "tv_resnet18",
        _tv_resnet18,
        "torchvision",
        "torchvision ImageNet-style ResNet-18 (pretrained conversion)",
    )
)
register_backbone(
    BackboneSpec(
        "vit_small_32",
        _vit,
        "vit",
        "timm ViT for 32×32 inputs, patch 4, 192-d, 9 blocks (LayerNorm)",
    )
)
