"""σN-Ens on your own model, in your own training loop (Suteu & Serban 2026).

The harness's own σN-Ens (``methods/sigma_ens.py``) is built from these same parts: the
converter of ``methods/_sigma/convert.py`` and the regularizer and diagnostics of
``methods/_sigma/diversity.py``. This module hands them to a user's ``nn.Module``::

    import torch.nn.functional as F
    from methods._sigma_public import sigma_ensemble

    net = sigma_ensemble(my_model, num_members=4)          # every BatchNorm/LayerNorm/GroupNorm
    opt = torch.optim.SGD(net.param_groups(weight_decay=5e-4), lr=0.05, momentum=0.9)
    for x, y in loader:                                      # x (B, ...), y (B,)
        logits = net(x)                                      # (M, B, K)
        task = F.cross_entropy(logits.flatten(0, 1), y.repeat(net.num_members))
        loss = task + net.diversity_loss(tau=0.5, lam=1e-3)  # λ·L_div
        opt.zero_grad(); loss.backward(); opt.step()
    print(net.k_eff())                                       # 1 = each feature owned … M = shared
    p = net.predict_proba(x)                                 # (B, K): the ensemble's prediction

**The member-batch convention.** Members are batched, not looped. ``net(x)`` takes a plain batch
x of shape (B, ...), repeats it M times along the batch axis *member-major* — rows m·B … m·B+B−1
of the (M·B, ...) tensor the wrapped model sees are member m's copy of x — and views the
model's (M·B, K) output as (M, B, K): ``logits[m, b]`` is member m's prediction for ``x[b]``.
Every σNorm layer normalises member m's rows with member m's statistics and parameters only;
every other weight is shared. The targets matching ``logits.flatten(0, 1)`` are therefore
``y.repeat(M)`` (member-major too). To feed members different images, call the wrapped model
``net.backbone`` on an (M·B, ...) tensor you stacked member-major yourself, and view its output
as (M, B, K). The ensemble's prediction is the mean of the members' softmax probabilities.

**From scratch or from trained weights.** ``pretrained=False`` (from scratch): each norm's
fresh affine goes to every member, γ ~ N(3, 0.1²) (sigmoid(γ) ≈ 0.95: with diversity off the
ensemble behaves like the model it wraps — the harness's default, docs/methods.md).
``pretrained=True`` (a trained model): the trained norms and running statistics are copied
into every member and each member's affine is divided by its sigmoid(γ_m), so every member
reproduces the trained model's logits at step 0 (to float32 rounding); fine-tune it briefly.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from methods._sigma.convert import SigmaEnsembleNet
from methods._sigma.diversity import diversity_loss as _diversity_loss
from methods._sigma.diversity import sharing_diagnostics
from methods._sigma.norm import sigma_norm_layers
from methods.sigma_ens import GAMMA_INIT_MEAN, GAMMA_INIT_STD, SigmaEnsHparams, gate_gain

__all__ = ["SigmaEnsembleModel", "diversity_loss", "k_eff", "sigma_ensemble"]


class SigmaEnsembleModel(SigmaEnsembleNet):
    """A converted model run as a σN-Ens of M members: input (B, ...) → logits (M, B, K).

    ``backbone`` is the converted model (its norms are σNorm layers of M members; it takes
    (M·B, ...) member-major rows); ``num_members`` is M. Made by :func:`sigma_ensemble`.
    """

    def diversity_loss(self, tau: float, lam: float, layers: str | None = None) -> Tensor:
        """λ·L_div, to add to the task loss (:func:`methods._sigma.diversity.diversity_loss`):
        for each σNorm layer and feature, Σ_m log softmax(sigmoid(γ)/τ)_m. τ sets how many
        members share a feature at equilibrium (small τ: one owns it; large τ: all share), λ how
        hard it is pushed. ``layers``: a regex of the layer names to regularise (default all).
        Returns a scalar float32 tensor."""
        return _diversity_loss(self, tau, lam, layers)

    def diagnostics(self, layers: str | None = None) -> dict[str, Any]:
        """``k_eff`` (on sigmoid(γ)), ``k_eff_scale`` (on |w_m·sigmoid(γ_m)|), ``importance``
        (mean sigmoid(γ)), ``num_features`` and the same per layer (``layers``)."""
        return sharing_diagnostics(self, layers)

    def k_eff(self) -> float:
        """The effective number of members sharing a feature, 1 / Σ_m q_m² with q = s / Σ s,
        s = sigmoid(γ), averaged over every feature of every σNorm layer: 1 = each feature
        owned by one member, M = shared by all."""
        return float(sharing_diagnostics(self)["k_eff"])

    @torch.no_grad()
    def predict_proba(self, x: Tensor) -> Tensor:
        """The ensemble's prediction: the mean of the members' softmax probabilities, (B, K)."""
        return F.softmax(self(x).float(), dim=-1).mean(0)  # (M, B, K) → (B, K)

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer groups as the harness trains σN-Ens: every weight with ``weight_decay``
        but γ, which is a gate, not a weight, and gets none (decay would outweigh L_div)."""
        gammas = [layer.gamma for _, layer in sigma_norm_layers(self) if layer.gamma is not None]
        ids = {id(g) for g in gammas}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        return [
            {"params": rest, "weight_decay": weight_decay},
            {"params": gammas, "weight_decay": 0.0},
        ]


def sigma_ensemble(
    model: nn.Module,
    num_members: int,
    *,
    pretrained: bool = False,
    gamma_init_mean: float = GAMMA_INIT_MEAN,
    gamma_init_std: float = GAMMA_INIT_STD,
    gate_fold: Literal["none", "constant"] = "none",
    member_grad: Literal["member", "mean"] = "member",
    seed: int | None = None,
    inplace: bool = False,
) -> SigmaEnsembleModel:
    """Turn ``model`` into a σN-Ens of ``num_members`` members.

    Every ``nn.BatchNorm1d/2d/3d``, ``nn.LayerNorm`` (timm's subclasses too) and
    ``nn.GroupNorm`` at any depth becomes M member-specific normalizations, each scaled by its
    own sigmoid(γ_m); all other weights stay shared. The member-batch convention is in the
    module docstring: ``net(x)`` with x (B, ...) returns (M, B, K).

    Args:
        model: any module with at least one of those norm layers (a torchvision or timm
            model, a plain ``nn.Sequential``...).
        num_members: M ≥ 1.
        pretrained: ``model`` holds trained weights: copy them into every member so that each
            reproduces the model's logits at step 0 (see the module docstring).
        gamma_init_mean, gamma_init_std: γ ~ N(mean, std²) per member and feature (the
            harness's defaults; a spread > 0 is needed: equal γ gives L_div no gradient).
        gate_fold: ``"constant"`` multiplies every gate by 1/sigmoid(gamma_init_mean), so a γ
            started at 0, where the sigmoid is steep, keeps the model's scale (docs/methods.md).
        member_grad: ``"member"`` (the harness's default) multiplies the gradient of each
            member's own norm parameters by M, so that with the task loss averaged over the M·B
            rows each member's norms train like a single model's; ``"mean"``: plain autograd.
        seed: seed of the γ draw (default: torch's global generator).
        inplace: convert ``model`` itself instead of a copy.

    Raises:
        ValueError: the model has no BatchNorm, LayerNorm or GroupNorm to convert.
    """
    if num_members < 1:
        raise ValueError(f"num_members must be ≥ 1, got {num_members}")
    if member_grad not in ("member", "mean"):
        raise ValueError(f"member_grad must be 'member' or 'mean', got {member_grad!r}")
    hp = SigmaEnsHparams(gamma_init_mean=gamma_init_mean, gate_fold=gate_fold)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    if not inplace:  # the converter works in place: the user's model stays as it was
        model = copy.deepcopy(model)
    net = SigmaEnsembleModel(
        model,
        num_members,
        convert=True,
        variant="sigma",
        gamma_init_mean=gamma_init_mean,
        gamma_init_std=gamma_init_std,
        generator=generator,
        preserve_outputs=pretrained,
        gate_gain=gate_gain(hp),
    )
    layers = sigma_norm_layers(net)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no BatchNorm, LayerNorm or GroupNorm: σN-Ens makes "
            "its members from the normalization layers"
        )
    scale = float(num_members) if member_grad == "member" else 1.0
    for _, layer in layers:
        layer.member_grad_scale = scale
    return net


def diversity_loss(model: nn.Module, tau: float, lam: float, layers: str | None = None) -> Tensor:
    """λ·L_div of any module holding σNorm layers (:meth:`SigmaEnsembleModel.diversity_loss`)."""
    return _diversity_loss(model, tau, lam, layers)


def k_eff(model: nn.Module) -> float:
    """k_eff of any module holding σNorm layers (see :meth:`SigmaEnsembleModel.k_eff`)."""
    return float(sharing_diagnostics(model)["k_eff"])
