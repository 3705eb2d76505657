"""Backbones: the networks every method is built on, one module per family of sources.

Every module of this package is imported on the backbone registry's first lookup
(:data:`harness.registry.BACKBONES`), so a new backbone is one new file here calling
:func:`register_backbone` at import. ``vision`` holds the CIFAR-style ResNets/WideResNet
(torch-uncertainty), torchvision's ResNet-18, the 32×32 ViT (timm) and the digits CNN;
``imagenet`` the ImageNet-sized ones; ``text`` the text transformer; ``weights`` resolves
``pretrained: timm:NAME`` / ``torchvision:ENUM.VALUE`` from those libraries' caches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.registry import BACKBONES

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class BackboneSpec:
    """Registration record of a backbone.

    Attributes:
        name: Registry name.
        build: ``build(in_shape, num_classes, **kwargs) -> nn.Module``; kwargs include
            ``dropout_rate`` (used by MC Dropout).
        family: "cnn", "resnet", "wideresnet", "vit", "transformer", or a new one; a method
            declares the families it can build on (``MethodSpec.families``; None: any), and
            ``methods: [all]`` leaves out, with the reason ``harness validate`` prints, every
            method that does not declare the family of a grid backbone.
        description: one line for ``harness ls``.
        tu_arch: torch-uncertainty's ResNet depth for the "resnet" family (18, 50, ...).
        tu_style: the ``style`` torch-uncertainty's ResNet builders get: "cifar" (3×3 stem, no
            max-pool) or "imagenet".
        layered: for a "cnn"-family CNN that the torch-uncertainty methods rebuild with their own
            layers: the class, called as ``layered(in_channels, num_classes, width=,
            dropout_rate=, conv=, linear=, channels=)``; None: the digits CNN.
    """

    name: str
    build: Callable[..., nn.Module]
    family: str
    description: str = ""
    tu_arch: int | None = None
    tu_style: str = "cifar"
    layered: Callable[..., nn.Module] | None = None


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    BACKBONES.register(spec.name, spec)
    return spec


def _no_extra(kw: dict[str, Any], name: str) -> None:
    if kw:
        raise TypeError(f"backbone {name!r} got unknown options {sorted(kw)}")
