"""Backbones for 224×224 ImageNet inputs.

- ``resnet50_imagenet``: torch-uncertainty's ResNet-50 in ImageNet style (7×7 stride-2 stem and
  max-pool; 25,557,032 parameters at K=1000, the same count and layer shapes as torchvision's
  ``resnet50``). torch-uncertainty's, not torchvision's, so that Packed-Ensembles, BatchEnsemble,
  MIMO and Masksembles build their own ResNet-50 from the same library in the same style
  (``packed_resnet``/``batched_resnet``/``mimo_resnet``/``masked_resnet`` with ``arch=50,
  style="imagenet"``, chosen through the spec's ``stem="imagenet"``). Keyword options go to
  torch-uncertainty's ``resnet`` (e.g. ``width_multiplier``), and ``input_size`` resizes the
  inputs first (the CPU tests train a 1/16-width ResNet-50 on 32×32 inputs).
- ``tv_resnet50``: torchvision's ResNet-50, for converting published weights
  (``pretrained: torchvision:ResNet50_Weights.IMAGENET1K_V2``).
- ``vit_b16``: timm's ``vit_base_patch16_224`` (ViT-B/16, LayerNorm, 86.6 M parameters at
  K=1000), built offline without weights; pre-trained weights come through ``pretrained:
  timm:vit_base_patch16_224.augreg2_in21k_ft_in1k`` (:mod:`harness.backbones._weights`).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from harness.backbones import BackboneSpec, _no_extra, register_backbone


class InputResize(nn.Module):
    """Bilinear (antialiased) resize of a (B, C, H, W) batch to (B, C, size, size)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=True)


def _tu_resnet50(
    in_shape, num_classes, dropout_rate: float = 0.0, input_size: int | None = None, **kw: Any
) -> nn.Module:
    """torch-uncertainty's ResNet-50, ImageNet style. ``input_size`` shrinks the inputs inside the
    network first (smoke runs and CPU tests of the ImageNet pipeline: a 1/16-width ResNet-50 at
    32×32 instead of 224×224); the default None takes them as the data gives them."""
    from torch_uncertainty.models.classification import resnet

    net = resnet(
        in_channels=in_shape[0],
        num_classes=num_classes,
        arch=50,
        dropout_rate=dropout_rate,
        style="imagenet",
        **kw,
    )
    return net if input_size is None else nn.Sequential(InputResize(input_size), net)


def _tv_resnet50(in_shape, num_classes, dropout_rate: float = 0.0, **kw: Any) -> nn.Module:
    import torchvision

    _no_extra(kw, "tv_resnet50")
    model = torchvision.models.resnet50(weights=None, num_classes=num_classes)
    if in_shape[0] != 3:
        model.conv1 = nn.Conv2d(in_shape[0], 64, 7, 2, 3, bias=False)
    if dropout_rate:
        model.fc = nn.Sequential(nn.Dropout(dropout_rate), model.fc)
    return model


def _vit_b16(in_shape, num_classes, dropout_rate: float = 0.0, **kw: Any) -> nn.Module:
    import timm

    # timm's own config of the model the pretrained weights belong to (so their keys and shapes
    # match); img_size follows the dataset.
    return timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        num_classes=num_classes,
        in_chans=in_shape[0],
        img_size=in_shape[1],
        drop_rate=dropout_rate,
        **kw,
    )


register_backbone(
    BackboneSpec(
        "resnet50_imagenet",
        _tu_resnet50,
        "resnet",
        "ImageNet-style ResNet-50 (torch-uncertainty; 7×7 stem + max-pool, 224×224 inputs)",
        depth=50,
        stem="imagenet",
    )
)
register_backbone(
    BackboneSpec(
        "tv_resnet50",
        _tv_resnet50,
        "torchvision",
        "torchvision ImageNet-style ResNet-50 (pretrained conversion)",
    )
)
register_backbone(
    BackboneSpec(
        "vit_b16",
        _vit_b16,
        "vit",
        "timm ViT-B/16 (vit_base_patch16_224, LayerNorm), 224×224 inputs, no weights built in",
    )
)
