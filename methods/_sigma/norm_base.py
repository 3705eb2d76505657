"""The σNorm base layer: per-member affine with an optional sigmoid-bounded importance γ.

Member-specific normalization layers of σN-Ens (Suteu & Serban 2026) and FiLM-Ensemble
(Turkoglu et al., NeurIPS 2022) derive from :class:`SigmaNorm`; the concrete layers are in
``methods/_sigma/batchnorm.py`` (BatchNorm) and ``methods/_sigma/norm.py`` (LayerNorm, GroupNorm),
which also re-exports everything. Imports only torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

VARIANTS = ("sigma", "film")


def _acc(t: Tensor) -> Tensor:
    """``t`` in its accumulation dtype: float32 for half/bfloat16, unchanged otherwise."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _GradScale(torch.autograd.Function):
    """Identity forward (a view: no kernel), gradient × k backward (one multiply).

    It replaced ``t.detach() + (t - t.detach())·k``, the same values and gradients at three
    kernels more per call forward: called for weight, bias and γ of every σNorm layer each step,
    those were a sixth of σN-Ens's operators per training step (``benchmarks/op_count.py``), and
    eager σN-Ens on a GPU is launch-bound. An autograd Function traces under ``torch.compile``.
    """

    @staticmethod
    def forward(t: Tensor, k: float) -> Tensor:
        return t.view_as(t)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.k, None


def _grad_scaled(t: Tensor, k: float) -> Tensor:
    """``t`` in the forward pass (the same tensor values), ``k · ∂L/∂t`` in the backward pass
    (k = 1, or no gradient being recorded: ``t`` itself). No hook, so it traces under
    ``torch.compile``. Without gradients (evaluation) the Function is skipped: its Python call
    tripled the host time of a σNorm layer's eval forward (34.6 → 102 µs per call, measured),
    and on a GPU the eval forward is host-bound (docs/benchmarks.md)."""
    if k == 1.0 or not torch.is_grad_enabled():
        return t
    return _GradScale.apply(t, k)


class SigmaNorm(nn.Module):
    """Base class of the σNorm layers: per-member affine, optional sigmoid-bounded importance γ.

    Parameters (F = the feature shape: (C,) for BatchNorm/GroupNorm, ``normalized_shape`` for
    LayerNorm):
        weight: (M, *F) member-specific affine scale of ``norm_m``.
        bias: (M, *F) member-specific affine shift of ``norm_m``.
        gamma: (M, *F) importance logits, only for ``variant="sigma"`` (None for "film").

    Effective per-member affine: ``scale = c · weight · sigmoid(γ)``,
    ``shift = c · bias · sigmoid(γ)`` (σN-Ens, Suteu & Serban 2026; c = ``gate_gain``, 1 unless
    the gate is folded), or ``weight``/``bias`` alone (FiLM-Ensemble, Turkoglu et al. 2022).

    Args:
        feature_shape: F.
        num_members: M.
        variant: "sigma" (σN-Ens) or "film" (FiLM-Ensemble, no γ).
        gamma_init_mean, gamma_init_std: γ ~ N(mean, std²) independently per member and feature.
            Members need distinct γ: with equal γ the diversity regularizer's gradient is zero
            and shared weights give members identical updates.
        generator: Optional CPU generator for the γ initialisation.
        gate_gain: The constant c > 0 multiplying the gate (the harness's choice, σN-Ens's
            ``gate_fold: constant``: c = 1/sigmoid(γ0) for γ started around γ0, so the gate can
            start where the sigmoid is steep, γ0 = 0, without halving every feature). A fixed
            number, not a parameter: the member affine and its learning rate are the backbone's
            at init (``c·sigmoid(γ0) = 1``), and it is not saved (the hyper-parameters set it).
        device, dtype: Factory kwargs of the parameters.
    """

    gamma: nn.Parameter | None
    # Multiplier of the gradient reaching this layer's per-member parameters (weight, bias, γ).
    # The ensemble sets it to M when the task loss is the mean over members, so that member m's
    # own parameters, which only member m's loss reaches, get the gradient of that loss rather
    # than 1/M of it (see methods/_sigma/norm_ensemble.py). 1 = plain autograd.
    member_grad_scale: float = 1.0

    def __init__(
        self,
        feature_shape: tuple[int, ...],
        num_members: int,
        *,
        variant: str = "sigma",
        gamma_init_mean: float = 0.0,
        gamma_init_std: float = 1.0,
        generator: torch.Generator | None = None,
        gate_gain: float = 1.0,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if not gate_gain > 0:
            raise ValueError(f"gate_gain must be > 0, got {gate_gain}")
        self.gate_gain = float(gate_gain) if variant == "sigma" else 1.0
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
        """sigmoid(γ), (M, *F) (without ``gate_gain``); all ones for FiLM."""
        if self.gamma is None:
            return torch.ones_like(self.weight)
        return torch.sigmoid(self.gamma)

    def effective_affine(self) -> tuple[Tensor, Tensor]:
        """The affine actually applied after normalization (float32 for half/bf16 parameters).

        Returns:
            scale, shift: (M, *F) = c·weight·sigmoid(γ), c·bias·sigmoid(γ) (or weight, bias).
        """
        k = self.member_grad_scale
        w, b = _grad_scaled(_acc(self.weight), k), _grad_scaled(_acc(self.bias), k)  # (M, *F)
        if self.gamma is None:
            return w, b
        s = torch.sigmoid(_grad_scaled(_acc(self.gamma), k))  # (M, *F)
        if self.gate_gain != 1.0:
            s = s * self.gate_gain
        return w * s, b * s

    @torch.no_grad()
    def load_member_affine(
        self, weight: Tensor | None, bias: Tensor | None, preserve_outputs: bool = False
    ) -> None:
        """Copy one trained affine (shape F, or None = identity) into all M members.

        With ``preserve_outputs`` each member's copy is divided by its c·sigmoid(γ_m), so the
        effective affine ``c·sigmoid(γ_m)·(w/(c·sigmoid(γ_m)))`` equals ``w`` (up to float
        rounding).
        """
        w = torch.ones(self.feature_shape) if weight is None else weight.detach().float().cpu()
        b = torch.zeros(self.feature_shape) if bias is None else bias.detach().float().cpu()
        w = w.reshape(self.feature_shape).to(self.weight.device)  # (*F)
        b = b.reshape(self.feature_shape).to(self.weight.device)  # (*F)
        w_m = w.unsqueeze(0).expand_as(self.weight)  # (M, *F)
        b_m = b.unsqueeze(0).expand_as(self.bias)  # (M, *F)
        if preserve_outputs and self.gamma is not None:
            s = torch.sigmoid(self.gamma.float()) * self.gate_gain  # (M, *F)
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
        gain = f", gate_gain={self.gate_gain:.4g}" if self.gate_gain != 1.0 else ""
        return (
            f"{self.feature_shape}, num_members={self.num_members}, variant={self.variant!r}{gain}"
        )
