"""σN-Ens's diversity regularizer L_div and the k_eff sharing diagnostics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from methods._sigma.norm import SigmaNorm, sigma_norm_layers
from methods._sigma.norm_base import _grad_scaled


def _gamma_layers(model: nn.Module, layer_pattern: str | None) -> list[tuple[str, SigmaNorm]]:
    layers = sigma_norm_layers(model, layer_pattern, with_gamma=True)
    if not layers:
        raise ValueError(
            f"no σNorm layer with γ matches layer_pattern={layer_pattern!r} "
            "(is the model converted with variant='sigma'?)"
        )
    return layers


def diversity_loss(
    model: nn.Module, tau: float | Tensor, lam: float | Tensor, layer_pattern: str | None = None
) -> Tensor:
    """σN-Ens's diversity regularizer (Suteu & Serban 2026).

    For each selected layer ℓ and feature i, with s_m = sigmoid(γ_{m,ℓ,i}) and
    p = softmax(s / τ) over the M members:

        L_div = λ · Σ_ℓ Σ_i Σ_m log p_m

    Add it to the task loss and minimise. Σ_m log p_m is largest (= -M log M) for uniform p, so
    minimising spreads the members' importances apart; since s ∈ (0, 1) the logit gap is at most
    1/τ, hence τ sets the equilibrium (small τ: one member owns a feature, k_eff → 1; large τ:
    weak push, k_eff → M/2 under L_div alone) and λ only the strength.

    λ keeps the paper's meaning (L_task + λ·L_div) whatever the layers' gradient scale: the
    gradient of L_div on γ gets the same ``member_grad_scale`` as the task loss's (M under
    ``member_grad: member``), so the objective γ follows is M·(L_task + λ·L_div), not
    M·L_task + λ·L_div (which made λ act as λ/M). The value returned is unchanged.

    Args:
        model: A converted model (or any module containing σNorm layers).
        tau: Softmax temperature τ > 0 (a float, or a 0-dim tensor on the model's device,
            which is not checked: reading it would synchronise with the device).
        lam: Weight λ (float or 0-dim tensor).
        layer_pattern: Regex searched in qualified module names; None = all σNorm layers.

    Returns:
        Scalar float32 tensor, differentiable w.r.t. every selected γ.
    """
    if not isinstance(tau, Tensor) and tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    # Every layer's features at once: the softmax is over members, per feature, so concatenating
    # the layers' features changes no term, and one pass launches a few kernels where a loop over
    # the layers launched ~10 per layer (a GPU step is launch-bound at CIFAR sizes). The task
    # loss reaches γ through effective_affine's gradient scale; L_div gets the same scale so
    # that λ weighs L_div against L_task as written (not as λ/scale).
    layers = [layer for _, layer in _gamma_layers(model, layer_pattern)]
    scales = {layer.member_grad_scale for layer in layers}
    if len(scales) == 1:  # the ensemble's case: one scale, applied once to the whole (M, ΣF)
        # gradient (the per-layer scaling was a view forward and a multiply backward per layer)
        g = _GammaConcat.apply(scales.pop(), *(layer.gamma.float() for layer in layers))
    else:
        g = torch.cat(
            [_grad_scaled(la.gamma.float(), la.member_grad_scale).flatten(1) for la in layers],
            dim=1,
        )  # (M, ΣF)
    logp = torch.log_softmax(torch.sigmoid(g) / tau, dim=0)  # (M, ΣF) over members
    return lam * logp.sum()


class _GammaConcat(torch.autograd.Function):
    """The layers' γ (each (M, *F_ℓ)) side by side as one (M, ΣF) tensor; backward: the gradient
    × k (the layers' ``member_grad_scale``), split back in one operator.

    ``torch.cat`` would do the forward, but its backward slices once per input: 20 operators a
    training step on ResNet-18, each a dispatch on a launch-bound GPU step
    (``benchmarks/op_count.py``), where ``split_with_sizes`` is one. Same values, bit for bit.
    """

    @staticmethod
    def forward(k: float, *gammas: Tensor) -> Tensor:
        return torch.cat([g.flatten(1) for g in gammas], dim=1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.k = inputs[0]
        ctx.shapes = [g.shape for g in inputs[1:]]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        if ctx.k != 1.0:
            grad = grad * ctx.k
        widths = [s[1:].numel() for s in ctx.shapes]
        parts = grad.split_with_sizes(widths, dim=1)
        return None, *(p if p.dim() == len(s) else p.reshape(s) for p, s in zip(parts, ctx.shapes))


@torch.no_grad()
def sharing_diagnostics(model: nn.Module, layer_pattern: str | None = None) -> dict[str, Any]:
    """How many members share each feature, per σNorm layer and overall.

    With s = sigmoid(γ) (M, F) and q = s / Σ_m s, the effective number of members sharing
    feature i is k_eff,i = 1 / Σ_m q_{m,i}² (1 = owned by one member, M = shared by all).

    Args:
        model: A converted model with ``variant="sigma"`` σNorm layers.
        layer_pattern: Regex searched in qualified module names; None = all.

    ``k_eff_scale`` is the same measure on the effective member scale |w_m·sigmoid(γ_m)|: the
    member affine w_m can undo (or amplify) the gate, so k_eff on sigmoid(γ) alone can claim
    sharing the features do not have.

    Returns:
        ``{"k_eff": float, "k_eff_scale": float, "importance": float, "num_features": int,
        "layers": {name: {same keys}}}`` where a layer's values are means over its features (its
        importance the mean of sigmoid(γ)) and the overall values are feature-weighted means
        over the selected layers. Plain Python numbers (JSON-serialisable).
    """
    layers = _gamma_layers(model, layer_pattern)
    sums, counts = [], []
    for _, layer in layers:
        s = torch.sigmoid(layer.gamma.float().flatten(1))  # (M, F)
        scale = (layer.weight.float().flatten(1) * s).abs()  # (M, F) |w_m·sigmoid(γ_m)|
        sums.append(torch.stack([_k_eff(s).sum(), _k_eff(scale).sum(), s.mean(0).sum()]))
        counts.append(s.shape[1])
    rows = torch.stack(sums).cpu().tolist()  # (L, 3); one device sync for all layers
    total = sum(counts)
    per_layer = {
        name: {
            "k_eff": r[0] / c,
            "k_eff_scale": r[1] / c,
            "importance": r[2] / c,
            "num_features": c,
        }
        for (name, _), r, c in zip(layers, rows, counts)
    }
    return {
        "k_eff": sum(r[0] for r in rows) / total,
        "k_eff_scale": sum(r[1] for r in rows) / total,
        "importance": sum(r[2] for r in rows) / total,
        "num_features": total,
        "layers": per_layer,
    }


def _k_eff(s: Tensor) -> Tensor:
    """1 / Σ_m q_m² with q = s / Σ_m s, per feature: (M, F) non-negative → (F,)."""
    q = s / s.sum(0, keepdim=True).clamp_min(1e-12)  # (M, F)
    return 1.0 / q.square().sum(0)


def gradient_ratio(
    model: nn.Module,
    task_loss: Tensor,
    tau: float,
    lam: float,
    layer_pattern: str | None = None,
) -> dict[str, Any]:
    """‖∇γ L_div‖ / ‖∇γ L_task‖ per regularized layer and overall: does λ matter at all?

    A ratio ≪ 1 means the regularizer exerts no force next to the task loss (τ cannot set the
    equilibrium), ≫ 1 that it dominates. Both gradients are taken w.r.t. the same γ tensors;
    ``task_loss`` must come from a forward pass of ``model`` with autograd on.

    Args:
        model: A converted model with ``variant="sigma"`` σNorm layers.
        task_loss: Scalar task loss of one batch (graph retained by the caller's forward).
        tau, lam: The regularizer's current τ and λ (λ = 0 gives ratio 0).
        layer_pattern: Regex of regularized layers; None = all.

    Returns:
        ``{"grad_ratio": float, "layers": {name: {"grad_ratio": float}}}`` (plain numbers).
    """
    layers = _gamma_layers(model, layer_pattern)
    gammas = [layer.gamma for _, layer in layers]
    g_task = torch.autograd.grad(task_loss, gammas, allow_unused=True)
    g_div = torch.autograd.grad(diversity_loss(model, tau, lam, layer_pattern), gammas)
    sq = torch.stack(
        [torch.stack([d.float().square().sum(), _sq(t, d)]) for t, d in zip(g_task, g_div)]
    ).cpu()  # (L, 2): squared norms of ∇L_div and ∇L_task; one device sync
    per_layer = {
        name: {"grad_ratio": _ratio(float(row[0]), float(row[1]))}
        for (name, _), row in zip(layers, sq)
    }
    return {"grad_ratio": _ratio(float(sq[:, 0].sum()), float(sq[:, 1].sum())), "layers": per_layer}


def _sq(g: Tensor | None, like: Tensor) -> Tensor:
    return like.new_zeros(()) if g is None else g.float().square().sum()


def _ratio(div_sq: float, task_sq: float) -> float:
    return (div_sq / task_sq) ** 0.5 if task_sq > 0 else float("inf") if div_sq else 0.0


def iter_gamma_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The γ parameters of all σNorm layers (e.g. for a separate optimizer group)."""
    for _, layer in sigma_norm_layers(model, with_gamma=True):
        yield layer.gamma
