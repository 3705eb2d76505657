"""σN-Ens's harness choices where the paper is silent, and FiLM as its sibling: γ without weight
decay, near-identity γ from a generator seeded by the cell, per-member gradient scale, the
gradient-ratio and effective-scale diagnostics, and the WRN-28-8 parameter count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.registry import METHODS
from methods._base import BuildContext
from methods._sigma.diversity import gradient_ratio
from methods._sigma.norm_ensemble import NormEnsemble
from methods.film_ensemble import FiLMEnsemble
from methods.sigma_ens import SigmaEnsemble
from tests.sigma_helpers import _single_thread  # noqa: F401  (autouse fixture)


def _build(method: str, seed: int | None = 0, backbone: str = "digits_cnn", **hp):
    spec = METHODS.get(method)
    ctx = BuildContext(backbone, (1, 8, 8), 8, 4, {"width": 8}, None, seed=seed)
    return spec.build(ctx, spec.make_hparams(hp))


def _gammas(model) -> torch.Tensor:
    return torch.cat([layer.gamma.detach().flatten() for _, layer in model.norm_layers()])


def test_sigma_and_film_are_siblings_of_one_base():
    assert issubclass(SigmaEnsemble, NormEnsemble) and issubclass(FiLMEnsemble, NormEnsemble)
    assert not issubclass(FiLMEnsemble, SigmaEnsemble)
    film = _build("film_ensemble")
    assert film.regularizer() is None and film.diagnostics() == {}
    assert all(layer.gamma is None for _, layer in film.norm_layers())


def test_default_gamma_is_near_identity_and_seeded_by_the_cell():
    model = _build("sigma_ens", seed=3)
    s = torch.sigmoid(_gammas(model))
    assert s.mean().item() == pytest.approx(0.953, abs=0.003)
    assert 0.002 < s.std().item() < 0.01  # symmetry-breaking noise, ~0.5% of the scale
    torch.manual_seed(12345)  # the global generator must not matter
    again = _build("sigma_ens", seed=3)
    assert torch.equal(_gammas(again), _gammas(model))
    assert not torch.equal(_gammas(_build("sigma_ens", seed=4)), _gammas(model))
    old = _gammas(_build("sigma_ens", gamma_init_mean=0.0, gamma_init_std=1.0))
    assert abs(old.mean().item()) < 0.2 and old.std().item() == pytest.approx(1.0, abs=0.15)


def test_folded_gate_starts_where_the_sigmoid_is_steep_at_the_backbones_scale():
    """gate_fold: constant with γ ~ N(0, 0.1²): sigmoid'(γ) ≈ 0.25 (0.045 at γ = 3) and the gate
    times c = 1/sigmoid(0) = 2 is 1 ± 5%, so the member affine starts as the backbone's."""
    model = _build("sigma_ens", seed=5, gate_fold="constant", gamma_init_mean=0.0)
    g = _gammas(model)
    assert abs(g.mean().item()) < 0.03 and g.std().item() == pytest.approx(0.1, abs=0.02)
    layers = [layer for _, layer in model.norm_layers()]
    assert all(layer.gate_gain == pytest.approx(2.0) for layer in layers)
    gate = torch.cat([(layer.gate_gain * layer.importance()).flatten() for layer in layers])
    assert gate.mean().item() == pytest.approx(1.0, abs=0.01) and gate.std().item() < 0.07
    slope = torch.sigmoid(g) * (1 - torch.sigmoid(g))
    assert slope.min().item() > 0.24  # the steep part of the sigmoid
    unfolded = _build("sigma_ens", seed=5, gamma_init_mean=0.0)
    assert all(layer.gate_gain == 1.0 for _, layer in unfolded.norm_layers())
    # the fold's constant follows γ0: c·sigmoid(γ0) = 1 wherever the gate starts
    at3 = _build("sigma_ens", gate_fold="constant", gamma_init_mean=3.0).norm_layers()[0][1]
    assert at3.gate_gain * torch.sigmoid(torch.tensor(3.0)).item() == pytest.approx(1.0)


@pytest.mark.parametrize("std", [0.0, 0.1])
def test_folded_gate_keeps_the_backbones_logits_at_init(std):
    """Same weights: every member's logits equal the plain backbone's when all γ = γ0, and stay
    within a few percent of their scale under the default 0.1 spread (the unfolded gate at
    γ0 = 0 halves every norm's output: 1/8 through digits_cnn's three). Eval mode with the
    fresh running statistics, and the head's bias zeroed so that the logits show the features'
    scale."""
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    ctx = BuildContext("digits_cnn", (1, 8, 8), 8, 4, {"width": 8}, None, seed=0)
    torch.manual_seed(1)
    plain = _no_head_bias(ctx.build_backbone().eval())
    torch.manual_seed(1)  # the same backbone weights inside the ensemble
    hp = {"gate_fold": "constant", "gamma_init_mean": 0.0, "gamma_init_std": std}
    model = _no_head_bias(_build("sigma_ens", **hp).eval())
    with torch.no_grad():
        ref, out = plain(x), model(x)  # (B, K), (M, B, K)
    if std == 0.0:
        torch.testing.assert_close(out, ref.expand_as(out), rtol=1e-5, atol=1e-5)
    else:
        ratio = out.norm(dim=(1, 2)) / ref.norm()  # (M,) logit scale of each member
        assert ((ratio - 1).abs() < 0.1).all(), ratio
    torch.manual_seed(1)
    halved = _no_head_bias(_build("sigma_ens", gamma_init_mean=0.0, gamma_init_std=0.0).eval())
    with torch.no_grad():
        ratio = halved(x).norm(dim=(1, 2)) / ref.norm()
    torch.testing.assert_close(ratio, torch.full((4,), 0.125), rtol=1e-4, atol=0)


def _no_head_bias(model: torch.nn.Module) -> torch.nn.Module:
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.bias.zero_()
    return model


def test_film_affine_draw_is_seeded_by_the_cell():
    a, b = _build("film_ensemble", seed=1), _build("film_ensemble", seed=1)
    wa = torch.cat([layer.weight.detach().flatten() for _, layer in a.norm_layers()])
    wb = torch.cat([layer.weight.detach().flatten() for _, layer in b.norm_layers()])
    assert torch.equal(wa, wb) and wa.std() > 0.3  # xavier over (M=4, C=8): std 0.41


def test_gamma_gets_no_weight_decay_unless_asked():
    model = _build("sigma_ens")
    shared, affine, gamma = model.param_groups(5e-4)
    layers = [layer for _, layer in model.norm_layers()]
    assert [id(p) for p in gamma["params"]] == [id(layer.gamma) for layer in layers]
    assert {id(p) for p in affine["params"]} == {
        id(p) for layer in layers for p in (layer.weight, layer.bias)
    }
    every = [id(p) for g in (shared, affine, gamma) for p in g["params"]]
    assert sorted(every) == sorted(id(p) for p in model.parameters())  # a partition
    assert (shared["weight_decay"], affine["weight_decay"], gamma["weight_decay"]) == (
        5e-4,
        5e-4,
        0.0,
    )
    old = _build("sigma_ens", gamma_weight_decay=None, member_weight_decay=0.0)
    assert [g["weight_decay"] for g in old.param_groups(5e-4)] == [5e-4, 0.0, 5e-4]


@pytest.mark.parametrize("method", ["sigma_ens", "film_ensemble"])
def test_member_parameters_get_their_members_full_gradient(method):
    """member_grad: member multiplies the per-member gradient by M (forward unchanged);
    shared weights get the same gradient either way."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 8, (16,))
    grads, outs = {}, {}
    for mode in ("member", "mean"):
        torch.manual_seed(1)  # same backbone weights (drawn from torch's generator, as in a cell)
        model = _build(method, member_grad=mode)
        out = model(x)
        F.cross_entropy(out.flatten(0, 1), y.repeat(4)).backward()
        outs[mode] = out.detach()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert torch.equal(outs["member"], outs["mean"])
    for name, g in grads["mean"].items():
        per_member = name.rsplit(".", 1)[-1] in ("weight", "bias", "gamma") and (
            g.dim() == 2 and g.shape[0] == 4 and "head" not in name
        )
        expected = g * 4 if per_member else g
        torch.testing.assert_close(grads["member"][name], expected, rtol=1e-5, atol=1e-7)


def test_gamma_gradient_ratio_does_not_depend_on_member_grad():
    """λ has the paper's meaning (L_task + λ·L_div) under either gradient scale: the ratio
    ‖∇γ L_div‖ / ‖∇γ L_task‖ is the same for ``member`` and ``mean`` at equal λ, and so is the
    direction of the total γ gradient (``member`` only multiplies it by M)."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 8, (16,))
    ratios, grads = {}, {}
    for mode in ("member", "mean"):
        torch.manual_seed(1)
        model = _build("sigma_ens", member_grad=mode, tau=0.5, lam=0.1)
        model.train()
        task = F.cross_entropy(model(x).flatten(0, 1), y.repeat(4))
        ratios[mode] = gradient_ratio(model.net, task, 0.5, 0.1)["grad_ratio"]
        task = F.cross_entropy(model(x).flatten(0, 1), y.repeat(4))  # a fresh graph
        (task + model.regularizer()).backward()
        grads[mode] = torch.cat([layer.gamma.grad.flatten() for _, layer in model.norm_layers()])
    assert ratios["mean"] > 0.05  # L_div exerts a real force here, so the check has teeth
    assert ratios["member"] == pytest.approx(ratios["mean"], rel=1e-5)
    torch.testing.assert_close(grads["member"], 4 * grads["mean"], rtol=1e-5, atol=1e-8)


def test_diagnostics_report_gradient_ratio_and_effective_scale_without_side_effects():
    model = _build("sigma_ens", tau=0.5, lam=0.1)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 8, (16,))
    model.train()
    model.training_outputs(x, y)  # the batch the epoch ended on
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    diag = model.diagnostics()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng) and not model.training
    assert diag["grad_ratio"] > 0 and 1 <= diag["k_eff_scale"] <= 4
    layer = next(iter(diag["layers"].values()))
    assert {"k_eff", "k_eff_scale", "grad_ratio", "importance"} <= set(layer)
    # the ratio is linear in λ: ‖∇ λ·L‖ = λ ‖∇ L‖
    model.hp = type(model.hp)(**{**vars(model.hp), "lam": 0.2})
    assert model.diagnostics()["grad_ratio"] == pytest.approx(2 * diag["grad_ratio"], rel=1e-4)


def test_effective_scale_k_eff_sees_the_member_affine_undo_the_gate():
    model = _build("sigma_ens", gamma_init_mean=0.0, gamma_init_std=2.0)
    with torch.no_grad():
        for _, layer in model.norm_layers():  # w_m = 1/sigmoid(γ_m): every member's scale is 1
            layer.weight.copy_(1 / torch.sigmoid(layer.gamma))
    diag = model.diagnostics()
    assert diag["k_eff"] < 3.5  # the gates alone look diverse...
    assert diag["k_eff_scale"] == pytest.approx(4.0, abs=1e-4)  # ...the members are not


def test_wrn28_8_sigma_ens_has_the_papers_parameter_count():
    """23,480,932 at M=4, K=100 (Suteu & Serban 2026): WRN-28-8 (23,409,092, conv bias as in
    torch-uncertainty) with each of its 25 BatchNorms' 2·C affine replaced by M·3·C."""
    spec = METHODS.get("sigma_ens")
    ctx = BuildContext("wrn28_8", (3, 32, 32), 100, 4, seed=0)
    model = spec.build(ctx, spec.make_hparams({}))
    assert sum(p.numel() for p in model.parameters()) == 23_480_932
    plain = ctx.build_backbone()
    assert sum(p.numel() for p in plain.parameters()) == 23_409_092
