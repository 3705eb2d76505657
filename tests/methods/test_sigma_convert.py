"""σN-Ens converter coverage, pretrained conversion, the regularizer and k_eff diagnostics."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from methods._sigma.convert import SigmaEnsembleNet, convert_to_ensemble
from methods._sigma.diversity import diversity_loss, iter_gamma_parameters, sharing_diagnostics
from methods._sigma.norm import (
    SigmaBatchNorm1d,
    SigmaBatchNorm2d,
    SigmaLayerNorm,
    sigma_norm_layers,
)
from methods._triton import kernels
from tests.sigma_helpers import (
    _count_plain_norms,
    _gen,
    _single_thread,  # noqa: F401  (autouse fixture)
    _small_cnn,
    _train_briefly,
)


def test_wrapper_repeats_member_major():
    net = SigmaEnsembleNet(nn.Flatten(), num_members=3)
    x = torch.randn(2, 3, 4, 4, generator=_gen()).contiguous(memory_format=torch.channels_last)
    out = net(x)
    assert out.shape == (3, 2, 48)
    for m in range(3):
        torch.testing.assert_close(out[m], x.flatten(1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="do not have num_members=3"):
        SigmaEnsembleNet(convert_to_ensemble(_small_cnn(), 2), num_members=3)


def test_state_dict_round_trip():
    model = SigmaEnsembleNet(_small_cnn(), 2, convert=True, generator=_gen(0))
    _train_briefly_ens(model)
    fresh = SigmaEnsembleNet(_small_cnn(), 2, convert=True, generator=_gen(99))
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(3, 3, 6, 6, generator=_gen(4))
    model.eval(), fresh.eval()
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    model.train(), fresh.train()
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    keys = set(model.state_dict())
    assert "backbone.1.running_mean" in keys and "backbone.1.gamma" in keys
    assert model.state_dict()["backbone.1.running_mean"].shape == (2, 8)


def _train_briefly_ens(
    model: SigmaEnsembleNet, steps: int = 3, tau: float = 0.1, lam: float = 1e-3
) -> SigmaEnsembleNet:
    g = _gen(11)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for _ in range(steps):
        x = torch.randn(4, 3, 6, 6, generator=g)
        y = torch.randint(0, 5, (4,), generator=g)
        logits = model(x)  # (M, B, K)
        m_count = logits.shape[0]
        loss = F.cross_entropy(logits.flatten(0, 1), y.repeat(m_count))
        loss = loss + diversity_loss(model, tau=tau, lam=lam)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_every_parameter_gets_a_gradient_and_members_separate():
    torch.manual_seed(0)
    model = SigmaEnsembleNet(_small_cnn(), 3, convert=True, generator=_gen(), preserve_outputs=True)
    x = torch.randn(4, 3, 6, 6, generator=_gen(1))
    model.eval()
    out0 = model(x)  # members identical at step 0 (preserve_outputs)
    torch.testing.assert_close(out0[1], out0[0], rtol=1e-5, atol=1e-5)
    model.train()
    logits = model(x)
    y = torch.tensor([0, 1, 2, 3])
    loss = F.cross_entropy(logits.flatten(0, 1), y.repeat(3)) + diversity_loss(model, 0.1, 1e-2)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    _train_briefly_ens(model, steps=5, lam=0.1)
    model.eval()
    out = model(x)  # (M, B, K)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert (out[a] - out[b]).abs().max() > 1e-2


def _tu_models():
    tu = pytest.importorskip("torch_uncertainty.models.classification")
    return tu


@pytest.mark.parametrize(
    "name", ["tu_resnet18", "tu_resnet50", "tu_wrn28x10", "tv_resnet18", "timm_vit"]
)
def test_converter_covers_backbones(name):
    torch.manual_seed(0)
    batch = 1 if name == "tu_wrn28x10" else 2
    if name.startswith("tu_"):
        tu = _tu_models()
        if name == "tu_wrn28x10":
            model = tu.wideresnet28x10(in_channels=3, num_classes=10, style="cifar")
        else:
            arch = 18 if name == "tu_resnet18" else 50
            model = tu.resnet(in_channels=3, num_classes=10, arch=arch, style="cifar")
    elif name == "tv_resnet18":
        tvm = pytest.importorskip("torchvision.models")
        model = tvm.resnet18(num_classes=10)
    else:
        timm = pytest.importorskip("timm")
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, num_classes=10
        )
    model.eval()
    n_norms = _count_plain_norms(model)
    assert n_norms > 0
    ens = SigmaEnsembleNet(
        model, 2, convert=True, generator=_gen(), preserve_outputs=True
    ).eval()  # converts in place
    assert _count_plain_norms(ens) == 0
    layers = sigma_norm_layers(ens)
    assert len(layers) == n_norms
    if name == "timm_vit":
        assert all(isinstance(m, SigmaLayerNorm) for _, m in layers)
    x = torch.randn(batch, 3, 32, 32, generator=_gen(1))
    with torch.no_grad():
        out = ens(x)
    assert out.shape == (2, batch, 10)
    assert torch.isfinite(out).all()
    diag = sharing_diagnostics(ens)
    assert 1.0 <= diag["k_eff"] <= 2.0
    assert set(diag["layers"]) == {n for n, _ in layers}


def test_timm_norm_act_keeps_its_activation():
    timm = pytest.importorskip("timm")
    norm = timm.layers.BatchNormAct2d(4, act_layer=nn.ReLU).eval()
    conv = convert_to_ensemble(norm, 2, preserve_outputs=True, generator=_gen())
    assert isinstance(conv, nn.Sequential) and isinstance(conv[0], SigmaBatchNorm2d)
    conv.eval()
    x = torch.randn(3, 4, 3, 3, generator=_gen(1))
    out = conv(x.repeat(2, 1, 1, 1)).view(2, 3, 4, 3, 3)
    assert out.min() >= 0
    torch.testing.assert_close(out[1], norm(x), rtol=1e-5, atol=1e-6)


def test_converter_copies_and_shares_norms():
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.running_mean.copy_(torch.arange(4.0))
        bn.weight.fill_(2.0)
    model = nn.Sequential(bn, nn.ReLU(), bn)  # one norm used twice stays one σNorm
    conv = convert_to_ensemble(model, 3, generator=_gen())
    assert conv[0] is conv[2] and isinstance(conv[0], SigmaBatchNorm2d)
    assert isinstance(model[0], nn.BatchNorm2d)  # not in place by default
    torch.testing.assert_close(conv[0].running_mean, torch.arange(4.0).expand(3, 4))
    torch.testing.assert_close(conv[0].weight, torch.full((3, 4), 2.0))  # no compensation
    g1 = convert_to_ensemble(model, 3, generator=_gen(5))[0].gamma
    g2 = convert_to_ensemble(model, 3, generator=_gen(5))[0].gamma
    torch.testing.assert_close(g1, g2, rtol=0, atol=0)
    assert g1.std() > 0.3  # random per-member init, not equal members


# --------------------------------------------------------------------------------------------
# Pretrained conversion
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gate_gain", [1.0, 2.0])
def test_preserve_outputs_small_cnn_eval_and_train(gate_gain):
    """Exact conversion, also with a folded gate (c·sigmoid(γ_m) is compensated as a whole)."""
    original = _train_briefly(_small_cnn(), (3, 6, 6))
    m_count = 4
    converted = convert_to_ensemble(
        original, m_count, generator=_gen(), preserve_outputs=True, gate_gain=gate_gain
    )
    assert all(mod.gate_gain == gate_gain for _, mod in sigma_norm_layers(converted))
    ens = SigmaEnsembleNet(converted, m_count)
    x = torch.randn(5, 3, 6, 6, generator=_gen(8))
    original.eval(), ens.eval()
    with torch.no_grad():
        want, got = original(x), ens(x)
    for m in range(m_count):
        torch.testing.assert_close(got[m], want, rtol=0, atol=1e-5)
    # train mode: each member's batch statistics equal the original's on the same batch
    original.train(), ens.train()
    with torch.no_grad():
        want, got = original(x), ens(x)
    for m in range(m_count):
        torch.testing.assert_close(got[m], want, rtol=0, atol=1e-5)
    for (_, sig), bn in zip(
        [(n, mod) for n, mod in sigma_norm_layers(ens) if hasattr(mod, "running_mean")],
        [mod for mod in original.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)],
    ):
        torch.testing.assert_close(sig.running_mean, bn.running_mean.expand_as(sig.running_mean))
        torch.testing.assert_close(sig.running_var, bn.running_var.expand_as(sig.running_var))
    # without compensation the members are scaled by their own sigmoid(γ_m) and differ
    plain = SigmaEnsembleNet(convert_to_ensemble(original, m_count, generator=_gen()), m_count)
    plain.eval(), original.eval()
    with torch.no_grad():
        assert (plain(x)[0] - original(x)).abs().max() > 1e-2


def test_preserve_outputs_trained_tu_resnet18():
    tu = _tu_models()
    torch.manual_seed(0)
    original = tu.resnet(in_channels=3, num_classes=10, arch=18, style="cifar")
    _train_briefly(original, (3, 32, 32), steps=2, bs=4)
    original.eval()
    ens = SigmaEnsembleNet(
        convert_to_ensemble(original, 2, generator=_gen(), preserve_outputs=True), 2
    ).eval()
    x = torch.randn(2, 3, 32, 32, generator=_gen(3))
    with torch.no_grad():
        want, got = original(x), ens(x)
    assert want.abs().max() > 0.1
    for m in range(2):
        torch.testing.assert_close(got[m], want, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Diversity regularizer and diagnostics
# --------------------------------------------------------------------------------------------


def test_diversity_loss_hand_computation():
    layer = SigmaBatchNorm1d(2, 2)
    with torch.no_grad():
        layer.gamma.copy_(torch.tensor([[0.0, 2.0], [1.0, -1.0]]))  # (M=2, C=2)
    tau, lam = 0.5, 0.3
    # feature 0: s = (σ(0), σ(1)); feature 1: s = (σ(2), σ(-1)); p = softmax(s/τ) over members
    expected = 0.0
    for g_a, g_b in [(0.0, 1.0), (2.0, -1.0)]:
        s_a, s_b = 1 / (1 + math.exp(-g_a)), 1 / (1 + math.exp(-g_b))
        z = math.exp(s_a / tau) + math.exp(s_b / tau)
        expected += math.log(math.exp(s_a / tau) / z) + math.log(math.exp(s_b / tau) / z)
    expected *= lam
    got = diversity_loss(layer, tau=tau, lam=lam)
    assert got.shape == ()
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # a model with two layers: the sum; the pattern selects layers by qualified name
    model = nn.ModuleDict({"enc": layer, "head": copy.deepcopy(layer)})
    assert diversity_loss(model, tau, lam).item() == pytest.approx(2 * expected, rel=1e-6)
    assert diversity_loss(model, tau, lam, layer_pattern="^enc").item() == pytest.approx(
        expected, rel=1e-6
    )
    with pytest.raises(ValueError, match="no σNorm layer with γ matches"):
        diversity_loss(model, tau, lam, layer_pattern="nothing")
    with pytest.raises(ValueError, match="tau must be > 0"):
        diversity_loss(model, 0.0, lam)


def test_diversity_loss_gradient_step_spreads_importances():
    layer = SigmaBatchNorm1d(16, 4, generator=_gen(0), gamma_init_std=0.5)
    spread0 = torch.sigmoid(layer.gamma).std(0).mean().item()
    loss = diversity_loss(layer, tau=0.5, lam=1.0)
    loss.backward()
    with torch.no_grad():
        layer.gamma -= 1.0 * layer.gamma.grad
    spread1 = torch.sigmoid(layer.gamma).std(0).mean().item()
    assert spread1 > spread0 * 1.05
    assert diversity_loss(layer, tau=0.5, lam=1.0).item() < loss.item()
    # equal γ across members: zero gradient up to rounding, identical for every member, so the
    # members never separate (why γ needs a random init)
    flat = SigmaBatchNorm1d(4, 3, gamma_init_std=0.0)
    diversity_loss(flat, tau=0.5, lam=1.0).backward()
    assert flat.gamma.grad.abs().max() < 1e-6
    torch.testing.assert_close(flat.gamma.grad, flat.gamma.grad[:1].expand(3, 4), rtol=0, atol=0)


def test_sharing_diagnostics_values():
    layer = SigmaBatchNorm1d(2, 2)
    big = 30.0  # sigmoid(±30) is 1 / 0 to float precision
    with torch.no_grad():
        layer.gamma.copy_(torch.tensor([[big, 0.0], [-big, 0.0]]))
    other = SigmaLayerNorm(4, 2, gamma_init_std=0.0)  # all shared: k_eff = M = 2
    model = nn.ModuleDict({"a": layer, "b": other})
    d = sharing_diagnostics(model)
    # layer a: feature 0 owned by member 0 (k=1), feature 1 shared (k=2) → 1.5
    assert d["layers"]["a"]["k_eff"] == pytest.approx(1.5, abs=1e-6)
    assert d["layers"]["a"]["importance"] == pytest.approx(0.5, abs=1e-6)
    assert d["layers"]["b"]["k_eff"] == pytest.approx(2.0, abs=1e-6)
    assert d["layers"]["b"]["num_features"] == 4
    assert d["k_eff"] == pytest.approx((1.5 * 2 + 2.0 * 4) / 6, abs=1e-6)  # feature-weighted
    assert d["importance"] == pytest.approx(0.5, abs=1e-6)
    assert isinstance(d["k_eff"], float) and isinstance(d["layers"]["a"]["k_eff"], float)
    assert list(sharing_diagnostics(model, layer_pattern="b")["layers"]) == ["b"]
    assert len(list(iter_gamma_parameters(model))) == 2


def _keff_after_ldiv(tau: float, steps: int = 500) -> float:
    layer = SigmaBatchNorm1d(256, 4, generator=_gen(0), gamma_init_std=1.0)
    opt = torch.optim.Adam([layer.gamma], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        diversity_loss(layer, tau=tau, lam=1.0).backward()
        opt.step()
    return sharing_diagnostics(layer)["k_eff"]


def test_tau_sets_the_sharing_equilibrium():
    """γ alone under L_div, M=4, C=256, Adam lr 0.05, 500 steps (measured, seed 0 / seeds 0-3):
    τ=0.02: 1.03 (1.02-1.04); 0.05: 1.19 (1.17-1.20); 0.1: 1.40 (1.39-1.43);
    0.5: 1.87 (1.81-1.89); 3: 2.01 (1.93-2.02). The paper quotes ≈1.0 / 1.55 / 1.9 / 2.0.
    """
    taus = [0.02, 0.05, 0.1, 0.5, 3.0]
    keff = [_keff_after_ldiv(t) for t in taus]
    bands = [(1.0, 1.1), (1.1, 1.2), (1.3, 1.55), (1.75, 1.95), (1.9, 2.1)]
    for t, k, (lo, hi) in zip(taus, keff, bands):
        assert lo <= k <= hi, (t, k)
    assert all(a < b for a, b in itertools.pairwise(keff)), keff


# --------------------------------------------------------------------------------------------
# torch.compile friendliness
# --------------------------------------------------------------------------------------------


def test_traces_without_graph_breaks():
    model = SigmaEnsembleNet(_small_cnn(), 2, convert=True, generator=_gen())
    x = torch.randn(3, 3, 6, 6, generator=_gen(1))
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    with kernels("reference"):  # what Inductor traces: the specification, not the CPU path
        want = ref(x)
        want.sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    for name, buf in model.named_buffers():
        torch.testing.assert_close(buf, dict(ref.named_buffers())[name], msg=name)


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_diversity_loss_gradient_is_the_per_layer_definition_times_the_member_scale(scale):
    """L_div's one-pass form (all layers' γ side by side, the gradient split back in one
    operator) gives each γ the gradient of λ·Σ log softmax(sigmoid(γ)/τ) over members, × the
    layers' member gradient scale, bit for bit; BatchNorm (M, C) and LayerNorm (M, H, W) γ."""
    layers = nn.ModuleList([
        SigmaBatchNorm2d(5, 3, generator=_gen(1)),
        SigmaLayerNorm((2, 3), 3, generator=_gen(2)),
        SigmaBatchNorm1d(4, 3, generator=_gen(3)),
    ])  # fmt: skip
    for layer in layers:
        layer.member_grad_scale = scale
        with torch.no_grad():
            layer.gamma.normal_(generator=_gen(4))
    tau, lam = 0.3, 0.7
    value = diversity_loss(layers, tau, lam)
    value.backward()
    want_value = 0.0
    for layer in layers:
        g = layer.gamma.detach().clone().requires_grad_()
        term = lam * torch.log_softmax(torch.sigmoid(g.flatten(1)) / tau, dim=0).sum()
        (grad,) = torch.autograd.grad(term, g)
        assert layer.gamma.grad.shape == layer.gamma.shape
        torch.testing.assert_close(layer.gamma.grad, grad * scale, rtol=1e-6, atol=0)
        want_value += float(term.detach())
    assert float(value) == pytest.approx(want_value, rel=1e-6)
