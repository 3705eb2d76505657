"""Turning any backbone into a σN-Ens (or FiLM-Ensemble): the generic converter and the
ensemble wrapper that runs the converted backbone on M member-major copies of the batch
(Suteu & Serban 2026; Turkoglu et al. 2022).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from methods._sigma.norm import (
    VARIANTS,
    SigmaBatchNorm1d,
    SigmaBatchNorm2d,
    SigmaBatchNorm3d,
    SigmaGroupNorm,
    SigmaLayerNorm,
    SigmaNorm,
    sigma_norm_layers,
)

_NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)


def _is_plain_norm(module: nn.Module) -> bool:
    return isinstance(module, _NORM_TYPES) and not isinstance(module, SigmaNorm)


def _convert_one(module: nn.Module, num_members: int, **kwargs: Any) -> nn.Module:
    """σNorm replacement of one norm layer (keeps a timm ``*Act`` norm's drop/act after it)."""
    if isinstance(module, nn.BatchNorm3d):
        new: nn.Module = SigmaBatchNorm3d.from_norm(module, num_members, **kwargs)
    elif isinstance(module, nn.BatchNorm2d):
        new = SigmaBatchNorm2d.from_norm(module, num_members, **kwargs)
    elif isinstance(module, nn.BatchNorm1d):
        new = SigmaBatchNorm1d.from_norm(module, num_members, **kwargs)
    elif isinstance(module, nn.LayerNorm):
        new = SigmaLayerNorm.from_norm(module, num_members, **kwargs)
    else:
        new = SigmaGroupNorm.from_norm(module, num_members, **kwargs)
    # timm's BatchNormAct2d / GroupNormAct / LayerNormAct fuse dropout and activation into the norm.
    tail = [
        getattr(module, k)
        for k in ("drop", "act")
        if isinstance(getattr(module, k, None), nn.Module)
    ]
    if tail:
        new = nn.Sequential(new, *tail)
    return new


def convert_to_ensemble(
    model: nn.Module,
    num_members: int,
    variant: str = "sigma",
    gamma_init_std: float = 1.0,
    gamma_init_mean: float = 0.0,
    generator: torch.Generator | None = None,
    preserve_outputs: bool = False,
    inplace: bool = False,
    gate_gain: float = 1.0,
) -> nn.Module:
    """Turn any backbone into a σN-Ens (or FiLM-Ensemble) by replacing its normalization layers.

    Every ``nn.BatchNorm1d/2d/3d``, ``nn.LayerNorm`` (incl. timm's subclasses; ``LayerNorm2d``
    keeps its channel-first semantics) and ``nn.GroupNorm`` at any depth is replaced by the
    σNorm equivalent (Suteu & Serban 2026; FiLM: Turkoglu et al. 2022), copying the trained
    layer's affine (or 1/0 when it has none) and running statistics into all M members. The
    converted model expects member-major stacked inputs (M·B, ...); wrap it in
    :class:`SigmaEnsembleNet` to feed (B, ...) batches and get (M, B, K) logits.

    γ is drawn per member and feature from N(gamma_init_mean, gamma_init_std²) in module order
    (reproducible with ``generator``); equal γ would leave L_div without gradient and the members
    identical.

    Pretrained conversion (``preserve_outputs=True``). Each member's copied affine is divided by
    its own sigmoid(γ_m): ``sigmoid(γ_m)·((w/sigmoid(γ_m))·x̂ + b/sigmoid(γ_m)) = w·x̂ + b``, so
    every member reproduces the original model's predictions at step 0, in eval mode (running
    statistics are copied) and in train mode (each member's batch statistics equal the original
    model's when every member sees the same batch). The only error is float rounding of the
    division/multiplication. Measured in float32, M=4, every member vs the original, eval and
    train mode: max |Δlogit| ≤ 6e-6 on a briefly trained CIFAR ResNet-18 (logits up to ~27,
    i.e. ~2e-7 relative), ≤ 1.2e-6 on a small CNN with BN/GN/LN, ≤ 5e-7 on a small timm ViT;
    the tests assert atol 1e-5. Members then separate during
    fine-tuning through L_div and the task loss. The compensated weight grows as 1/sigmoid(γ_m)
    (≤ ~20 for γ within 3 std of 0 at std 1). For training from scratch keep
    ``preserve_outputs=False``: the fresh norms' weight 1 / bias 0 are copied unchanged and the
    members start scaled by their sigmoid(γ_m). For ``variant="film"`` there is no γ and the copy
    is exact either way.

    Args:
        model: Any module (nested children, ``nn.Sequential``, timm ViT blocks, ...), or a norm
            layer itself.
        num_members: M.
        variant: "sigma" (σN-Ens) or "film" (FiLM-Ensemble).
        gamma_init_std: Std of the γ initialisation.
        gamma_init_mean: Mean of the γ initialisation.
        generator: Optional CPU ``torch.Generator`` for γ.
        preserve_outputs: Compensate sigmoid(γ_m) in the copied affine (pretrained conversion).
        inplace: Modify ``model`` instead of a deep copy.
        gate_gain: Constant c multiplying every gate, c·sigmoid(γ) (see
            :class:`methods._sigma.norm_base.SigmaNorm`; 1 = none).

    Returns:
        The converted module (``model`` itself if ``inplace``, unless ``model`` is a norm layer).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not inplace:
        model = copy.deepcopy(model)
    kwargs = {
        "variant": variant,
        "gamma_init_mean": gamma_init_mean,
        "gamma_init_std": gamma_init_std,
        "generator": generator,
        "preserve_outputs": preserve_outputs,
        "gate_gain": gate_gain,
    }
    if _is_plain_norm(model):
        return _convert_one(model, num_members, **kwargs)
    done: dict[int, nn.Module] = {}  # a norm shared by several parents is converted once
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):  # not deduplicated, unlike named_children
            if not _is_plain_norm(child):
                continue
            if id(child) not in done:
                done[id(child)] = _convert_one(child, num_members, **kwargs)
            setattr(parent, name, done[id(child)])
    return model


class SigmaEnsembleNet(nn.Module):
    """An implicit ensemble: one converted backbone run on M member-major copies of the batch.

    Args:
        backbone: A backbone whose norm layers are σNorm layers with ``num_members`` members
            (from :func:`convert_to_ensemble`), or a plain backbone when ``convert=True``.
        num_members: M.
        convert: Convert ``backbone`` (in place) with :func:`convert_to_ensemble` first.
        **convert_kwargs: Passed to :func:`convert_to_ensemble` (variant, gamma_init_std,
            gamma_init_mean, generator, preserve_outputs).
    """

    def __init__(
        self, backbone: nn.Module, num_members: int, convert: bool = False, **convert_kwargs: Any
    ) -> None:
        super().__init__()
        if convert:
            backbone = convert_to_ensemble(backbone, num_members, inplace=True, **convert_kwargs)
        wrong = [n for n, mod in sigma_norm_layers(backbone) if mod.num_members != num_members]
        if wrong:
            raise ValueError(f"σNorm layers {wrong[:3]} do not have num_members={num_members}")
        self.num_members = int(num_members)
        self.backbone = backbone

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (B, ...). Returns: member logits (M, B, K)."""
        m = self.num_members
        xs = x.repeat(m, *([1] * (x.dim() - 1)))  # (M·B, ...), row m·B + b = x[b]
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            xs = xs.contiguous(memory_format=torch.channels_last)  # keep NHWC
        out = self.backbone(xs)  # (M·B, K)
        return out.view(m, x.shape[0], *out.shape[1:])  # (M, B, K)
