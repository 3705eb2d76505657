"""`film_ensemble`: FiLM-Ensemble (Turkoglu et al., "FiLM-Ensemble: Probabilistic Deep Learning
via Feature-wise Linear Modulation", NeurIPS 2022).

σN-Ens's closest ancestor and its natural ablation: the same member-specific normalization
layers with per-member affine (γ, β) but without the sigmoid-bounded scale and without L_div.
Member diversity comes only from a random initialisation of the per-member affine: with identical
affine parameters the members would receive identical gradients and never separate.

``init: xavier`` is the official code's (prs-eth/FILM-Ensemble, ``models/CBN.py``,
``CBN2D.__init__`` with its defaults ``init_type='xavier'``, ``cbn_gain=1.0``; ``main.py``'s
``--cbn_gain 1.0``): the scale and the shift are both drawn zero-mean from
``nn.init.xavier_uniform_(·, gain=cbn_gain)`` over the (M, C) tensor, i.e. U(−a, a) with
a = cbn_gain·√(6 / (M + C)); nothing is added to the scale, so it is *not* centred on 1.
``init: perturb`` (the harness's own choice, for converting a trained model: the official code
has no conversion) keeps the converted affine and perturbs it, weight × (1 + N(0, init_std²)),
bias + N(0, init_std²); ``init_std: 0`` keeps the step-0 predictions of the converted model.
``init: auto`` (default) is ``xavier`` from scratch and ``perturb`` when a trained model is
converted (``pretrained``, ``pretrain_epochs`` or a backbone that loads weights itself).

A sibling of σN-Ens on the shared norm-ensemble base (``methods/_sigma/norm_ensemble.py``): the same
conversion, generator seeded from the cell's seed, and per-member gradient scale
(``member_grad``), so the two differ only in the layer and in how members are made to differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from methods._base import MethodSpec, pretrain_epochs_field, pretrained_field, register_method
from methods._sigma.norm_ensemble import NormEnsemble


@dataclass(frozen=True)
class FiLMHparams:
    init: Literal["auto", "xavier", "perturb"] = field(
        default="auto",
        metadata={"help": "member affine init: official xavier, or perturb a converted model's"},
    )
    cbn_gain: float = field(
        default=1.0, metadata={"gt": 0, "help": "gain of the xavier init (official cbn_gain)"}
    )
    init_std: float = field(
        default=0.5,
        metadata={"ge": 0, "help": "spread of the perturb init around the converted affine"},
    )
    member_weight_decay: float | None = field(
        default=None,
        metadata={"ge": 0, "help": "weight decay of the member affine (null: the recipe's)"},
    )
    member_grad: Literal["member", "mean"] = field(
        default="member",
        metadata={"help": "per-member params get their member's loss gradient (×M) or 1/M"},
    )
    pretrained: str | None = pretrained_field()
    pretrain_epochs: int = pretrain_epochs_field()


class FiLMEnsemble(NormEnsemble):
    """FiLM-Ensemble on any backbone; forward (M, B, K); no regularizer, no diagnostics."""

    variant = "film"

    def init_members(self, hp: FiLMHparams, generator: torch.Generator, pretrained: bool) -> None:
        """The per-member affine (M, *F) from the seeded generator (see the module docstring)."""
        init = hp.init if hp.init != "auto" else ("perturb" if pretrained else "xavier")
        with torch.no_grad():
            for _, layer in self.norm_layers():
                for p, multiplicative in ((layer.weight, True), (layer.bias, False)):
                    if init == "xavier":
                        # Xavier over the (M, C) tensor as CBN2D: fan_in = C, fan_out = M (a
                        # LayerNorm's feature shape is flattened to C = its element count).
                        draw = torch.empty(p.shape[0], p[0].numel())
                        nn.init.xavier_uniform_(draw, gain=hp.cbn_gain, generator=generator)
                        p.copy_(draw.view(p.shape))
                        continue
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
