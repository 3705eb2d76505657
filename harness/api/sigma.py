"""σN-Ens on your own model, in your own training loop (torch; imported when called)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from methods._sigma_public import SigmaEnsembleModel


def sigma_ensemble(model: nn.Module, num_members: int, **kwargs: Any) -> SigmaEnsembleModel:
    """:func:`methods._sigma_public.sigma_ensemble`: a user's model with BatchNorm, LayerNorm or
    GroupNorm as a σN-Ens of ``num_members`` members (input (B, ...) → logits (M, B, K))."""
    from methods._sigma_public import sigma_ensemble as make

    return make(model, num_members, **kwargs)


def diversity_loss(model: nn.Module, tau: float, lam: float) -> Any:
    """:func:`methods._sigma_public.diversity_loss`: λ·L_div to add to the task loss."""
    from methods._sigma_public import diversity_loss as loss

    return loss(model, tau, lam)


def k_eff(model: nn.Module) -> float:
    """:func:`methods._sigma_public.k_eff`: members sharing a feature (1 = owned, M = shared)."""
    from methods._sigma_public import k_eff as measure

    return measure(model)
