"""σN-Ens's diversity regularizer L_div and the k_eff sharing diagnostics (DESIGN.md §2)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from methods.sigma_norm import SigmaNorm, sigma_norm_layers


def _gamma_layers(model: nn.Module, layer_pattern: str | None) -> list[tuple[str, SigmaNorm]]:
    layers = sigma_norm_layers(model, layer_pattern, with_gamma=True)
    if not layers:
        raise ValueError(
            f"no σNorm layer with γ matches layer_pattern={layer_pattern!r} "
            "(is the model converted with variant='sigma'?)"
        )
    return layers


def diversity_loss(
    model: nn.Module, tau: float, lam: float, layer_pattern: str | None = None
) -> Tensor:
    """σN-Ens's diversity regularizer (Suteu & Serban 2026; DESIGN.md §2).

    For each selected layer ℓ and feature i, with s_m = sigmoid(γ_{m,ℓ,i}) and
    p = softmax(s / τ) over the M members:

        L_div = λ · Σ_ℓ Σ_i Σ_m log p_m

    Add it to the task loss and minimise. Σ_m log p_m is largest (= -M log M) for uniform p, so
    minimising spreads the members' importances apart; since s ∈ (0, 1) the logit gap is at most
    1/τ, hence τ sets the equilibrium (small τ: one member owns a feature, k_eff → 1; large τ:
    weak push, k_eff → M/2 under L_div alone) and λ only the strength.

    Args:
        model: A converted model (or any module containing σNorm layers).
        tau: Softmax temperature τ > 0.
        lam: Weight λ.
        layer_pattern: Regex searched in qualified module names; None = all σNorm layers.

    Returns:
        Scalar float32 tensor, differentiable w.r.t. every selected γ.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    total = None
    for _, layer in _gamma_layers(model, layer_pattern):
        g = layer.gamma.float().flatten(1)  # (M, F)
        logp = torch.log_softmax(torch.sigmoid(g) / tau, dim=0)  # (M, F) over members
        term = logp.sum()
        total = term if total is None else total + term
    return lam * total


@torch.no_grad()
def sharing_diagnostics(model: nn.Module, layer_pattern: str | None = None) -> dict[str, Any]:
    """How many members share each feature, per σNorm layer and overall (DESIGN.md §2).

    With s = sigmoid(γ) (M, F) and q = s / Σ_m s, the effective number of members sharing
    feature i is k_eff,i = 1 / Σ_m q_{m,i}² (1 = owned by one member, M = shared by all).

    Args:
        model: A converted model with ``variant="sigma"`` σNorm layers.
        layer_pattern: Regex searched in qualified module names; None = all.

    Returns:
        ``{"k_eff": float, "importance": float, "num_features": int,
        "layers": {name: {"k_eff": float, "importance": float, "num_features": int}}}`` where a
        layer's k_eff is the mean over its features, its importance the mean of sigmoid(γ), and
        the overall values are feature-weighted means over the selected layers. Plain Python
        numbers (JSON-serialisable).
    """
    layers = _gamma_layers(model, layer_pattern)
    keff_sums, imp_sums, counts = [], [], []
    for _, layer in layers:
        s = torch.sigmoid(layer.gamma.float().flatten(1))  # (M, F)
        q = s / s.sum(0, keepdim=True)  # (M, F)
        k = 1.0 / q.square().sum(0)  # (F,)
        keff_sums.append(k.sum())
        imp_sums.append(s.mean(0).sum())
        counts.append(s.shape[1])
    keff = torch.stack(keff_sums).cpu().tolist()  # one device sync for all layers
    imp = torch.stack(imp_sums).cpu().tolist()
    total = sum(counts)
    per_layer = {
        name: {"k_eff": ks / c, "importance": im / c, "num_features": c}
        for (name, _), ks, im, c in zip(layers, keff, imp, counts)
    }
    return {
        "k_eff": sum(keff) / total,
        "importance": sum(imp) / total,
        "num_features": total,
        "layers": per_layer,
    }


def iter_gamma_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The γ parameters of all σNorm layers (e.g. for a separate optimizer group)."""
    for _, layer in sigma_norm_layers(model, with_gamma=True):
        yield layer.gamma
