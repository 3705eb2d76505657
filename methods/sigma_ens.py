"""`sigma_ens`: σN-Ens, the normalization-based implicit ensemble with controllable diversity
(Suteu & Serban, "Controllable Diversity in Normalization-Based Implicit Ensembles via
Softmax-Temperature Modulation", 2026; DESIGN.md §2).

Every normalization layer of the backbone becomes M member-specific normalizations scaled by
sigmoid(γ_m); all other weights are shared. The loss adds
L_div = λ Σ_ℓ Σ_i Σ_m log softmax(sigmoid(γ_{·,ℓ,i}) / τ)_m, whose equilibrium τ sets (low τ:
one member owns each feature; high τ: features shared). τ and λ may follow a schedule.

Pretrained conversion (``pretrained`` path or ``pretrain_epochs`` > 0, run by the harness): the
trained norms are copied into every member and the affine parameters divided by sigmoid(γ_m), so
at step 0 every member reproduces the original model's logits exactly (to float32 rounding; see
``methods/sigma_norm.py``); the ensemble is then fine-tuned for the recipe's epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from methods.base import BuildContext, EnsembleModel, MethodSpec, register_method
from methods.sigma_convert import SigmaEnsembleNet
from methods.sigma_diversity import diversity_loss, sharing_diagnostics


@dataclass(frozen=True)
class SigmaEnsHparams:
    tau: float = field(default=1.0, metadata={"gt": 0, "help": "softmax temperature τ"})
    lam: float = field(default=1e-3, metadata={"ge": 0, "help": "regularizer weight λ"})
    schedule: Literal["constant", "linear", "cosine"] = field(
        default="constant", metadata={"help": "τ/λ schedule from (tau, lam) to the *_end values"}
    )
    tau_end: float | None = field(default=None, metadata={"gt": 0})
    lam_end: float | None = field(default=None, metadata={"ge": 0})
    layers: str | None = field(
        default=None, metadata={"help": "regex of regularized σNorm layer names (default: all)"}
    )
    gamma_init_std: float = field(default=1.0, metadata={"ge": 0})
    gamma_init_mean: float = 0.0
    pretrained: str | None = field(
        default=None,
        metadata={
            "help": "state dict of a trained single model to convert (harness final.pt or any)"
        },
    )
    pretrain_epochs: int = field(
        default=0,
        metadata={
            "ge": 0,
            "help": "train a single model this long first, then convert and fine-tune",
        },
    )


class SigmaEnsemble(EnsembleModel):
    """σN-Ens (or, with ``variant="film"``, FiLM-Ensemble) on any backbone; forward (M, B, K)."""

    variant = "sigma"

    def __init__(self, ctx: BuildContext, hp: Any) -> None:
        super().__init__()
        self.hp = hp
        self.num_members = ctx.num_members
        backbone = ctx.build_backbone()
        preserve = ctx.pretrained is not None
        if preserve:
            backbone.load_state_dict(ctx.pretrained)
        gen = torch.Generator().manual_seed(torch.initial_seed() % 2**63)
        kwargs = {"variant": self.variant, "generator": gen, "preserve_outputs": preserve}
        if self.variant == "sigma":
            kwargs.update(gamma_init_std=hp.gamma_init_std, gamma_init_mean=hp.gamma_init_mean)
        self.net = SigmaEnsembleNet(backbone, ctx.num_members, convert=True, **kwargs)
        self._progress = 0.0

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # (M, B, K)

    def set_progress(self, epoch: int, num_epochs: int) -> None:
        self._progress = epoch / max(num_epochs - 1, 1)

    def current(self) -> tuple[float, float]:
        """(τ, λ) at the current point of the schedule."""
        hp = self.hp
        if hp.schedule == "constant":
            return hp.tau, hp.lam
        t = (
            self._progress
            if hp.schedule == "linear"
            else 0.5 * (1 - math.cos(math.pi * self._progress))
        )
        tau_end = hp.tau if hp.tau_end is None else hp.tau_end
        lam_end = hp.lam if hp.lam_end is None else hp.lam_end
        # τ interpolates geometrically: it acts as a scale (1/τ bounds the logit gap).
        return hp.tau * (tau_end / hp.tau) ** t, hp.lam + (lam_end - hp.lam) * t

    def regularizer(self) -> Tensor | None:
        tau, lam = self.current()
        if lam == 0:
            return None
        return diversity_loss(self.net, tau, lam, self.hp.layers)

    def diagnostics(self) -> dict[str, Any]:
        tau, lam = self.current()
        with torch.no_grad():
            diag = sharing_diagnostics(self.net, self.hp.layers)
            l_div = diversity_loss(self.net, tau, 1.0, self.hp.layers)
        return {**diag, "tau": tau, "lam": lam, "l_div": float(l_div)}


def check(hp: SigmaEnsHparams, num_members: int) -> list[str]:
    if hp.pretrained and hp.pretrain_epochs:
        return ["set either pretrained or pretrain_epochs, not both"]
    return []


register_method(
    MethodSpec(
        name="sigma_ens",
        build=lambda ctx, hp: SigmaEnsemble(ctx, hp),
        hparams=SigmaEnsHparams,
        reference="Suteu & Serban, 2026",
        check=check,
    )
)
