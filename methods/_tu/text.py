"""Packed-Ensembles and BatchEnsemble variants of ``text_transformer`` from torch-uncertainty's
layers (the library has builders only for CNNs, ResNets and WideResNets).

The same network as :class:`harness.backbones.text.TextTransformer` (token + position
embeddings, pre-LN blocks, final LayerNorm, masked mean or first-token pooling, linear head),
with each method's layers:

- **BatchEnsemble** (Wen et al., ICLR 2020): every linear layer (attention in/out projections,
  MLP, head) is a rank-1 ``BatchLinear``; embeddings and LayerNorms are shared (LayerNorm
  statistics are per token, so sharing them couples no members). torch-uncertainty's
  ``BatchLinear`` broadcasts its fast weights over (M·B, C) inputs only; :class:`SeqBatchLinear`
  applies them to (M·B, L, C) token sequences.
- **Packed-Ensembles** (Laurent et al., ICLR 2023): a network α times wider whose linear layers
  are ``PackedLinear`` (M·γ groups), embeddings α·D wide (member m owns the m-th block of
  columns), attention per member (each member's H heads attend over its own block of
  features), and a LayerNorm per member (:class:`MemberLayerNorm`: a GroupNorm with one group
  per member). torch-uncertainty's ``PackedLayerNorm`` is not used: outside a first layer it is
  a GroupNorm with a single group over all members' channels, so it mixes the members.

Both return member-major logits (M·B, K), as the library's models do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.backbones.text import POOLINGS, TextTransformer
from harness.data._machinery.text import WORD_VOCAB_SIZE
from methods._base import BuildContext


def _seq_batch_linear() -> type:
    from torch_uncertainty.layers import BatchLinear

    class SeqBatchLinear(BatchLinear):
        """``BatchLinear`` on (M·B, ..., C) inputs: member m's rows ``m·B .. (m+1)·B - 1`` are
        scaled by its fast weights r_m (input) and s_m (output) and shifted by its bias."""

        def forward(self, inputs: Tensor) -> Tensor:
            m = self.num_estimators
            if inputs.shape[0] % m:
                raise ValueError(f"a batch of {inputs.shape[0]} rows is not M={m} member blocks")
            b, mid = inputs.shape[0] // m, inputs.shape[1:-1]
            shape = (m, 1, *([1] * len(mid)), -1)  # (M, 1, 1.., C): broadcast over B and L
            x = inputs.view(m, b, *mid, inputs.shape[-1])  # (M, B, ..., C_in)
            out = self.linear(x * self.r_group.view(shape)) * self.s_group.view(shape)
            if self.bias is not None:
                out = out + self.bias.view(shape)
            return out.reshape(m * b, *mid, out.shape[-1])  # (M·B, ..., C_out)

    return SeqBatchLinear


def batched_text_transformer(ctx: BuildContext, split: bool) -> nn.Module:
    """``text_transformer`` with rank-1 linear layers, wrapped in torch-uncertainty's
    ``BatchEnsemble`` (repeats the batch M times in eval, and in training unless ``split``)."""
    from torch_uncertainty.methods import BatchEnsemble

    layer = _seq_batch_linear()
    m = ctx.num_members
    core = TextTransformer(
        ctx.in_shape[0],
        ctx.num_classes,
        linear=lambda fi, fo: layer(fi, fo, num_estimators=m),
        **ctx.backbone_kwargs,
    )
    return BatchEnsemble(core, num_estimators=m, repeat_training_inputs=not split)


class MemberLayerNorm(nn.GroupNorm):
    """LayerNorm of each member's block of features: a GroupNorm with one group per member,
    applied over the last dimension of (..., M·C) inputs (per-member affine included)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.reshape(-1, x.shape[-1])).view(x.shape)  # (..., M·C)


class PackedBlock(nn.Module):
    """Pre-LN encoder block of M packed members (each α·D/M wide, H heads)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float, packed: Any) -> None:
        super().__init__()
        self.m, self.heads, self.gamma = packed.m, heads, packed.gamma
        width = packed.width(dim)
        self.norm1 = MemberLayerNorm(self.m, width)
        self.qkv = packed.linear(dim, 3 * dim)
        self.proj = packed.linear(dim, dim)
        self.drop1 = nn.Dropout(dropout)
        self.norm2 = MemberLayerNorm(self.m, width)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            packed.linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), packed.linear(hidden, dim)
        )
        self.drop2 = nn.Dropout(dropout)

    def qkv_heads(self, x: Tensor) -> Tensor:
        """Args: x (B, L, W) with W = M·C. Returns: q, k, v stacked, (3, B, M·H, L, d)."""
        b, n, w = x.shape
        m, h, g = self.m, self.heads, self.gamma
        # The fused projection has M·γ groups; each group's output block holds its own q, k, v
        # (torch-uncertainty's PackedMultiheadAttention: in_proj_weight (groups, 3·E/groups,
        # in/groups)), so member m's q, k and v each span all γ groups, i.e. all its features.
        qkv = self.qkv(self.norm1(x)).view(b, n, m, g, 3, w // (m * g))  # (B, L, M, γ, 3, c/γ)
        qkv = qkv.permute(4, 0, 2, 1, 3, 5).reshape(3, b, m, n, h, w // (m * h))  # member c
        return qkv.transpose(3, 4).reshape(3, b, m * h, n, -1)  # (3, B, M·H, L, d)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        """Args: x (B, L, W) with W = M·C; keep (B, 1, 1, L) bool (real tokens)."""
        b, n, w = x.shape
        m, h = self.m, self.heads
        q, k, v = self.qkv_heads(x)  # each (B, M·H, L, d)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, M·H, L, d)
        att = att.view(b, m, h, n, -1).permute(0, 3, 1, 2, 4).reshape(b, n, w)  # (B, L, W)
        x = x + self.drop1(self.proj(att))
        return x + self.drop2(self.mlp(self.norm2(x)))


class _Packing:
    """The PackedLinear factory of one network (α, γ, M) and its widths."""

    def __init__(self, m: int, alpha: float, gamma: int) -> None:
        self.m, self.alpha, self.gamma = m, alpha, gamma

    def width(self, features: int) -> int:
        return int(features * self.alpha)

    def linear(self, fi: int, fo: int, last: bool = False) -> nn.Module:
        """A PackedLinear; the head (``last``) has one group per member, as the library's
        packed ResNets' head (γ splits hidden layers only)."""
        from torch_uncertainty.layers import PackedLinear

        gamma = 1 if last else self.gamma
        return PackedLinear(fi, fo, alpha=self.alpha, num_estimators=self.m, gamma=gamma, last=last)


class PackedTextTransformer(nn.Module):
    """``text_transformer`` as M packed members (see the module docstring).

    Raises:
        ValueError: widths that do not split into M members of ``heads`` heads (α·D must be a
            multiple of M·heads and of M·γ), as the library's layers raise for channels.
    """

    def __init__(
        self,
        seq_len: int,
        num_classes: int,
        num_members: int,
        alpha: float,
        gamma: int,
        vocab_size: int = WORD_VOCAB_SIZE,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout_rate: float = 0.0,
        pooling: str = "mean",
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        packed = _Packing(num_members, alpha, gamma)
        width = packed.width(dim)
        if width % (num_members * heads) or width % (num_members * gamma):
            raise ValueError(
                f"packed width α·dim = {width} does not split into M={num_members} members of "
                f"{heads} heads and γ={gamma} groups"
            )
        self.m, self.pad_id, self.pooling = num_members, pad_id, pooling
        self.tokens = nn.Embedding(vocab_size, width)  # member m: columns of block m
        self.positions = nn.Parameter(torch.zeros(1, seq_len, width))
        self.drop = nn.Dropout(dropout_rate)
        self.blocks = nn.ModuleList(
            PackedBlock(dim, heads, mlp_ratio, dropout_rate, packed) for _ in range(depth)
        )
        self.norm = MemberLayerNorm(num_members, width)
        self.head_drop = nn.Dropout(dropout_rate)
        self.head = packed.linear(dim, num_classes, last=True)
        nn.init.trunc_normal_(self.tokens.weight, std=0.02, a=-0.04, b=0.04)
        nn.init.trunc_normal_(self.positions, std=0.02, a=-0.04, b=0.04)

    def forward(self, ids: Tensor) -> Tensor:
        """Args: ids (B, L) int64. Returns: member-major logits (M·B, K)."""
        keep = ids != self.pad_id  # (B, L)
        x = self.drop(self.tokens(ids) + self.positions[:, : ids.shape[1]])  # (B, L, W)
        for block in self.blocks:
            x = block(x, keep[:, None, None, :])
        x = self.norm(x)
        if self.pooling == "cls":
            pooled = x[:, 0]  # (B, W)
        else:
            w = keep.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
            pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (B, W)
        return self.head(self.head_drop(pooled))  # (M·B, K): the last PackedLinear rearranges


def packed_text_transformer(ctx: BuildContext, alpha: float, gamma: int) -> nn.Module:
    """The cell's ``text_transformer`` (its options from the suite) as Packed-Ensembles."""
    kwargs = dict(ctx.backbone_kwargs)
    return PackedTextTransformer(
        ctx.in_shape[0], ctx.num_classes, ctx.num_members, alpha, gamma, **kwargs
    )
