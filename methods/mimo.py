"""`mimo`: multi-input multi-output networks (Havasi et al., "Training independent subnetworks
for robust prediction", ICLR 2021), torch-uncertainty's models.

M inputs are stacked along channels and M predictions read from a widened head. Training follows
uncertainty-baselines' ``baselines/cifar/mimo.py``: the batch is tiled ``batch_repetitions``
times (default 4, UB's), one shared shuffle is drawn, and every member re-shuffles the first
(1 − ``rho``) of it, so each member sees every image of the step ``batch_repetitions`` times in
its own order while a fraction ``rho`` of rows is shared by all members (input repetition,
Havasi et al. §3.4). UB also divides the loader batch by the repetitions; the harness keeps the
recipe's batch (set ``batch_size`` to B/R to match UB exactly). In evaluation every member gets
the same input. The loss sums the members' cross-entropies (Havasi et al. eq. 1, UB).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from einops import rearrange
from torch import Tensor, nn

from methods._base import (
    BatchFeeding,
    BuildContext,
    EnsembleModel,
    MethodSpec,
    TrainOutput,
    register_method,
    repeat_members,
    to_members,
)
from methods._tu.common import TU_FAMILIES, build_tu, digits_cnn


@dataclass(frozen=True)
class MIMOHparams:
    rho: float = field(
        default=0.0, metadata={"ge": 0, "le": 1, "help": "input repetition probability"}
    )
    batch_repetitions: int = field(
        default=4, metadata={"ge": 1, "help": "times each image appears per member and step"}
    )


def feeding(hp: MIMOHparams) -> BatchFeeding:
    return BatchFeeding("shared", repetitions=hp.batch_repetitions)


def member_orders(
    batch: int, members: int, repetitions: int, rho: float, device: torch.device | None = None
) -> Tensor:
    """Row order of every member for one training step (uncertainty-baselines' MIMO).

    Returns:
        (M, B·R) indices into the batch: one shuffle of the batch tiled R times, of which each
        member re-shuffles the first (1 − rho) and keeps the rest (the rows all members share).

    Drawn on ``device`` from its default generator (seeded per cell and checkpointed by the
    runner): a shuffle is the order of uniform keys (``rand(...).argsort()``), which a CUDA
    graph draws anew at every replay (a host ``randperm`` copied in would be replayed frozen:
    every step of the cell would reuse the orders drawn at capture). No host copy either.
    """
    n = batch * repetitions
    tiled = torch.arange(batch, device=device).repeat(repetitions)  # (B·R,)
    main = tiled[torch.rand(n, device=device).argsort()]  # (B·R,) the shared shuffle
    k = int(n * (1.0 - rho))  # rows each member re-shuffles
    heads = main[:k][torch.rand(members, k, device=device).argsort(dim=1)]  # (M, k)
    shared = main[k:].expand(members, n - k)  # (M, B·R - k) rows every member keeps
    return torch.cat([heads, shared], dim=1)  # (M, B·R)


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

    def __init__(self, ctx: BuildContext, hp: MIMOHparams) -> None:
        super().__init__()
        from torch_uncertainty.models.classification import mimo_resnet, mimo_wideresnet28x10

        self.num_members = ctx.num_members
        self.rho = hp.rho
        self.repetitions = hp.batch_repetitions
        self.net = build_tu(ctx, mimo_resnet, mimo_wideresnet28x10, _MIMODigits)

    def forward(self, x: Tensor) -> Tensor:
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)

    def training_outputs(self, x: Tensor, y: Tensor) -> TrainOutput:
        m = self.num_members
        order = member_orders(x.shape[0], m, self.repetitions, self.rho, x.device)  # (M, B·R)
        order = order.flatten()  # (M·B·R,) member-major
        logits = to_members(self.net(x[order]), m)  # (M·B·R, K) → (M, B·R, K)
        return TrainOutput(logits, y[order].view(m, -1), "sum")  # targets (M, B·R)


register_method(
    MethodSpec(
        name="mimo",
        build=lambda ctx, hp: MIMO(ctx, hp),
        hparams=MIMOHparams,
        families=TU_FAMILIES,
        batch_feeding=feeding,
        reference="Havasi et al., ICLR 2021",
    )
)
