"""`deep_ensemble`: M independently initialised copies of the backbone (Lakshminarayanan et al.,
"Simple and Scalable Predictive Uncertainty Estimation using Deep Ensembles", NeurIPS 2017).

Members are held by torch-uncertainty's ``deep_ensembles`` wrapper. With ``independent_data``
(default, as in the paper) each member trains on its own stream of batches: the training loader
draws M batches per step, each with the order and augmentation of the member's own seed (still
deterministic); ``independent_data: false`` feeds every member the same batch. On CUDA,
``parallel: streams`` runs members on separate CUDA streams so that small members overlap
instead of serialising in the Python loop; ``loop`` is torch-uncertainty's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from methods._base import (
    BatchFeeding,
    BuildContext,
    EnsembleModel,
    MethodSpec,
    TrainOutput,
    register_method,
    to_members,
)


@dataclass(frozen=True)
class DeepEnsembleHparams:
    parallel: Literal["loop", "streams"] = field(
        default="loop", metadata={"help": "member execution on CUDA (streams overlap members)"}
    )
    independent_data: bool = field(
        default=True,
        metadata={"help": "each member its own data order and augmentation (own seed)"},
    )


def feeding(hp: DeepEnsembleHparams) -> BatchFeeding:
    return BatchFeeding("independent" if hp.independent_data else "shared")


class DeepEnsemble(EnsembleModel):
    """M independent backbones; forward returns (M, B, K).

    Members have separate weights, so their losses are summed: each member gets the gradient it
    would get trained alone with the recipe (Lakshminarayanan et al. train members
    independently); a mean would silently divide every member's learning rate by M.
    """

    def __init__(self, ctx: BuildContext, hp: DeepEnsembleHparams) -> None:
        super().__init__()
        from torch_uncertainty.methods import deep_ensembles

        self.num_members = ctx.num_members
        self.parallel = hp.parallel
        members = [ctx.build_backbone() for _ in range(ctx.num_members)]  # distinct inits
        self.ensemble = deep_ensembles(members, reset_model_parameters=False)
        self._streams: list[torch.cuda.Stream] | None = None

    def clip_groups(self) -> list[list[torch.nn.Parameter]]:
        """One set per member: gradient clipping bounds each member's own gradient norm, as it
        would be clipped trained alone (a joint norm would couple the members and shrink the
        step of every member by the others' gradients)."""
        return [list(member.parameters()) for member in self.ensemble.core_models]

    def forward(self, x: Tensor) -> Tensor:
        if self.parallel == "streams" and x.is_cuda and self.num_members > 1:
            return self._forward_streams([x] * self.num_members)
        return to_members(self.ensemble(x), self.num_members)  # (M·B, K) → (M, B, K)

    def training_outputs(self, x: Tensor, y: Tensor) -> TrainOutput:
        """Args: x (B, ...) shared, or (M, B, ...) one batch per member (images or token ids);
        y (B,) or (M, B) to match."""
        m = self.num_members
        if y.dim() == 1:  # one shared batch (images (B, C, H, W), token ids (B, L), ...)
            logits = self(x)  # (M, B, K)
            return TrainOutput(logits, y.unsqueeze(0).expand(m, -1), "sum")
        if x.shape[0] != m or tuple(y.shape) != tuple(x.shape[:2]):
            raise ValueError(
                f"per-member batches must be ({m}, B, C, H, W) with targets ({m}, B), got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        if self.parallel == "streams" and x.is_cuda and m > 1:
            logits = self._forward_streams(list(x.unbind(0)))
        else:
            logits = torch.stack(
                [member(xm) for member, xm in zip(self.ensemble.core_models, x.unbind(0))]
            )  # (M, B, K)
        return TrainOutput(logits, y, "sum")

    def _forward_streams(self, xs: list[Tensor]) -> Tensor:
        """Member m on xs[m], each on its own CUDA stream; returns (M, B, K)."""
        device = xs[0].device
        if self._streams is None:
            self._streams = [torch.cuda.Stream(device) for _ in range(self.num_members)]
        main = torch.cuda.current_stream(device)
        outs = []
        for stream, member, xm in zip(self._streams, self.ensemble.core_models, xs):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                outs.append(member(xm))
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
        batch_feeding=feeding,
    )
)
