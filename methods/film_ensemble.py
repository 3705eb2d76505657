"""`film_ensemble`: FiLM-Ensemble (Turkoglu et al., "FiLM-Ensemble: Probabilistic Deep Learning
via Feature-wise Linear Modulation", NeurIPS 2022).

σN-Ens's closest ancestor and its natural ablation: the same member-specific normalization
layers with per-member affine (γ, β) but without the sigmoid-bounded scale and without L_div.
As in the paper, member diversity comes from a random initialisation of the per-member affine
(weight × (1 + N(0, init_std²)), bias + N(0, init_std²)): with identical affine parameters the
members would receive identical gradients and never separate. ``init_std: 0`` with a
``pretrained`` model keeps the step-0 predictions of the converted model.

A sibling of σN-Ens on the shared norm-ensemble base (``methods/norm_ensemble.py``): the same
conversion, generator seeded from the cell's seed, and per-member gradient scale
(``member_grad``), so the two differ only in the layer and in how members are made to differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from methods.base import MethodSpec, register_method
from methods.norm_ensemble import NormEnsemble


@dataclass(frozen=True)
class FiLMHparams:
    init_std: float = field(
        default=0.5,
        metadata={"ge": 0, "help": "spread of the random per-member affine initialisation"},
    )
    member_weight_decay: float | None = field(
        default=None,
        metadata={"ge": 0, "help": "weight decay of the member affine (null: the recipe's)"},
    )
    member_grad: Literal["member", "mean"] = field(
        default="member",
        metadata={"help": "per-member params get their member's loss gradient (×M) or 1/M"},
    )
    pretrained: str | None = field(
        default=None, metadata={"help": "state dict of a trained single model to convert"}
    )
    pretrain_epochs: int = field(default=0, metadata={"ge": 0})


class FiLMEnsemble(NormEnsemble):
    """FiLM-Ensemble on any backbone; forward (M, B, K); no regularizer, no diagnostics."""

    variant = "film"

    def init_members(self, hp: FiLMHparams, generator: torch.Generator, pretrained: bool) -> None:
        """weight × (1 + N(0, init_std²)), bias + N(0, init_std²), from the seeded generator."""
        with torch.no_grad():
            for _, layer in self.norm_layers():
                for p, multiplicative in ((layer.weight, True), (layer.bias, False)):
                    noise = torch.randn(p.shape, generator=generator).to(p) * hp.init_std
                    p.mul_(1 + noise) if multiplicative else p.add_(noise)


register_method(
    MethodSpec(
        name="film_ensemble",
        build=lambda ctx, hp: FiLMEnsemble(ctx, hp),
        hparams=FiLMHparams,
        reference="Turkoglu et al., NeurIPS 2022",
        pretrained_conversion=True,
    )
)
