"""The comparators as their reference code trains them: FiLM-Ensemble's init (official CBN.py),
BatchEnsemble's fast-weight learning rate (uncertainty-baselines), per-member gradient clipping
of the deep ensemble, and Masksembles' masks as buffers."""

from __future__ import annotations

import math

import pytest
import torch

from harness.registries import METHODS
from methods.base import BuildContext


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _build(method: str, seed: int = 0, width: int = 8, members: int = 4, **hp):
    spec = METHODS.get(method)
    ctx = BuildContext("digits_cnn", (1, 8, 8), 8, members, {"width": width}, None, seed=seed)
    return spec.build(ctx, spec.make_hparams(hp))


# --- FiLM-Ensemble ------------------------------------------------------------------------------


@pytest.mark.parametrize("gain", [1.0, 2.0])
def test_film_init_is_the_official_zero_mean_xavier_uniform(gain):
    """CBN2D: nn.init.xavier_uniform_(gamma (M, C), gain=cbn_gain), the same for beta; nothing
    added to the scale. Bound a = gain·√(6/(M+C)); mean 0, std a/√3."""
    m, width = 4, 32
    model = _build("film_ensemble", width=width, members=m, cbn_gain=gain)
    layers = [layer for _, layer in model.norm_layers()]
    assert len(layers) == 3
    for layer in layers:
        for p in (layer.weight, layer.bias):
            c = p.shape[1]
            bound = gain * math.sqrt(6.0 / (m + c))
            assert p.shape == (m, c)
            assert p.abs().max().item() <= bound + 1e-7
            assert p.abs().max().item() > 0.9 * bound  # uniform up to the bound, not tighter
    # pooled over the 6 tensors (~1,300 draws): mean 0 (not 1), std a/√3
    w = torch.cat([layer.weight.detach().flatten() for layer in layers[1:]])  # C = 64 layers
    bound = gain * math.sqrt(6.0 / (m + 64))
    assert abs(w.mean().item()) < 0.1 * bound
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


def test_film_perturb_keeps_the_converted_affine_at_zero_spread():
    """init: perturb with init_std 0 is the identity on the converted affine (weight 1, bias 0)."""
    model = _build("film_ensemble", init="perturb", init_std=0.0)
    for _, layer in model.norm_layers():
        assert torch.equal(layer.weight.detach(), torch.ones_like(layer.weight))
        assert torch.equal(layer.bias.detach(), torch.zeros_like(layer.bias))


def test_film_unknown_init_is_refused(tmp_path):
    from harness.suite import SuiteError, load_suite

    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\ngrid: {datasets: [digits], backbones: [digits_cnn], methods: "
        "[{name: film_ensemble, hparams: {init: normal}}]}\n"
    )
    with pytest.raises(SuiteError, match="init"):
        load_suite(path)
