"""σNorm layers: member-specific normalizations with a sigmoid-bounded importance.

The converter and ensemble wrapper are in ``methods/sigma_convert.py``; the regularizer and the
k_eff diagnostics in ``methods/sigma_diversity.py``.

σN-Ens (Suteu & Serban, 2026, "Controllable Diversity in Normalization-Based Implicit Ensembles via
Softmax-Temperature Modulation") turns one backbone into an implicit ensemble of M members by
replacing each normalization layer with M member-specific normalizations, each followed by a
sigmoid-bounded per-feature importance (DESIGN.md §2):

    σNorm_m(x) = sigmoid(γ_m) ⊙ norm_m(x)        m = 1..M,  γ_m ∈ R^C

``norm_m`` has its own affine weight and bias and, for BatchNorm, its own batch statistics (over
member m's slice of the batch only) and running statistics. Everything else is shared.

The FiLM-Ensemble ablation (Turkoglu et al., NeurIPS 2022, "FiLM-Ensemble: Probabilistic Deep
Learning via Feature-wise Linear Modulation") is the same layer without γ: per-member affine only
(``variant="film"``).

Layout. Members are batched, never looped: activations are stacked member-major, (M·B, C, ...)
with rows ``m·B .. (m+1)·B - 1`` belonging to member m, and the head's logits are viewed as
(M, B, K). Every layer reshapes its input to (M, B, C, ...) and reduces over the right dimensions.

Speed (DESIGN.md §6: within 5% of the plain backbone processing M·B images). In eval, running
statistics, affine and sigmoid(γ) fold into one (M, C) scale and shift applied with a single
broadcasted multiply-add (the same memory traffic as an inference BatchNorm). In training,
BatchNorm statistics come from one ``var_mean`` reduction in float32 and are applied by one fused
multiply-add; a custom autograd function saves only the input and (M, C) statistics, like cuDNN's
BatchNorm, so eager peak memory matches the plain backbone's, and it traces without graph breaks
under ``torch.compile`` (no data-dependent Python control flow, no ``.item()``). Inputs may be
channels_last and bf16 (autocast); statistics are always computed in float32.

This module imports only torch and registers nothing; the method plugin wraps it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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

VARIANTS = ("sigma", "film")


def _acc(t: Tensor) -> Tensor:
    """``t`` in its accumulation dtype: float32 for half/bfloat16, unchanged otherwise."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# --------------------------------------------------------------------------------------------
# Fused per-member batch normalization (training)
# --------------------------------------------------------------------------------------------


class _MemberBatchNormTrain(torch.autograd.Function):
    """Per-member batch normalization with a fused per-(member, channel) scale and shift.

    ``y = (x - μ_{m,c}) · rsqrt(σ²_{m,c} + eps) · scale_{m,c} + shift_{m,c}`` with the biased
    statistics of member m's slice. Forward: one float32 ``var_mean`` and one multiply-add.
    Backward: the closed-form BatchNorm gradient, from the saved input and (M, C) statistics only.

    Inputs:
        x: (M, B, C, *S) activations (any dtype, any strides).
        scale, shift: (M, 1, C, 1, ..., 1) float32 effective affine (already × sigmoid(γ)).
        eps: float.
        dims: reduction dimensions, (1, 3, 4, ...).

    Outputs:
        y (x's shape and dtype), and the non-differentiable float32 batch mean and biased
        variance, both (M, 1, C, 1, ..., 1).
    """

    @staticmethod
    def forward(x: Tensor, scale: Tensor, shift: Tensor, eps: float, dims: tuple[int, ...]):
        x32 = _acc(x)  # (M, B, C, *S) float32 (no copy when x is float32 or float64)
        var, mean = torch.var_mean(x32, dim=dims, correction=0, keepdim=True)  # (M, 1, C, 1..)
        rstd = torch.rsqrt(var + eps)  # (M, 1, C, 1..)
        a = scale * rstd  # (M, 1, C, 1..)
        b = shift - mean * a  # (M, 1, C, 1..)
        y = torch.addcmul(b.to(x.dtype), x, a.to(x.dtype))  # (M, B, C, *S), x's strides
        return y, mean, var

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, scale, _shift, _eps, dims = inputs
        _y, mean, var = output
        rstd = torch.rsqrt(var + inputs[3])
        ctx.save_for_backward(x, scale, mean, rstd)
        ctx.dims = dims
        ctx.mark_non_differentiable(mean, var)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: Tensor, _grad_mean: Tensor, _grad_var: Tensor):
        x, scale, mean, rstd = ctx.saved_tensors
        dims = ctx.dims
        n = x.numel() // mean.numel()  # elements per (member, channel): B·prod(S)
        g = _acc(grad_y)  # (M, B, C, *S)
        xc = _acc(x) - mean  # (M, B, C, *S) centred input
        sum_g = g.sum(dim=dims, keepdim=True)  # (M, 1, C, 1..)
        dot = (g * xc).sum(dim=dims, keepdim=True)  # (M, 1, C, 1..)  Σ g·(x-μ)
        grad_scale = dot * rstd  # (M, 1, C, 1..)  Σ g·x̂
        grad_shift = sum_g  # (M, 1, C, 1..)
        grad_x = None
        if ctx.needs_input_grad[0]:
            a = scale * rstd  # (M, 1, C, 1..)
            c_x = -a * rstd * rstd * dot / n  # (M, 1, C, 1..) coefficient of (x - μ)
            c_0 = -a * sum_g / n  # (M, 1, C, 1..) constant term
            # dx = a·(g - mean(g) - x̂·mean(g·x̂)) = a·g + c_x·(x-μ) + c_0
            grad_x = torch.addcmul(torch.addcmul(c_0, xc, c_x), g, a).to(x.dtype)
        return grad_x, grad_scale, grad_shift, None, None


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------


class SigmaNorm(nn.Module):
    """Base class of the σNorm layers: per-member affine, optional sigmoid-bounded importance γ.

    Parameters (F = the feature shape: (C,) for BatchNorm/GroupNorm, ``normalized_shape`` for
    LayerNorm):
        weight: (M, *F) member-specific affine scale of ``norm_m``.
        bias: (M, *F) member-specific affine shift of ``norm_m``.
        gamma: (M, *F) importance logits, only for ``variant="sigma"`` (None for "film").

    Effective per-member affine: ``scale = weight · sigmoid(γ)``, ``shift = bias · sigmoid(γ)``
    (σN-Ens, Suteu & Serban 2026), or ``weight``/``bias`` alone (FiLM-Ensemble, Turkoglu et al.
    2022).

    Args:
        feature_shape: F.
        num_members: M.
        variant: "sigma" (σN-Ens) or "film" (FiLM-Ensemble, no γ).
        gamma_init_mean, gamma_init_std: γ ~ N(mean, std²) independently per member and feature.
            Members need distinct γ: with equal γ the diversity regularizer's gradient is zero
            and shared weights give members identical updates.
        generator: Optional CPU generator for the γ initialisation.
        device, dtype: Factory kwargs of the parameters.
    """

    gamma: nn.Parameter | None

    def __init__(
        self,
        feature_shape: tuple[int, ...],
        num_members: int,
        *,
        variant: str = "sigma",
        gamma_init_mean: float = 0.0,
        gamma_init_std: float = 1.0,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if num_members < 1:
            raise ValueError(f"num_members must be >= 1, got {num_members}")
        self.num_members = int(num_members)
        self.feature_shape = tuple(int(s) for s in feature_shape)
        self.variant = variant
        shape = (self.num_members, *self.feature_shape)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(shape, **factory))  # (M, *F)
        self.bias = nn.Parameter(torch.zeros(shape, **factory))  # (M, *F)
        if variant == "sigma":
            self.gamma = nn.Parameter(torch.zeros(shape, **factory))  # (M, *F)
            self.reset_gamma(gamma_init_mean, gamma_init_std, generator)
        else:
            self.register_parameter("gamma", None)

    @torch.no_grad()
    def reset_gamma(
        self, mean: float = 0.0, std: float = 1.0, generator: torch.Generator | None = None
    ) -> None:
        """Draw γ ~ N(mean, std²) per member and feature (no-op for FiLM)."""
        if self.gamma is None:
            return
        noise = torch.randn(self.gamma.shape, generator=generator, dtype=torch.float32)
        self.gamma.copy_(noise * std + mean)

    def importance(self) -> Tensor:
        """sigmoid(γ), (M, *F); all ones for FiLM."""
        if self.gamma is None:
            return torch.ones_like(self.weight)
        return torch.sigmoid(self.gamma)

    def effective_affine(self) -> tuple[Tensor, Tensor]:
        """The affine actually applied after normalization (float32 for half/bf16 parameters).

        Returns:
            scale, shift: (M, *F) = weight·sigmoid(γ), bias·sigmoid(γ) (or weight, bias).
        """
        w, b = _acc(self.weight), _acc(self.bias)  # (M, *F)
        if self.gamma is None:
            return w, b
        s = torch.sigmoid(_acc(self.gamma))  # (M, *F)
        return w * s, b * s

    @torch.no_grad()
    def load_member_affine(
        self, weight: Tensor | None, bias: Tensor | None, preserve_outputs: bool = False
    ) -> None:
        """Copy one trained affine (shape F, or None = identity) into all M members.

        With ``preserve_outputs`` each member's copy is divided by its sigmoid(γ_m), so the
        effective affine ``sigmoid(γ_m)·(w/sigmoid(γ_m))`` equals ``w`` (up to float rounding).
        """
        w = torch.ones(self.feature_shape) if weight is None else weight.detach().float().cpu()
        b = torch.zeros(self.feature_shape) if bias is None else bias.detach().float().cpu()
        w = w.reshape(self.feature_shape).to(self.weight.device)  # (*F)
        b = b.reshape(self.feature_shape).to(self.weight.device)  # (*F)
        w_m = w.unsqueeze(0).expand_as(self.weight)  # (M, *F)
        b_m = b.unsqueeze(0).expand_as(self.bias)  # (M, *F)
        if preserve_outputs and self.gamma is not None:
            s = torch.sigmoid(self.gamma.float())  # (M, *F)
            w_m, b_m = w_m / s, b_m / s
        self.weight.copy_(w_m)
        self.bias.copy_(b_m)

    def _num_rows_per_member(self, x: Tensor) -> int:
        n = x.shape[0]
        if n % self.num_members:
            raise ValueError(
                f"{type(self).__name__}: batch of {n} rows is not a multiple of "
                f"num_members={self.num_members} (expected member-major (M·B, ...) input)"
            )
        return n // self.num_members

    def extra_repr(self) -> str:
        return f"{self.feature_shape}, num_members={self.num_members}, variant={self.variant!r}"


class _SigmaBatchNorm(SigmaNorm):
    """Per-member BatchNorm followed by sigmoid(γ_m) (σN-Ens) or per-member affine only (FiLM).

    Input (M·B, C, *S), member-major. Member m's batch statistics are computed over its own
    B·prod(S) values per channel; biased variance normalises, the unbiased one updates its
    running statistics, exactly as ``nn.BatchNorm`` does per member.

    Args:
        num_features: C.
        num_members: M.
        eps, momentum, track_running_stats: as in ``nn.BatchNorm`` (momentum None = cumulative
            moving average driven by ``num_batches_tracked``).
        **kwargs: see :class:`SigmaNorm` (variant, γ init, generator, device, dtype).

    Buffers:
        running_mean, running_var: (M, C); num_batches_tracked: (M,) long (all members are
        updated in lockstep, each keeps its own counter).
    """

    _expected_dims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        num_members: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        track_running_stats: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__((num_features,), num_members, **kwargs)
        self.num_features = int(num_features)
        self.eps = float(eps)
        self.momentum = momentum
        self.track_running_stats = bool(track_running_stats)
        dev = kwargs.get("device")
        if self.track_running_stats:
            m, c = self.num_members, self.num_features
            self.register_buffer("running_mean", torch.zeros(m, c, device=dev))  # (M, C)
            self.register_buffer("running_var", torch.ones(m, c, device=dev))  # (M, C)
            self.register_buffer(
                "num_batches_tracked", torch.zeros(m, dtype=torch.long, device=dev)
            )  # (M,)
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (M·B, C, *S). Returns: (M·B, C, *S), same dtype and memory format."""
        if x.dim() not in self._expected_dims:
            raise ValueError(
                f"{type(self).__name__} expects {' or '.join(map(str, self._expected_dims))}-D "
                f"input, got {x.dim()}-D"
            )
        m, c = self.num_members, self.num_features
        b = self._num_rows_per_member(x)
        spatial = tuple(x.shape[2:])
        xs = x.view(m, b, c, *spatial)  # (M, B, C, *S)
        bshape = (m, 1, c, *([1] * len(spatial)))  # broadcast shape of per-(member, channel)
        scale, shift = self.effective_affine()  # (M, C) each, float32
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            # Fold running stats, affine and sigmoid(γ) into one scale/shift: y = x·a + b.
            a = scale * torch.rsqrt(self.running_var + self.eps)  # (M, C)
            sh = shift - self.running_mean * a  # (M, C)
            y = torch.addcmul(sh.view(bshape).to(x.dtype), xs, a.view(bshape).to(x.dtype))
            return y.view(x.shape)  # (M·B, C, *S)

        n = b * math.prod(spatial)  # values per (member, channel)
        if n <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel per member when training, got input "
                f"of shape {tuple(x.shape)} with num_members={m}"
            )
        dims = (1, *range(3, 3 + len(spatial)))
        y, mean, var = _MemberBatchNormTrain.apply(
            xs, scale.view(bshape), shift.view(bshape), self.eps, dims
        )  # (M, B, C, *S), (M, 1, C, 1..), (M, 1, C, 1..)
        if self.training and self.track_running_stats:
            self._update_running_stats(mean.view(m, c), var.view(m, c), n)
        return y.view(x.shape)  # (M·B, C, *S)

    @torch.no_grad()
    def _update_running_stats(self, mean: Tensor, var: Tensor, n: int) -> None:
        """nn.BatchNorm's update per member: lerp towards the batch mean and unbiased variance."""
        rm, rv = self.running_mean, self.running_var  # (M, C) each
        self.num_batches_tracked.add_(1)  # (M,)
        if self.momentum is None:  # cumulative moving average
            factor: float | Tensor = (1.0 / self.num_batches_tracked.to(rm.dtype)).unsqueeze(1)
        else:
            factor = float(self.momentum)
        rm.lerp_(mean.to(rm.dtype), factor)  # (M, C)
        rv.lerp_((var * (n / (n - 1))).to(rv.dtype), factor)  # (M, C) unbiased variance

    @classmethod
    def from_norm(
        cls,
        norm: nn.modules.batchnorm._BatchNorm,
        num_members: int,
        *,
        preserve_outputs: bool = False,
        **kwargs: Any,
    ) -> _SigmaBatchNorm:
        """Build from a (trained) BatchNorm, copying its affine and running stats into all members.

        Args:
            norm: The BatchNorm to replace.
            num_members: M.
            preserve_outputs: Divide each member's affine by sigmoid(γ_m) (see
                :func:`convert_to_ensemble`).
            **kwargs: variant, gamma_init_mean, gamma_init_std, generator.
        """
        p = norm.weight if norm.weight is not None else norm.running_mean
        dev = p.device if p is not None else None
        new = cls(
            norm.num_features,
            num_members,
            eps=norm.eps,
            momentum=norm.momentum,
            track_running_stats=norm.track_running_stats and norm.running_mean is not None,
            device=dev,
            **kwargs,
        )
        new.load_member_affine(norm.weight, norm.bias, preserve_outputs)
        if new.track_running_stats:
            with torch.no_grad():
                new.running_mean.copy_(
                    norm.running_mean.float().unsqueeze(0).expand_as(new.running_mean)
                )  # (M, C)
                new.running_var.copy_(
                    norm.running_var.float().unsqueeze(0).expand_as(new.running_var)
                )  # (M, C)
                if norm.num_batches_tracked is not None:
                    new.num_batches_tracked.fill_(norm.num_batches_tracked)
        return new

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, num_members={self.num_members}, variant={self.variant!r}, "
            f"eps={self.eps}, momentum={self.momentum}, "
            f"track_running_stats={self.track_running_stats}"
        )


class SigmaBatchNorm1d(_SigmaBatchNorm):
    """σNorm for ``nn.BatchNorm1d``: input (M·B, C) or (M·B, C, L). See :class:`_SigmaBatchNorm`."""

    _expected_dims = (2, 3)


class SigmaBatchNorm2d(_SigmaBatchNorm):
    """σNorm for ``nn.BatchNorm2d``: input (M·B, C, H, W), NCHW or channels_last."""

    _expected_dims = (4,)


class SigmaBatchNorm3d(_SigmaBatchNorm):
    """σNorm for ``nn.BatchNorm3d``: input (M·B, C, D, H, W)."""

    _expected_dims = (5,)


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
