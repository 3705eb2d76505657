"""Backbones: the networks every method is built on, one module per family of sources.

``ls harness/backbones`` is the list of backbone modules: every module of this package whose
name does not start with ``_`` registers backbones and is imported on the backbone registry's
first lookup (:data:`harness.registry.BACKBONES`), so a new backbone is one new file here
calling :func:`register_backbone` at import (a plugin outside the repository imports both from
:mod:`harness.plugins`). ``vision`` holds the CIFAR-style ResNets/WideResNet
(torch-uncertainty), torchvision's ResNet-18, the 32×32 ViT (timm) and the digits CNN;
``grey28`` the 28×28 CNNs of Fashion-MNIST; ``imagenet`` the ImageNet-sized ones; ``text`` the
text transformer. The private ``_weights`` registers nothing: it resolves ``pretrained:
timm:NAME`` / ``torchvision:ENUM.VALUE`` from those libraries' caches and fits weight files to
a backbone.
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
        depth: the architecture's depth where its family has several (a "resnet": 18, 50, ...);
            None: one depth.
        stem: the input stem: "cifar" (a 3×3 convolution, no max-pool: small images) or
            "imagenet" (7×7 stride 2 and a max-pool).
        layered_class: the network class ``build`` instantiates, when it takes its layers as
            factories: called as ``layered_class(in_channels, num_classes, width=,
            dropout_rate=, conv=, linear=, channels=)``, so that the same network can be built
            from other layers (a "cnn"-family CNN); None: it does not.

    What a backbone declares is what it is (family, depth, stem, its layer factories); which
    method builds on which family is the method's (``MethodSpec.families``), never the spec's.
    """

    name: str
    build: Callable[..., nn.Module]
    family: str
    description: str = ""
    depth: int | None = None
    stem: str = "cifar"
    layered_class: Callable[..., nn.Module] | None = None


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    """Register a backbone spec in the global backbone registry (what a backbone module or
    plugin calls at import). Raises ``DuplicateNameError`` for a name already registered."""
    BACKBONES.register(spec.name, spec)
    return spec


def _no_extra(kw: dict[str, Any], name: str) -> None:
    if kw:
        raise TypeError(f"backbone {name!r} got unknown options {sorted(kw)}")
