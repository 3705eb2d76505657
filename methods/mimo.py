"""`mimo`: multi-input multi-output networks (Havasi et al., "Training independent subnetworks
for robust prediction", ICLR 2021), torch-uncertainty's models.

M inputs are stacked along channels and M predictions read from a widened head. In training
member m gets its own shuffle of the batch (independent subnetworks); with probability ``rho``
a sample is shared by all members (input repetition, Havasi et al. §3.4); in evaluation every
member gets the same input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from einops import rearrange
from torch import Tensor, nn

from methods.base import (
    BuildContext,
    EnsembleModel,
    MethodSpec,
    register_method,
    repeat_members,
    to_members,
)
from methods.tu_common import TU_BACKBONES, build_tu, digits_cnn


@dataclass(frozen=True)
class MIMOHparams:
    rho: float = field(
        default=0.0, metadata={"ge": 0, "le": 1, "help": "input repetition probability"}
    )


class _MIMODigits(nn.Module):
    """The digits CNN taking M·C input channels and giving M·K outputs (as torch-uncertainty's
    MIMO ResNet: same rearrangement)."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        m = ctx.num_members
        wide = BuildContext(
            ctx.backbone,
            (ctx.in_shape[0] * m, *ctx.in_shape[1:]),
            ctx.num_classes * m,
            m,
            ctx.backbone_kwargs,
        )
        self.core = digits_cnn(wide)
        self.num_estimators = m

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            x = repeat_members(x, self.num_estimators)
        out = rearrange(x, "(m b) c h w -> b (m c) h w", m=self.num_estimators)
        out = self.core(out)  # (B, M·K)
        return rearrange(out, "b (m k) -> (m b) k", m=self.num_estimators)


class MIMO(EnsembleModel):
    """MIMO's loss is the sum of the M subnetworks' cross-entropies (Havasi et al., eq. 1)."""

    member_loss = "sum"

    def __init__(self, ctx: BuildContext, hp: MIMOHparams) -> None:
        super().__init__()
        from torch_uncertainty.models.classification import mimo_resnet, mimo_wideresnet28x10

        self.num_members = ctx.num_members
        self.rho = hp.rho
        self.net = build_tu(ctx, mimo_resnet, mimo_wideresnet28x10, _MIMODigits)

    def forward(self, x: Tensor) -> Tensor:
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)

    def training_outputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        m, b = self.num_members, x.shape[0]
        idx = [torch.arange(b, device=x.device)]
        for _ in range(m - 1):
            perm = torch.randperm(b, device=x.device)
            shared = torch.rand(b, device=x.device) < self.rho
            idx.append(torch.where(shared, idx[0], perm))
        order = torch.cat(idx)  # (M·B,) member-major
        logits = self.net(x[order])  # (M·B, K)
        return to_members(logits, m), y[order].view(m, b)  # (M, B, K), (M, B)


register_method(
    MethodSpec(
        name="mimo",
        build=lambda ctx, hp: MIMO(ctx, hp),
        hparams=MIMOHparams,
        backbones=TU_BACKBONES,
        reference="Havasi et al., ICLR 2021",
    )
)
