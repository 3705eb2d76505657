"""The common base of the normalization-based implicit ensembles: σN-Ens and FiLM-Ensemble.

Both turn one backbone into M members by replacing every normalization layer with M
member-specific normalizations (``methods/_sigma/convert.py``) and share everything else; they
differ only in what the member-specific layer holds (σN-Ens: affine and a sigmoid-bounded
importance γ, Suteu & Serban 2026; FiLM-Ensemble: affine only, Turkoglu et al., NeurIPS 2022)
and in how members are made to differ (σN-Ens: L_div; FiLM: a random affine initialisation).
Each subclass states its variant and its conversion options; this base owns what they share:
building and converting the backbone (optionally from a trained one), the explicit random
generator, the forward pass and the gradient scale of the per-member parameters.

Gradient scale of the per-member parameters (the harness's choice; neither paper says). The
task loss is the mean over members of each member's cross-entropy, so the shared weights get a
single model's gradient scale. A per-member parameter, however, is reached only by its own
member's loss and thus gets 1/M of the gradient a single model's norm affine would get, while
weight decay pulls it as hard as ever: under SGD its effective learning rate is lr/M and its
equilibrium is shrunk towards 0. ``member_grad: "member"`` (the default) multiplies the gradient
of the per-member parameters by M, so each member's norm parameters train exactly like a single
model's norm parameters on that member's loss; ``"mean"`` keeps plain autograd (the behaviour
before; measured on digits_hard in docs/claims.md). Under Adam(W) the rescale changes nothing
but the ε term (Adam is invariant to a constant gradient scale).
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import torch
from torch import Tensor

from methods._base import BuildContext, EnsembleModel
from methods._sigma.convert import SigmaEnsembleNet
from methods._sigma.norm import SigmaNorm, sigma_norm_layers

MEMBER_GRAD_CHOICES = ("member", "mean")


def init_generator(ctx: BuildContext, purpose: str) -> torch.Generator:
    """An explicit CPU generator for one random initialisation, fixed by the cell's seed.

    Seeded from ``(ctx.seed, purpose)`` so two purposes never share a stream and the draw does
    not depend on how many numbers the backbone's initialisers consumed before. Without a seed
    in the context (a method built outside the runner) one is drawn from torch's generator,
    which the runner seeds with the cell's seed, so a build stays reproducible either way.
    """
    seed = ctx.seed
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
    mixed = (int(seed) * 1_000_003 + zlib.crc32(purpose.encode())) % 2**63
    return torch.Generator().manual_seed(mixed)


class NormEnsemble(EnsembleModel):
    """A backbone whose norm layers are M member-specific σNorm layers; forward (M, B, K).

    Subclasses set :attr:`variant` and may override :meth:`convert_kwargs` (options of the
    σNorm layers) and :meth:`init_members` (a random per-member initialisation after conversion).

    Args:
        ctx: The build context; ``ctx.pretrained`` (a state dict of the plain backbone) is
            loaded first and converted with its predictions preserved.
        hp: Hyper-parameters; this base reads ``member_grad`` ("member" or "mean").
    """

    variant: ClassVar[str]

    def __init__(self, ctx: BuildContext, hp: Any) -> None:
        super().__init__()
        if hp.member_grad not in MEMBER_GRAD_CHOICES:
            raise ValueError(
                f"member_grad must be one of {MEMBER_GRAD_CHOICES}, got {hp.member_grad!r}"
            )
        self.hp = hp
        self.num_members = ctx.num_members
        backbone = ctx.build_backbone()
        # A backbone that loads pre-trained weights itself (``pretrained_weights``, e.g.
        # hf_encoder) is converted like ``pretrained: PATH``: its outputs are preserved.
        preserve = ctx.pretrained is not None or bool(getattr(backbone, "pretrained_weights", 0))
        if ctx.pretrained is not None:
            backbone.load_state_dict(ctx.pretrained)
        gen = init_generator(ctx, f"{type(self).__name__}.init")
        self.net = SigmaEnsembleNet(
            backbone,
            ctx.num_members,
            convert=True,
            variant=self.variant,
            generator=gen,
            preserve_outputs=preserve,
            **self.convert_kwargs(hp),
        )
        scale = float(ctx.num_members) if hp.member_grad == "member" else 1.0
        for _, layer in self.norm_layers():
            layer.member_grad_scale = scale
        self.init_members(hp, gen, preserve)

    def convert_kwargs(self, hp: Any) -> dict[str, Any]:
        """Extra options of :func:`methods._sigma.convert.convert_to_ensemble`."""
        return {}

    def init_members(self, hp: Any, generator: torch.Generator, pretrained: bool) -> None:
        """Random per-member initialisation after conversion (default: none)."""

    def norm_layers(self) -> list[tuple[str, SigmaNorm]]:
        """(qualified name, layer) of every member-specific norm layer."""
        return sigma_norm_layers(self.net)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (B, C, H, W). Returns: member logits (M, B, K)."""
        return self.net(x)  # (M, B, K)

    def member_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer groups of the per-member parameters other than the shared weights.

        The member affine (weight, bias) decays with ``member_weight_decay`` (None: the
        recipe's value, as a single model's norm affine).
        """
        wd = self.hp.member_weight_decay
        params = [p for _, layer in self.norm_layers() for p in (layer.weight, layer.bias)]
        return [{"params": params, "weight_decay": weight_decay if wd is None else wd}]

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """The shared weights with the recipe's decay, then :meth:`member_groups`."""
        groups = self.member_groups(weight_decay)
        ids = {id(p) for g in groups for p in g["params"]}
        shared = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        return [{"params": shared, "weight_decay": weight_decay}, *groups]
