"""`film_ensemble`: FiLM-Ensemble (Turkoglu et al., "FiLM-Ensemble: Probabilistic Deep Learning
via Feature-wise Linear Modulation", NeurIPS 2022).

σN-Ens's closest ancestor and its natural ablation: the same member-specific normalization
layers with per-member affine (γ, β) but without the sigmoid-bounded scale and without L_div.
As in the paper, member diversity comes from a random initialisation of the per-member affine
(weight × (1 + N(0, init_std²)), bias + N(0, init_std²)): with identical affine parameters the
members would receive identical gradients and never separate. ``init_std: 0`` with a
``pretrained`` model keeps the step-0 predictions of the converted model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from methods.base import BuildContext, MethodSpec, register_method
from methods.sigma_ens import SigmaEnsemble
from methods.sigma_norm import sigma_norm_layers


@dataclass(frozen=True)
class FiLMHparams:
    init_std: float = field(
        default=0.5,
        metadata={"ge": 0, "help": "spread of the random per-member affine initialisation"},
    )
    pretrained: str | None = field(
        default=None, metadata={"help": "state dict of a trained single model to convert"}
    )
    pretrain_epochs: int = field(default=0, metadata={"ge": 0})


class FiLMEnsemble(SigmaEnsemble):
    variant = "film"

    def __init__(self, ctx: BuildContext, hp: FiLMHparams) -> None:
        super().__init__(ctx, hp)
        with torch.no_grad():
            for _, layer in sigma_norm_layers(self.net):
                layer.weight.mul_(1 + hp.init_std * torch.randn_like(layer.weight))
                layer.bias.add_(hp.init_std * torch.randn_like(layer.bias))

    def regularizer(self):
        return None

    def diagnostics(self) -> dict[str, Any]:
        return {}


register_method(
    MethodSpec(
        name="film_ensemble",
        build=lambda ctx, hp: FiLMEnsemble(ctx, hp),
        hparams=FiLMHparams,
        reference="Turkoglu et al., NeurIPS 2022",
    )
)
