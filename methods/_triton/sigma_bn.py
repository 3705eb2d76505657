"""Per-member BatchNorm with the σN-Ens gate (or FiLM's affine), fused in Triton.

Computes exactly what ``methods._sigma.batchnorm._SigmaBatchNorm`` computes (that PyTorch code is
the specification), for an input (M·B, C, *S) stored member-major, NCHW-contiguous or
channels_last (any layout whose spatial dimensions flatten to one stride):

    μ_{m,c}, σ²_{m,c}  biased statistics over member m's B·prod(S) values of channel c
    s_{m,c} = gain·sigmoid(γ_{m,c})  (σN-Ens; 1 for FiLM)
    y = (x − μ)·rsqrt(σ² + eps)·w·s + b·s

Launches per layer: training forward 2 (partial statistics; combine + normalise + gated affine
+ running-statistics update), backward 2 (partial Σg and Σg·(x−μ); combine + dx + the gradients
of w, b and γ), evaluation 1 (running statistics + gated affine folded per program). Every sum
accumulates in float32 whatever the activations' dtype (bf16 in, bf16 out); the statistics are
combined exactly with Chan et al.'s pairwise update (per tile: mean and Σ(x − tile mean)², then
merged), so a mean large against the spread does not cancel as E[x²] − E[x]² would.

The backward is the closed form of BatchNorm's gradient (as the reference):
    x̂ = (x − μ)·rstd,  a = w·s·rstd,  Σg, Σg·(x − μ) per (member, channel), n = B·prod(S)
    dx = a·g − a·rstd²·Σg(x−μ)/n·(x − μ) − a·Σg/n
    dw = k·s·rstd·Σg(x−μ),  db = k·s·Σg,  dγ = k·gain·(w·rstd·Σg(x−μ) + b·Σg)·σ(γ)(1 − σ(γ))
with k the layer's ``member_grad_scale``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Elements of one (rows × channels) tile a program loads at a time.
_TILE = 4096
#: Rows of a tile at most: a narrow channel block (C < 16: an odd first layer) would otherwise
#: get a tall tile (512-1024 rows) whose backward spilled registers on sm_80 and sm_90
#: (benchmarks/triton_aot.py: 8-16 bytes per thread at C = 3 and 7; 96 registers, no spill, at
#: 256 rows).
_MAX_TILE_ROWS = 256
#: Programs a reduction aims for: a few per streaming multiprocessor of a large GPU (132 on an
#: H100/H200), so that the partial sums fill the device.
_TARGET_PROGRAMS = 512
#: Partial results combined per step of the combining loop (a power of two).
_BLOCK_K = 32


# -------------------------------------------------------------------------------------- kernels


@triton.jit
def _row_offsets(rows, pid_m, B, S, stride_n, stride_s):
    """Offsets of rows r = b·S + s of member pid_m: ((m·B + b)·stride_n + s·stride_s)."""
    b = rows // S
    s = rows - b * S
    return (pid_m * B + b).to(tl.int64) * stride_n + s.to(tl.int64) * stride_s


@triton.jit
def _program(C, R, rows_per_split, BLOCK_C: tl.constexpr):
    """This program's member, channel block and row range: (pid_m, pid_k, cols, cmask, start,
    end) — rows [start, end) of member pid_m, channels ``cols`` (``cmask``: those < C)."""
    pid_m, pid_c, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    start = pid_k * rows_per_split
    return pid_m, pid_k, cols, cols < C, start, tl.minimum(start + rows_per_split, R)


@triton.jit
def _tile(r0, end, cols, cmask, pid_m, B, S, stride_n, stride_c, stride_s, BLOCK_R: tl.constexpr):
    """Offsets and mask of the (BLOCK_R rows × channels ``cols``) tile starting at row r0."""
    rows = r0 + tl.arange(0, BLOCK_R)
    mask = (rows < end)[:, None] & cmask[None, :]
    offs = (
        _row_offsets(rows, pid_m, B, S, stride_n, stride_s)[:, None]
        + (cols.to(tl.int64) * stride_c)[None, :]
    )
    return offs, mask


@triton.jit
def _gate(W, BIAS, GAM, off, cmask, gain, HAS_GAMMA: tl.constexpr):
    """The effective (scale, shift) of channels ``off`` and the gate s (ones for FiLM)."""
    w = tl.load(W + off, mask=cmask, other=1.0).to(tl.float32)
    bb = tl.load(BIAS + off, mask=cmask, other=0.0).to(tl.float32)
    if HAS_GAMMA:
        sg = tl.sigmoid(tl.load(GAM + off, mask=cmask, other=0.0).to(tl.float32))
        gate = gain * sg
    else:
        sg = tl.full(w.shape, 1.0, tl.float32)
        gate = sg
    return w * gate, bb * gate, w, bb, sg


@triton.jit
def _stats_partial(
    X, PMEAN, PM2, R, S, C, B, NSPLIT, stride_n, stride_c, stride_s, rows_per_split,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Mean and Σ(x − mean)² of rows [k·rows_per_split, (k+1)·rows_per_split) per channel."""
    pid_m, pid_k, cols, cmask, start, end = _program(C, R, rows_per_split, BLOCK_C)
    mean = tl.zeros([BLOCK_C], tl.float32)
    m2 = tl.zeros([BLOCK_C], tl.float32)
    for r0 in range(start, end, BLOCK_R):
        offs, mask = _tile(r0, end, cols, cmask, pid_m, B, S, stride_n, stride_c, stride_s,
                           BLOCK_R)  # fmt: skip
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        n_old = (r0 - start).to(tl.float32)
        cnt = tl.minimum(end - r0, BLOCK_R).to(tl.float32)
        t_mean = tl.sum(x, axis=0) / cnt
        d = tl.where(mask, x - t_mean[None, :], 0.0)
        t_m2 = tl.sum(d * d, axis=0)
        n_new = n_old + cnt
        delta = t_mean - mean
        mean = mean + delta * (cnt / n_new)
        m2 = m2 + t_m2 + delta * delta * (n_old * cnt / n_new)
    out = (pid_m * NSPLIT + pid_k) * C + cols
    tl.store(PMEAN + out, mean, mask=cmask)
    tl.store(PM2 + out, m2, mask=cmask)


@triton.jit
def _combine_stats(PMEAN, PM2, pid_m, cols, cmask, R, C, NSPLIT, rows_per_split,
                   BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    """The member's mean and biased variance per channel from its NSPLIT partial results."""
    acc = tl.zeros([BLOCK_C], tl.float32)
    for k0 in range(0, NSPLIT, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < NSPLIT
        nk = tl.where(kmask, tl.minimum(rows_per_split, R - ks * rows_per_split), 0)
        offs = (pid_m * NSPLIT + ks)[:, None] * C + cols[None, :]
        mask = kmask[:, None] & cmask[None, :]
        pm = tl.load(PMEAN + offs, mask=mask, other=0.0)
        acc += tl.sum(pm * nk.to(tl.float32)[:, None], axis=0)
    mean = acc / R
    m2 = tl.zeros([BLOCK_C], tl.float32)
    for k0 in range(0, NSPLIT, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < NSPLIT
        nk = tl.where(kmask, tl.minimum(rows_per_split, R - ks * rows_per_split), 0)
        offs = (pid_m * NSPLIT + ks)[:, None] * C + cols[None, :]
        mask = kmask[:, None] & cmask[None, :]
        pm = tl.load(PMEAN + offs, mask=mask, other=0.0)
        pm2 = tl.load(PM2 + offs, mask=mask, other=0.0)
        d = pm - mean[None, :]
        m2 += tl.sum(pm2 + nk.to(tl.float32)[:, None] * d * d, axis=0)
    return mean, m2 / R


@triton.jit
def _forward_apply(
    X, Y, PMEAN, PM2, W, BIAS, GAM, MEAN, VAR, RSTD, RM, RV, NBT,
    R, S, C, B, NSPLIT, stride_n, stride_c, stride_s, rows_per_split,
    eps, gain, momentum, unbias,
    HAS_GAMMA: tl.constexpr, UPDATE: tl.constexpr, CMA: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Combine the statistics, normalise and gate this program's rows; the first program of a
    (member, channel block) also writes the statistics and updates the running ones."""
    pid_m, pid_k, cols, cmask, start, end = _program(C, R, rows_per_split, BLOCK_C)
    mean, var = _combine_stats(PMEAN, PM2, pid_m, cols, cmask, R, C, NSPLIT, rows_per_split,
                               BLOCK_K, BLOCK_C)  # fmt: skip
    rstd = 1.0 / tl.sqrt(var + eps)
    poff = pid_m * C + cols
    scale, shift, _w, _b, _s = _gate(W, BIAS, GAM, poff, cmask, gain, HAS_GAMMA)
    a = scale * rstd
    for r0 in range(start, end, BLOCK_R):
        offs, mask = _tile(r0, end, cols, cmask, pid_m, B, S, stride_n, stride_c, stride_s,
                           BLOCK_R)  # fmt: skip
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean[None, :]) * a[None, :] + shift[None, :]
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
    if pid_k == 0:
        tl.store(MEAN + poff, mean, mask=cmask)
        tl.store(VAR + poff, var, mask=cmask)
        tl.store(RSTD + poff, rstd, mask=cmask)
        if UPDATE:
            if CMA:  # momentum None: the cumulative average, 1/batches (counted by the caller)
                factor = 1.0 / tl.load(NBT + pid_m).to(tl.float32)
            else:  # the one program that counts this member's batch; nobody else reads it
                factor = momentum
                if tl.program_id(1) == 0:  # the first channel block
                    tl.store(NBT + pid_m, tl.load(NBT + pid_m) + 1)
            rm = tl.load(RM + poff, mask=cmask, other=0.0)
            rv = tl.load(RV + poff, mask=cmask, other=1.0)
            tl.store(RM + poff, rm + factor * (mean - rm), mask=cmask)
            tl.store(RV + poff, rv + factor * (var * unbias - rv), mask=cmask)


@triton.jit
def _backward_partial(
    X, G, MEAN, PSG, PDOT, R, S, C, B, NSPLIT, stride_n, stride_c, stride_s, rows_per_split,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Σg and Σg·(x − μ) over this program's rows, per channel (float32)."""
    pid_m, pid_k, cols, cmask, start, end = _program(C, R, rows_per_split, BLOCK_C)
    mean = tl.load(MEAN + pid_m * C + cols, mask=cmask, other=0.0)
    sg = tl.zeros([BLOCK_C], tl.float32)
    dot = tl.zeros([BLOCK_C], tl.float32)
    for r0 in range(start, end, BLOCK_R):
        offs, mask = _tile(r0, end, cols, cmask, pid_m, B, S, stride_n, stride_c, stride_s,
                           BLOCK_R)  # fmt: skip
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        sg += tl.sum(g, axis=0)
        dot += tl.sum(tl.where(mask, g * (x - mean[None, :]), 0.0), axis=0)
    out = (pid_m * NSPLIT + pid_k) * C + cols
    tl.store(PSG + out, sg, mask=cmask)
    tl.store(PDOT + out, dot, mask=cmask)


@triton.jit
def _backward_apply(
    X, G, DX, PSG, PDOT, MEAN, RSTD, W, BIAS, GAM, DW, DB, DGAM,
    R, S, C, B, NSPLIT, stride_n, stride_c, stride_s, rows_per_split, gain, k,
    HAS_GAMMA: tl.constexpr, NEEDS_DX: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Combine Σg and Σg·(x − μ); dx for this program's rows; the first program of a (member,
    channel block) writes the gradients of w, b and γ."""
    pid_m, pid_k, cols, cmask, start, end = _program(C, R, rows_per_split, BLOCK_C)
    sum_g = tl.zeros([BLOCK_C], tl.float32)
    dot = tl.zeros([BLOCK_C], tl.float32)
    for k0 in range(0, NSPLIT, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        offs = (pid_m * NSPLIT + ks)[:, None] * C + cols[None, :]
        mask = (ks < NSPLIT)[:, None] & cmask[None, :]
        sum_g += tl.sum(tl.load(PSG + offs, mask=mask, other=0.0), axis=0)
        dot += tl.sum(tl.load(PDOT + offs, mask=mask, other=0.0), axis=0)
    poff = pid_m * C + cols
    mean = tl.load(MEAN + poff, mask=cmask, other=0.0)
    rstd = tl.load(RSTD + poff, mask=cmask, other=0.0)
    scale, _shift, w, bb, sgm = _gate(W, BIAS, GAM, poff, cmask, gain, HAS_GAMMA)
    if NEEDS_DX:
        a = scale * rstd
        c_x = -a * rstd * rstd * dot / R  # coefficient of (x − μ)
        c_0 = -a * sum_g / R  # constant term
        for r0 in range(start, end, BLOCK_R):
            offs, mask = _tile(r0, end, cols, cmask, pid_m, B, S, stride_n, stride_c, stride_s,
                               BLOCK_R)  # fmt: skip
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
            dx = a[None, :] * g + c_x[None, :] * (x - mean[None, :]) + c_0[None, :]
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    if pid_k == 0:
        grad_scale = dot * rstd  # Σ g·x̂
        if HAS_GAMMA:
            gate = gain * sgm
            tl.store(DW + poff, k * grad_scale * gate, mask=cmask)
            tl.store(DB + poff, k * sum_g * gate, mask=cmask)
            dg = k * gain * (w * grad_scale + bb * sum_g) * sgm * (1.0 - sgm)
            tl.store(DGAM + poff, dg, mask=cmask)
        else:
            tl.store(DW + poff, k * grad_scale, mask=cmask)
            tl.store(DB + poff, k * sum_g, mask=cmask)


@triton.jit
def _eval_apply(
    X, Y, W, BIAS, GAM, RM, RV, R, S, C, B, stride_n, stride_c, stride_s, rows_per_split,
    eps, gain, HAS_GAMMA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """y = (x − running mean)·rsqrt(running var + eps)·scale + shift, folded per program."""
    pid_m, _pid_k, cols, cmask, start, end = _program(C, R, rows_per_split, BLOCK_C)
    poff = pid_m * C + cols
    scale, shift, _w, _b, _s = _gate(W, BIAS, GAM, poff, cmask, gain, HAS_GAMMA)
    rm = tl.load(RM + poff, mask=cmask, other=0.0).to(tl.float32)
    rv = tl.load(RV + poff, mask=cmask, other=1.0).to(tl.float32)
    a = scale / tl.sqrt(rv + eps)
    for r0 in range(start, end, BLOCK_R):
        offs, mask = _tile(r0, end, cols, cmask, pid_m, B, S, stride_n, stride_c, stride_s,
                           BLOCK_R)  # fmt: skip
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - rm[None, :]) * a[None, :] + shift[None, :]
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


#: The module's kernels by name: instruments replace them to count or stub their launches
#: (benchmarks/op_count.py, benchmarks/sigma_host_cost.py).
KERNEL_NAMES = ("_stats_partial", "_forward_apply", "_backward_partial", "_backward_apply",
                "_eval_apply")  # fmt: skip


# ------------------------------------------------------------------------------ launch geometry


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ in Python integers: ``triton.cdiv`` is a constexpr-function wrapper that cost
    microseconds a call in the launch path (the launcher is host-bound at CIFAR sizes)."""
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (``triton.next_power_of_2`` without its wrapper)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


class _Geometry:
    """How a (M·B, C, *S) tensor is walked: strides, tile and split sizes, grid.

    :meth:`of` returns the one geometry of a (shape, strides, M), computed once: a training step
    asks for it four times per layer (forward, backward) with the same input.
    """

    _cache: dict[tuple, _Geometry] = {}  # noqa: RUF012 (a class-wide cache, on purpose)

    @classmethod
    def of(cls, x: Tensor, num_members: int) -> _Geometry:
        key = (tuple(x.shape), x.stride(), num_members)
        geo = cls._cache.get(key)
        if geo is None:
            # Never evicted: a captured CUDA graph keeps using a geometry's scratch buffers
            # (:meth:`partials`), whose memory must outlive it; the shapes are few (one per
            # layer and batch size).
            geo = cls._cache[key] = cls(x, num_members)
        return geo

    def __init__(self, x: Tensor, num_members: int) -> None:
        self.M = num_members
        self.B = x.shape[0] // num_members
        self.C = x.shape[1]
        spatial = tuple(x.shape[2:])
        self.S = math.prod(spatial)
        self.R = self.B * self.S  # values per (member, channel)
        self.stride_n, self.stride_c = x.stride(0), x.stride(1)
        self.stride_s = x.stride(-1) if spatial else 1
        c_fast = self.stride_c == 1 and self.C > 1  # channels_last: channels are contiguous
        self.block_c = min(64 if c_fast else 16, _next_power_of_2(self.C))
        self.block_r = max(16, min(_MAX_TILE_ROWS, _TILE // self.block_c))
        c_blocks = _cdiv(self.C, self.block_c)
        want = max(1, _TARGET_PROGRAMS // (self.M * c_blocks))
        per = _cdiv(self.R, want)
        self.rows_per_split = _cdiv(per, self.block_r) * self.block_r
        self.nsplit = _cdiv(self.R, self.rows_per_split)
        self.grid = (self.M, c_blocks, self.nsplit)
        self.walk_args = (self.R, self.S, self.C, self.B, self.nsplit, self.stride_n,
                          self.stride_c, self.stride_s, self.rows_per_split)  # fmt: skip
        self._partials: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def args(self) -> tuple[int, ...]:
        return self.walk_args

    def partials(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """Two (M, nsplit, C) float32 scratch buffers for a reduction's partial results, made
        once per geometry and device and reused by every call: each call overwrites them before
        it reads them, and calls on one device run in stream order (two layers of one shape
        share them, one after the other). An allocation and a split less per call, forward and
        backward: the launcher is host-bound at CIFAR sizes."""
        bufs = self._partials.get(device)
        if bufs is None:
            bufs = torch.empty(2, self.M, self.nsplit, self.C, dtype=torch.float32,
                               device=device).unbind(0)  # fmt: skip
            self._partials[device] = bufs
        return bufs


def walkable(x: Tensor) -> Tensor:
    """``x`` itself when its spatial dimensions flatten to one stride (NCHW-contiguous and
    channels_last do), else a contiguous copy."""
    shape, strides = x.shape[2:], x.stride()[2:]
    for i in range(len(shape) - 1):
        if shape[i] > 1 and strides[i] != strides[i + 1] * shape[i + 1]:
            return x.contiguous()
    return x


def _like(t: Tensor, x: Tensor) -> Tensor:
    """``t`` with ``x``'s strides (a copy only when they differ: gradients usually match)."""
    if t.stride() == x.stride():
        return t
    out = torch.empty_strided(x.shape, x.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t)


# ------------------------------------------------------------------------------------ autograd


class MemberBatchNorm(torch.autograd.Function):
    """Training σBatchNorm through the kernels: y, and the running statistics updated in place.

    Inputs:
        x: (M·B, C, *S) member-major, any float dtype (see :func:`walkable` for layouts).
        weight, bias: (M, C) member affine; gamma: (M, C) gate logits or None (FiLM).
        running_mean, running_var: (M, C) float32 or None (no tracking); num_batches_tracked:
            (M,) long or None.
        cfg: (M, eps, momentum, gain, k): momentum as ``nn.BatchNorm``'s (None: the
            cumulative average), the gate gain and the member gradient scale. The running
            statistics are updated when ``running_mean`` is given.

    Output: y, x's shape, dtype and strides.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        gamma: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        num_batches_tracked: Tensor | None,
        cfg: tuple,
    ) -> Tensor:
        m, eps, momentum, gain, k = cfg
        x = walkable(x)
        geo = _Geometry.of(x, m)
        f32 = {"dtype": torch.float32, "device": x.device}
        p_mean, p_m2 = geo.partials(x.device)  # partial mean, M2 (scratch, reused)
        # One allocation for the statistics and the backward's parameter gradients, split by one
        # unbind (indexing [0], [1], ... is an operator each): the backward then allocates only
        # dx. Two operators per layer and step less on a launch-bound GPU step.
        mean, var, rstd, dw, db, dg = torch.empty(6, m, geo.C, **f32).unbind(0)
        y = torch.empty_like(x)
        _stats_partial[geo.grid](
            x, p_mean, p_m2, *geo.walk_args, BLOCK_R=geo.block_r, BLOCK_C=geo.block_c
        )
        update = running_mean is not None
        cma = update and momentum is None
        if cma:  # the count first: the kernel divides by it (one launch, this rare mode only)
            num_batches_tracked.add_(1)
        n = geo.R
        _forward_apply[geo.grid](
            x, y, p_mean, p_m2, weight, bias, gamma if gamma is not None else weight,
            mean, var, rstd,
            running_mean if update else mean, running_var if update else var,
            num_batches_tracked if update else mean,
            *geo.walk_args, eps, gain, float(momentum or 0.0), n / max(n - 1, 1),
            HAS_GAMMA=gamma is not None, UPDATE=update, CMA=cma,
            BLOCK_R=geo.block_r, BLOCK_C=geo.block_c, BLOCK_K=_BLOCK_K,
        )  # fmt: skip
        ctx.save_for_backward(x, weight, bias, gamma, mean, rstd, dw, db, dg)
        ctx.cfg = (m, gain, k)
        ctx.grads_handed_out = False
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple:
        x, weight, bias, gamma, mean, rstd, dw, db, dg = ctx.saved_tensors
        m, gain, k = ctx.cfg
        g = _like(grad_y, x)
        geo = _Geometry.of(x, m)
        p_g, p_gx = geo.partials(x.device)  # partial Σg, Σg·(x − μ) (scratch, reused)
        if ctx.grads_handed_out:  # a second backward through a retained graph: the first's
            # gradients may still be held (autograd.grad's results, a .grad), so not overwritten
            f32 = {"dtype": torch.float32, "device": x.device}
            dw, db, dg = torch.empty(3, m, geo.C, **f32).unbind(0)
        ctx.grads_handed_out = True
        needs_dx = ctx.needs_input_grad[0]
        dx = torch.empty_like(x) if needs_dx else None
        _backward_partial[geo.grid](
            x, g, mean, p_g, p_gx, *geo.walk_args, BLOCK_R=geo.block_r, BLOCK_C=geo.block_c
        )
        has_gamma = gamma is not None
        _backward_apply[geo.grid](
            x, g, dx if needs_dx else x, p_g, p_gx, mean, rstd, weight, bias,
            gamma if has_gamma else weight, dw, db, dg,
            *geo.walk_args, gain, k,
            HAS_GAMMA=has_gamma, NEEDS_DX=needs_dx,
            BLOCK_R=geo.block_r, BLOCK_C=geo.block_c, BLOCK_K=_BLOCK_K,
        )  # fmt: skip
        # float32 parameters (the harness's, under autocast too): the gradients as they are
        dw = dw if dw.dtype == weight.dtype else dw.to(weight.dtype)
        db = db if db.dtype == bias.dtype else db.to(bias.dtype)
        dg = (dg if dg.dtype == gamma.dtype else dg.to(gamma.dtype)) if has_gamma else None
        return dx, dw, db, dg, None, None, None, None


def eval_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    gamma: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    num_members: int,
    eps: float,
    gain: float,
) -> Tensor:
    """Evaluation σBatchNorm in one launch: x (M·B, C, *S) → y, same dtype and strides."""
    x = walkable(x)
    geo = _Geometry.of(x, num_members)
    y = torch.empty_like(x)
    _eval_apply[geo.grid](
        x, y, weight, bias, gamma if gamma is not None else weight, running_mean, running_var,
        geo.R, geo.S, geo.C, geo.B, geo.stride_n, geo.stride_c, geo.stride_s,
        geo.rows_per_split, eps, gain,
        HAS_GAMMA=gamma is not None, BLOCK_R=geo.block_r, BLOCK_C=geo.block_c,
    )  # fmt: skip
    return y
