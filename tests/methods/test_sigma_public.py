"""σN-Ens on a user's own model (``methods/_sigma_public.py``, ``harness.api.sigma_ensemble``):
the member-batch convention, conversion from scratch and from trained weights, the diversity
loss and k_eff the harness uses, and the example script run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import harness.api as h
from methods._sigma.diversity import diversity_loss, sharing_diagnostics
from methods._sigma.norm import sigma_norm_layers
from methods._sigma_public import SigmaEnsembleModel, sigma_ensemble
from tests.conftest import REPO


def plain(num_classes: int = 5) -> nn.Module:
    """A user's model with the three kinds of norm layer."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, num_classes),
    )  # fmt: skip


def trained(model: nn.Module) -> nn.Module:
    """Running statistics and affine away from their initial values, as after training."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.train()
    for _ in range(3):
        model(torch.randn(16, 3, 6, 6))
    return model.eval()


def test_member_batch_convention_input_repeated_member_major_output_m_b_k():
    net = sigma_ensemble(plain(), 3, seed=0)
    x = torch.randn(4, 3, 6, 6)  # (B, C, H, W)
    net.train()
    logits = net(x)
    assert isinstance(net, SigmaEnsembleModel) and logits.shape == (3, 4, 5)  # (M, B, K)
    # The same numbers as the converted model run on the member-major stack of x:
    # rows m·B … m·B+B−1 are member m's copy of the batch.
    stacked = torch.cat([x, x, x])  # (M·B, C, H, W), member-major
    direct = net.backbone(stacked).view(3, 4, 5)
    torch.testing.assert_close(logits, direct, rtol=0, atol=0)
    # Members differ only through their own norms: different gates, different logits.
    assert not torch.allclose(logits[0], logits[1])
    probs = net.eval().predict_proba(x)
    torch.testing.assert_close(probs, F.softmax(net(x), -1).mean(0))
    assert probs.shape == (4, 5)


def test_from_trained_weights_every_member_reproduces_the_model():
    model = trained(plain())
    x = torch.randn(6, 3, 6, 6)
    with torch.no_grad():
        ref = model(x)
        net = h.sigma_ensemble(model, 4, pretrained=True, seed=0).eval()
        out = net(x)  # (4, 6, 5)
    for m in range(4):
        torch.testing.assert_close(out[m], ref, rtol=0, atol=1e-5)
    assert isinstance(model[1], nn.BatchNorm2d)  # the user's model is left as it was
    kinds = sorted(type(layer).__name__ for _, layer in sigma_norm_layers(net))
    assert kinds == ["SigmaBatchNorm2d", "SigmaGroupNorm", "SigmaLayerNorm"]


def test_from_scratch_the_harness_defaults_and_its_gradient_scale():
    net = sigma_ensemble(plain(), 4, seed=0)
    for _, layer in sigma_norm_layers(net):
        gates = torch.sigmoid(layer.gamma.detach())
        assert 0.93 < float(gates.mean()) < 0.97  # γ ~ N(3, 0.1²): sigmoid ≈ 0.95
        assert layer.member_grad_scale == 4.0  # member_grad: member, as the harness trains
    assert all(
        layer.member_grad_scale == 1.0
        for _, layer in sigma_norm_layers(sigma_ensemble(plain(), 4, member_grad="mean"))
    )
    a, b = (sigma_ensemble(plain(), 4, seed=7) for _ in range(2))
    torch.testing.assert_close(
        [layer.gamma for _, layer in sigma_norm_layers(a)],
        [layer.gamma for _, layer in sigma_norm_layers(b)],
    )  # seeded γ draw
    folded = sigma_ensemble(plain(), 4, seed=0, gamma_init_mean=0.0, gate_fold="constant")
    (_, first), *_ = sigma_norm_layers(folded)
    assert first.gate_gain == pytest.approx(2.0)  # 1/sigmoid(0): the folded gate starts at 1


def test_diversity_loss_and_k_eff_are_the_harness_ones():
    net = sigma_ensemble(plain(), 4, seed=0, gamma_init_mean=0.0, gamma_init_std=1.0)
    assert net.diversity_loss(0.5, 0.01).item() == diversity_loss(net, 0.5, 0.01).item()
    assert h.diversity_loss(net, 0.5, 0.01).item() == diversity_loss(net, 0.5, 0.01).item()
    assert net.k_eff() == h.k_eff(net) == sharing_diagnostics(net)["k_eff"]
    assert 1.0 < net.k_eff() < 4.0
    groups = net.param_groups(weight_decay=5e-4)
    gammas = {id(layer.gamma) for _, layer in sigma_norm_layers(net)}
    assert {id(p) for p in groups[1]["params"]} == gammas and groups[1]["weight_decay"] == 0.0
    n_params = sum(1 for p in net.parameters())
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == n_params


def test_a_model_without_norm_layers_is_refused_by_name():
    with pytest.raises(ValueError, match="Linear has no BatchNorm, LayerNorm or GroupNorm"):
        sigma_ensemble(nn.Linear(3, 3), 2)
    with pytest.raises(ValueError, match="num_members must be ≥ 1, got 0"):
        sigma_ensemble(plain(), 0)


def test_the_example_trains_a_sigma_ens_in_a_plain_loop():
    """``python examples/own_training_loop.py`` as a user runs it (3 short epochs here)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny convolutions: one thread is fastest
    proc = subprocess.run(
        [sys.executable, "examples/own_training_loop.py", "--epochs", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = re.findall(
        r"epoch (\d): test acc ([\d.]+)  NLL ([\d.]+)  k_eff ([\d.]+) of 4", proc.stdout
    )
    assert [int(e) for e, *_ in lines] == [1, 2, 3], proc.stdout
    acc, k_eff = [float(a) for _, a, _, _ in lines], [float(k) for *_, k in lines]
    assert acc[-1] > 0.3  # 10 classes: well above chance after three epochs
    assert 1.0 <= k_eff[-1] < k_eff[0] <= 4.0  # low τ: the members start to specialise


@pytest.mark.slow  # imports Lightning
def test_the_lightning_variant_trains_the_same_way():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "examples/lightning_module.py", "--epochs", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    k_eff = [float(k) for k in re.findall(r"epoch \d: k_eff ([\d.]+) of 4", proc.stdout)]
    assert len(k_eff) == 2 and 1.0 <= k_eff[1] < k_eff[0] <= 4.0, proc.stdout
