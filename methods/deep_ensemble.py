"""`deep_ensemble`: M independently initialised copies of the backbone (Lakshminarayanan et al.,
"Simple and Scalable Predictive Uncertainty Estimation using Deep Ensembles", NeurIPS 2017).

Members are held by torch-uncertainty's ``deep_ensembles`` wrapper and see the same batches (the
harness's fair-comparison rule; the paper's random shuffling per member is a documented delta we
do not take). On CUDA, ``parallel: streams`` runs members on separate CUDA streams so that small
members overlap instead of serialising in the Python loop; ``loop`` is torch-uncertainty's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from methods.base import BuildContext, EnsembleModel, MethodSpec, register_method, to_members


@dataclass(frozen=True)
class DeepEnsembleHparams:
    parallel: Literal["loop", "streams"] = field(
        default="loop", metadata={"help": "member execution on CUDA (streams overlap members)"}
    )


class DeepEnsemble(EnsembleModel):
    """M independent backbones; forward returns (M, B, K).

    Members have separate weights, so their losses are summed: each member gets the gradient it
    would get trained alone with the recipe (Lakshminarayanan et al. train members
    independently); a mean would silently divide every member's learning rate by M.
    """

    member_loss = "sum"

    def __init__(self, ctx: BuildContext, hp: DeepEnsembleHparams) -> None:
        super().__init__()
        from torch_uncertainty.methods import deep_ensembles

        self.num_members = ctx.num_members
        self.parallel = hp.parallel
        members = [ctx.build_backbone() for _ in range(ctx.num_members)]  # distinct inits
        self.ensemble = deep_ensembles(members, reset_model_parameters=False)
        self._streams: list[torch.cuda.Stream] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.parallel == "streams" and x.is_cuda and self.num_members > 1:
            return self._forward_streams(x)
        return to_members(self.ensemble(x), self.num_members)  # (M·B, K) → (M, B, K)

    def _forward_streams(self, x: Tensor) -> Tensor:
        if self._streams is None:
            self._streams = [torch.cuda.Stream(x.device) for _ in range(self.num_members)]
        main = torch.cuda.current_stream(x.device)
        outs = []
        for stream, member in zip(self._streams, self.ensemble.core_models):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                outs.append(member(x))
        for stream, out in zip(self._streams, outs):
            main.wait_stream(stream)
            out.record_stream(main)
        return torch.stack(outs)  # (M, B, K)


register_method(
    MethodSpec(
        name="deep_ensemble",
        build=lambda ctx, hp: DeepEnsemble(ctx, hp),
        hparams=DeepEnsembleHparams,
        min_members=2,  # a one-member deep ensemble is `single`
        reference="Lakshminarayanan et al., NeurIPS 2017",
    )
)
