"""Per-member BatchNorm for σN-Ens / FiLM-Ensemble: member statistics, fused train kernel.

Member m's batch statistics are computed over its own slice of the member-major (M·B, C, ...)
batch only. In eval, running statistics, affine and sigmoid(γ) fold into one (M, C) scale and
shift. In training, three paths compute the same function:

- the reference (the specification; under ``torch.compile`` and ``kernels("reference")``): a
  custom autograd function computes the statistics with one float32 ``var_mean`` and saves only
  the input and (M, C) statistics, like cuDNN's BatchNorm, so eager peak memory matches the
  plain backbone's and it traces without graph breaks;
- the CPU path: PyTorch's own batch-norm kernel on each member's contiguous block of rows
  (:meth:`_SigmaBatchNorm._forward_native`), at the plain BatchNorm's cost;
- CUDA: the fused Triton kernels of ``methods/_triton``.

See ``methods/_sigma/norm.py`` for the layer family.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from methods._sigma.norm_base import SigmaNorm, _acc
from methods._triton import current_mode, use_kernels

__all__ = ["SigmaBatchNorm1d", "SigmaBatchNorm2d", "SigmaBatchNorm3d"]


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
        y (x's shape and dtype), and the non-differentiable float32 batch mean, biased variance
        and rsqrt(variance + eps), each (M, 1, C, 1, ..., 1): the backward reuses the forward's
        rsqrt (recomputing it was two more operators per layer and step).
    """

    @staticmethod
    def forward(x: Tensor, scale: Tensor, shift: Tensor, eps: float, dims: tuple[int, ...]):
        if x.dtype == torch.bfloat16:
            return _bf16_forward(x, scale, shift, eps, dims)
        x32 = _acc(x)  # (M, B, C, *S) float32 (no copy when x is float32 or float64)
        var, mean = torch.var_mean(x32, dim=dims, correction=0, keepdim=True)  # (M, 1, C, 1..)
        rstd = torch.rsqrt(var + eps)  # (M, 1, C, 1..)
        a = scale * rstd  # (M, 1, C, 1..)
        b = shift - mean * a  # (M, 1, C, 1..)
        y = torch.addcmul(b.to(x.dtype), x, a.to(x.dtype))  # (M, B, C, *S), x's strides
        return y, mean, var, rstd

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, scale, _shift, _eps, dims = inputs
        _y, mean, var, rstd = output
        ctx.save_for_backward(x, scale, mean, rstd)
        ctx.dims = dims
        ctx.mark_non_differentiable(mean, var, rstd)
        # the statistics' gradients are never used: no zero tensors materialised for them
        ctx.set_materialize_grads(False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: Tensor, _grad_mean: Tensor, _grad_var: Tensor, _grad_rstd):
        if grad_y is None:  # nothing reached y (the statistics' gradients are never used)
            return None, None, None, None, None
        x, scale, mean, rstd = ctx.saved_tensors
        dims = ctx.dims
        if x.dtype == torch.bfloat16:
            return (*_bf16_backward(ctx, grad_y, x, scale, mean, rstd, dims), None, None)
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
            neg_a = -a  # once for both coefficients (each operator is a launch on a GPU)
            c_x = neg_a * rstd * rstd * dot / n  # (M, 1, C, 1..) coefficient of (x - μ)
            c_0 = neg_a * sum_g / n  # (M, 1, C, 1..) constant term
            # dx = a·(g - mean(g) - x̂·mean(g·x̂)) = a·g + c_x·(x-μ) + c_0
            grad_x = torch.addcmul(torch.addcmul(c_0, xc, c_x), g, a).to(x.dtype)
        return grad_x, grad_scale, grad_shift, None, None


# bf16 activations (autocast): float32 statistics and reductions without float32 copies of the
# activation in the backward. The float32 path above makes 6 activation-sized float32
# temporaries per backward (the upcast input and gradient, x - μ, g·(x - μ), two multiply-adds);
# here the forward keeps its one transient upcast for exact statistics and the other
# activation-sized work stays in bf16, the precision the activation and its gradient are
# stored in anyway, and every sum accumulates in float32 (``sum(dtype=float32)``). Centring is
# exact up to bf16 rounding of the centred values: x is centred on the bf16-rounded mean μ_b
# and the constant offset μ_b - μ is corrected in float32 on the (M, C) statistics, so a large
# mean relative to the spread loses nothing to cancellation.


def _bf16_forward(
    x: Tensor, scale: Tensor, shift: Tensor, eps: float, dims: tuple[int, ...]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:class:`_MemberBatchNormTrain`'s forward for bf16 ``x`` (M, B, C, *S): y in bf16, the
    float32 mean, biased variance and rsqrt(variance + eps) (M, 1, C, 1..)."""
    # The statistics from a transient float32 copy, as the float32 path: they are exact for the
    # bf16 input and feed the running statistics evaluation uses (a bf16 square loses ~2^-9).
    var, mean = torch.var_mean(x.float(), dim=dims, correction=0, keepdim=True)  # (M, 1, C, 1..)
    mean_b = mean.to(x.dtype)
    offset = mean_b.float() - mean  # μ_b - μ: x - μ = (x - μ_b) + offset
    xc = x - mean_b  # (M, B, C, *S) bf16, centred on μ_b
    rstd = torch.rsqrt(var + eps)  # (M, 1, C, 1..)
    a = scale * rstd  # (M, 1, C, 1..)
    # y = a·(x - μ) + shift = a·(x - μ_b) + (shift + a·offset): from the centred values, so a
    # mean large against the spread does not cancel in bf16
    y = torch.addcmul((shift + a * offset).to(x.dtype), xc, a.to(x.dtype))  # (M, B, C, *S)
    return y, mean, var, rstd


def _bf16_backward(
    ctx: Any,
    grad_y: Tensor,
    x: Tensor,
    scale: Tensor,
    mean: Tensor,
    rstd: Tensor,
    dims: tuple[int, ...],
) -> tuple[Tensor | None, Tensor, Tensor]:
    """The closed-form gradient of :class:`_MemberBatchNormTrain` for bf16 ``x``/``grad_y``."""
    n = x.numel() // mean.numel()  # elements per (member, channel): B·prod(S)
    g = grad_y.to(x.dtype)  # (M, B, C, *S) bf16 (no copy under autocast)
    mean_b = mean.to(x.dtype)
    offset = mean_b.float() - mean  # μ_b - μ: x - μ = (x - μ_b) + offset
    xc = x - mean_b  # (M, B, C, *S) bf16
    sum_g = g.sum(dim=dims, keepdim=True, dtype=torch.float32)  # (M, 1, C, 1..)
    dot = (g * xc).sum(dim=dims, keepdim=True, dtype=torch.float32) + offset * sum_g  # Σ g(x-μ)
    grad_scale = dot * rstd  # (M, 1, C, 1..)  Σ g·x̂
    grad_x = None
    if ctx.needs_input_grad[0]:
        a = scale * rstd  # (M, 1, C, 1..)
        neg_a = -a
        c_x = neg_a * rstd * rstd * dot / n  # coefficient of (x - μ)
        c_0 = neg_a * sum_g / n + c_x * offset  # constant term, with x - μ = xc + offset
        # dx = a·g + c_x·(x - μ_b) + c_0, in bf16 (the gradient's dtype)
        lo = x.dtype
        grad_x = torch.addcmul(torch.addcmul(c_0.to(lo), xc, c_x.to(lo)), g, a.to(lo))
    return grad_x, grad_scale, sum_g


def _native_path(x: Tensor, scale: Tensor, running_mean: Tensor | None) -> bool:
    """Whether a training forward runs :meth:`_SigmaBatchNorm._forward_native`: on the CPU,
    outside ``torch.compile`` (Inductor fuses the reference path itself) and the ``reference``
    kernel mode (tests and the benchmark time the specification with it), when input, affine
    and running statistics share one dtype (``F.batch_norm`` on the CPU needs it)."""
    if x.device.type != "cpu" or current_mode() == "reference":
        return False
    if torch.compiler.is_compiling():
        return False
    return x.dtype == scale.dtype and (running_mean is None or running_mean.dtype == x.dtype)


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
        if use_kernels(x):  # CUDA: the fused Triton kernels (methods/_triton)
            return self._forward_kernels(x, b * math.prod(spatial))
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
        if _native_path(x, scale, self.running_mean):
            return self._forward_native(x, scale, shift)
        dims = (1, *range(3, 3 + len(spatial)))
        y, mean, var, _ = _MemberBatchNormTrain.apply(
            xs, scale.view(bshape), shift.view(bshape), self.eps, dims
        )  # (M, B, C, *S), then (M, 1, C, 1..) each
        if self.training and self.track_running_stats:
            self._update_running_stats(mean.view(m, c), var.view(m, c), n)
        return y.view(x.shape)  # (M·B, C, *S)

    def _forward_native(self, x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """Batch statistics through PyTorch's own batch-norm kernel, one call per member.

        Member m's rows are the contiguous block ``x[m·B:(m+1)·B]`` (member-major layout), so
        ``F.batch_norm`` on each block computes exactly member m's statistics, normalisation,
        gated affine (``scale``/``shift`` (M, C), already × sigmoid(γ)) and running-statistics
        update (unbiased variance, as ``nn.BatchNorm``), with the vectorised kernels the plain
        backbone uses. The blocks are views; one concatenation builds the output, and its
        backward splits the gradient into views again. Why not the reference's ``var_mean``
        over the (M, B, C, *S) view: that reduction over strided member dimensions and the
        elementwise chain after it cost 3-7× a plain BatchNorm on the CPU; putting members into
        channels (one transposed copy each way) cost 1.2-2.9×, this 1.0-1.3× (one thread,
        fmnist_cnn and ResNet-18 layer shapes, forward + backward; docs/benchmarks.md).

        Args: x (M·B, C, *S) float32/float64 on the CPU. Returns: (M·B, C, *S).
        """
        m = self.num_members
        track = self.track_running_stats
        factor = 0.0
        if self.training and track:
            self.num_batches_tracked.add_(1)  # (M,), all members in lockstep
            if self.momentum is None:  # cumulative moving average, as nn.BatchNorm
                factor = 1.0 / float(self.num_batches_tracked[0])  # a CPU tensor: no sync
            else:
                factor = float(self.momentum)
        rm = self.running_mean.unbind(0) if track else [None] * m  # M × (C,) views
        rv = self.running_var.unbind(0) if track else [None] * m  # M × (C,) views
        xs = x.view(m, -1, *x.shape[1:]).unbind(0)  # M × (B, C, *S) contiguous blocks
        ys = [
            F.batch_norm(xm, rm[i], rv[i], sc, sh, True, factor, self.eps)
            for i, (xm, sc, sh) in enumerate(zip(xs, scale.unbind(0), shift.unbind(0)))
        ]  # M × (B, C, *S)
        return ys[0] if m == 1 else torch.cat(ys)  # (M·B, C, *S)

    def _forward_kernels(self, x: Tensor, n: int) -> Tensor:
        """The same function through methods._triton.sigma_bn: two launches per training
        forward and backward, one in evaluation. x (M·B, C, *S) → (M·B, C, *S)."""
        from methods._triton import sigma_bn

        gamma = self.gamma
        if not (self.training or not self.track_running_stats):
            return sigma_bn.eval_forward(
                x, self.weight, self.bias, gamma, self.running_mean, self.running_var,
                self.num_members, self.eps, self.gate_gain,
            )  # fmt: skip
        if n <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel per member when training, got input "
                f"of shape {tuple(x.shape)} with num_members={self.num_members}"
            )
        update = self.training and self.track_running_stats
        cfg = (self.num_members, self.eps, self.momentum, self.gate_gain, self.member_grad_scale)
        return sigma_bn.MemberBatchNorm.apply(
            x, self.weight, self.bias, gamma,
            self.running_mean if update else None, self.running_var if update else None,
            self.num_batches_tracked if update else None, cfg,
        )  # fmt: skip

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
