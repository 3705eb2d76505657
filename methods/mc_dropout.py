"""`mc_dropout`: Monte-Carlo Dropout (Gal & Ghahramani, "Dropout as a Bayesian Approximation",
ICML 2016) with torch-uncertainty's wrapper.

One network trained with dropout; at evaluation its dropout stays on and M stochastic passes
(the batch repeated M times, member-major) form the ensemble. M is the number of passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from methods.base import BuildContext, EnsembleModel, MethodSpec, register_method, to_members


@dataclass(frozen=True)
class MCDropoutHparams:
    dropout_rate: float = field(default=0.1, metadata={"gt": 0, "lt": 1})
    last_layer: bool = field(default=False, metadata={"help": "dropout before the head only"})


class MCDropout(EnsembleModel):
    def __init__(self, ctx: BuildContext, hp: MCDropoutHparams) -> None:
        super().__init__()
        from torch_uncertainty.methods import mc_dropout

        self.num_members = ctx.num_members
        core = ctx.build_backbone(dropout_rate=hp.dropout_rate)
        self.net = mc_dropout(
            core, num_estimators=ctx.num_members, last_layer=hp.last_layer, on_batch=True
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.training:  # one stochastic pass of the single network
            return self.net(x).unsqueeze(0)  # (1, B, K)
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)


register_method(
    MethodSpec(
        name="mc_dropout",
        build=lambda ctx, hp: MCDropout(ctx, hp),
        hparams=MCDropoutHparams,
        reference="Gal & Ghahramani, ICML 2016",
        stochastic_eval=True,
    )
)
