"""`single`: one deterministic model (M=1), the reference every ensemble is compared with."""

from __future__ import annotations

from torch import Tensor

from methods.base import BuildContext, EnsembleModel, MethodSpec, NoHparams, register_method


class SingleModel(EnsembleModel):
    """A plain backbone presented as a one-member ensemble: logits (1, B, K)."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.num_members = 1
        self.net = ctx.build_backbone()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).unsqueeze(0)  # (1, B, K)


register_method(
    MethodSpec(
        name="single",
        build=lambda ctx, hp: SingleModel(ctx),
        hparams=NoHparams,
        min_members=1,
        max_members=1,
        reference="one deterministic network",
    )
)
