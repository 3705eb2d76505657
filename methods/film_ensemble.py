"""`film_ensemble`: FiLM-Ensemble (Turkoglu et al., "FiLM-Ensemble: Probabilistic Deep Learning
via Feature-wise Linear Modulation", NeurIPS 2022).

σN-Ens's closest ancestor and its natural ablation: the same member-specific normalization
layers with per-member affine (γ, β) but without the sigmoid-bounded scale and without L_div.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from methods.base import BuildContext, MethodSpec, register_method
from methods.sigma_ens import SigmaEnsemble


@dataclass(frozen=True)
class FiLMHparams:
    pretrained: str | None = field(default=None, metadata={
        "help": "state dict of a trained single model to convert"})
    pretrain_epochs: int = field(default=0, metadata={"ge": 0})


class FiLMEnsemble(SigmaEnsemble):
    variant = "film"

    def regularizer(self):
        return None

    def diagnostics(self) -> dict[str, Any]:
        return {}


register_method(MethodSpec(
    name="film_ensemble", build=lambda ctx, hp: FiLMEnsemble(ctx, hp), hparams=FiLMHparams,
    reference="Turkoglu et al., NeurIPS 2022"))
