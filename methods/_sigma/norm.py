"""σNorm layers: member-specific normalizations with a sigmoid-bounded importance.

The converter and ensemble wrapper are in ``methods/_sigma/convert.py``; the regularizer and the
k_eff diagnostics in ``methods/_sigma/diversity.py``. The layer base class lives in
``methods/_sigma/norm_base.py`` and the BatchNorm layers in ``methods/_sigma/batchnorm.py``; this
module holds the LayerNorm/GroupNorm layers and re-exports all of them.

σN-Ens (Suteu & Serban, 2026, "Controllable Diversity in Normalization-Based Implicit Ensembles via
Softmax-Temperature Modulation") turns one backbone into an implicit ensemble of M members by
replacing each normalization layer with M member-specific normalizations, each followed by a
sigmoid-bounded per-feature importance:

    σNorm_m(x) = sigmoid(γ_m) ⊙ norm_m(x)        m = 1..M,  γ_m ∈ R^C

``norm_m`` has its own affine weight and bias and, for BatchNorm, its own batch statistics (over
member m's slice of the batch only) and running statistics. Everything else is shared.

The FiLM-Ensemble ablation (Turkoglu et al., NeurIPS 2022, "FiLM-Ensemble: Probabilistic Deep
Learning via Feature-wise Linear Modulation") is the same layer without γ: per-member affine only
(``variant="film"``).

Layout. Members are batched, never looped: activations are stacked member-major, (M·B, C, ...)
with rows ``m·B .. (m+1)·B - 1`` belonging to member m, and the head's logits are viewed as
(M, B, K). Every layer reshapes its input to (M, B, C, ...) and reduces over the right dimensions.

Speed (target: within 5% of the plain backbone processing M·B images). In eval, running
statistics, affine and sigmoid(γ) fold into one (M, C) scale and shift applied with a single
broadcasted multiply-add (the same memory traffic as an inference BatchNorm). In training,
BatchNorm runs PyTorch's own batch-norm kernel on each member's block of rows on the CPU, fused
Triton kernels on CUDA, and under ``torch.compile`` a reference path (one ``var_mean`` reduction
in float32 and one fused multiply-add in a custom autograd function that saves only the input
and (M, C) statistics, like cuDNN's BatchNorm; no data-dependent Python control flow, no
``.item()``); ``methods/_sigma/batchnorm.py`` says when each runs. Inputs may be channels_last
and bf16 (autocast); statistics are always computed in float32.

This module imports only torch and registers nothing; the method plugin wraps it.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from methods._sigma.batchnorm import SigmaBatchNorm1d, SigmaBatchNorm2d, SigmaBatchNorm3d
from methods._sigma.norm_base import VARIANTS, SigmaNorm

__all__ = [
    "VARIANTS",
    "SigmaBatchNorm1d",
    "SigmaBatchNorm2d",
    "SigmaBatchNorm3d",
    "SigmaGroupNorm",
    "SigmaLayerNorm",
    "SigmaNorm",
    "sigma_norm_layers",
]


class SigmaLayerNorm(SigmaNorm):
    """Per-member LayerNorm affine followed by sigmoid(γ_m) (σN-Ens), or FiLM's per-member affine.

    LayerNorm statistics are per sample, so members are isolated by construction: the input is
    normalised once without affine (``F.layer_norm``) and the (M, *normalized_shape) effective
    affine is applied to the (M, B, ...) view with one broadcasted multiply-add.

    Args:
        normalized_shape: Trailing shape normalised over (e.g. (C,) for ViT tokens (M·B, N, C)).
        num_members: M.
        eps: as in ``nn.LayerNorm``.
        channels_first: Normalise over dim 1 of (M·B, C, H, W) instead (timm's ``LayerNorm2d``).
        **kwargs: see :class:`SigmaNorm`.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        num_members: int,
        eps: float = 1e-5,
        channels_first: bool = False,
        **kwargs: Any,
    ) -> None:
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        normalized_shape = tuple(int(s) for s in normalized_shape)
        if channels_first and len(normalized_shape) != 1:
            raise ValueError(f"channels_first needs a 1-D normalized_shape, got {normalized_shape}")
        super().__init__(normalized_shape, num_members, **kwargs)
        self.normalized_shape = normalized_shape
        self.eps = float(eps)
        self.channels_first = bool(channels_first)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (M·B, ..., *normalized_shape), or (M·B, C, *S) if channels_first."""
        m = self.num_members
        b = self._num_rows_per_member(x)
        if self.channels_first:
            xt = x.movedim(1, -1)  # (M·B, *S, C) view
            xhat = F.layer_norm(xt, self.normalized_shape, None, None, self.eps).movedim(-1, 1)
        else:
            xhat = F.layer_norm(x, self.normalized_shape, None, None, self.eps)  # x.shape
        scale, shift = self.effective_affine()  # (M, *F) float32
        if self.channels_first:
            bshape = (m, 1, self.feature_shape[0], *([1] * (x.dim() - 2)))  # (M, 1, C, 1..)
        else:
            n_mid = x.dim() - 1 - len(self.normalized_shape)
            bshape = (m, 1, *([1] * n_mid), *self.normalized_shape)  # (M, 1, 1.., *F)
        xm = xhat.view(m, b, *x.shape[1:])  # (M, B, ...)
        y = torch.addcmul(
            shift.view(bshape).to(xhat.dtype), xm, scale.view(bshape).to(xhat.dtype)
        )  # (M, B, ...)
        return y.view(xhat.shape)  # (M·B, ...)

    @classmethod
    def from_norm(
        cls, norm: nn.LayerNorm, num_members: int, *, preserve_outputs: bool = False, **kwargs: Any
    ) -> SigmaLayerNorm:
        """Build from a (trained) LayerNorm (incl. timm subclasses), copying its affine."""
        channels_first = "2d" in type(norm).__name__.lower()  # timm LayerNorm2d & co: NCHW
        p = norm.weight
        new = cls(
            tuple(norm.normalized_shape),
            num_members,
            eps=norm.eps,
            channels_first=channels_first,
            device=p.device if p is not None else None,
            **kwargs,
        )
        new.load_member_affine(norm.weight, getattr(norm, "bias", None), preserve_outputs)
        return new

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, num_members={self.num_members}, variant={self.variant!r}, "
            f"eps={self.eps}, channels_first={self.channels_first}"
        )


class SigmaGroupNorm(SigmaNorm):
    """Per-member GroupNorm affine followed by sigmoid(γ_m) (σN-Ens), or FiLM's per-member affine.

    GroupNorm statistics are per sample and group, so members are isolated by construction; the
    (M, C) effective affine is applied to the (M, B, C, *S) view with one multiply-add.

    Args:
        num_groups: G (C must be divisible by G).
        num_channels: C.
        num_members: M.
        eps: as in ``nn.GroupNorm``.
        **kwargs: see :class:`SigmaNorm`.
    """

    def __init__(
        self, num_groups: int, num_channels: int, num_members: int, eps: float = 1e-5, **kwargs
    ) -> None:
        if num_channels % num_groups:
            raise ValueError(
                f"num_channels={num_channels} not divisible by num_groups={num_groups}"
            )
        super().__init__((num_channels,), num_members, **kwargs)
        self.num_groups = int(num_groups)
        self.num_channels = int(num_channels)
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (M·B, C, *S). Returns: (M·B, C, *S)."""
        m, c = self.num_members, self.num_channels
        b = self._num_rows_per_member(x)
        xhat = F.group_norm(x, self.num_groups, None, None, self.eps)  # (M·B, C, *S)
        scale, shift = self.effective_affine()  # (M, C) float32
        bshape = (m, 1, c, *([1] * (x.dim() - 2)))  # (M, 1, C, 1..)
        xm = xhat.view(m, b, *x.shape[1:])  # (M, B, C, *S)
        y = torch.addcmul(shift.view(bshape).to(xhat.dtype), xm, scale.view(bshape).to(xhat.dtype))
        return y.view(xhat.shape)  # (M·B, C, *S)

    @classmethod
    def from_norm(
        cls, norm: nn.GroupNorm, num_members: int, *, preserve_outputs: bool = False, **kwargs: Any
    ) -> SigmaGroupNorm:
        """Build from a (trained) GroupNorm, copying its affine into all members."""
        p = norm.weight
        new = cls(
            norm.num_groups,
            norm.num_channels,
            num_members,
            eps=norm.eps,
            device=p.device if p is not None else None,
            **kwargs,
        )
        new.load_member_affine(norm.weight, norm.bias, preserve_outputs)
        return new

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, num_members={self.num_members}, "
            f"variant={self.variant!r}, eps={self.eps}"
        )


def sigma_norm_layers(
    model: nn.Module, layer_pattern: str | None = None, with_gamma: bool = False
) -> list[tuple[str, SigmaNorm]]:
    """(qualified name, layer) of the σNorm layers whose name matches ``layer_pattern``.

    Args:
        model: Any module.
        layer_pattern: Regex searched (``re.search``) in the qualified module name; None = all.
        with_gamma: Keep only layers that have γ (``variant="sigma"``).
    """
    rx = re.compile(layer_pattern) if layer_pattern is not None else None
    out = []
    for name, mod in model.named_modules():
        if not isinstance(mod, SigmaNorm):
            continue
        if with_gamma and mod.gamma is None:
            continue
        if rx is not None and not rx.search(name):
            continue
        out.append((name, mod))
    return out
