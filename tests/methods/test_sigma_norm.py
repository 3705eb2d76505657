"""Tests of the σNorm layers, converter, diversity regularizer and diagnostics.

All inputs are tiny and CPU-only; backbones are built offline (no weight downloads).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from methods._sigma.convert import convert_to_ensemble
from methods._sigma.diversity import diversity_loss
from methods._sigma.norm import (
    SigmaBatchNorm1d,
    SigmaBatchNorm2d,
    SigmaGroupNorm,
    SigmaLayerNorm,
)
from tests.sigma_helpers import (
    _bn_reference,
    _gen,
    _randomize_affine,
    _single_thread,  # noqa: F401  (autouse fixture)
)


@pytest.mark.parametrize(
    ("cls", "shape"),
    [(SigmaBatchNorm2d, (4, 3, 5, 5)), (SigmaBatchNorm1d, (4, 3)), (SigmaBatchNorm1d, (4, 3, 6))],
)
def test_batchnorm_member_statistics_are_isolated(cls, shape):
    m_count, b = 3, shape[0]
    layer = cls(shape[1], m_count, generator=_gen())
    _randomize_affine(layer)
    x = torch.randn(m_count * b, *shape[1:], generator=_gen(2)) * 2 + 1  # (M·B, C, ...)
    x2 = x.clone()
    x2[b : 2 * b] = x2[b : 2 * b] * 3 - 5  # change member 1's slice only
    la, lb = copy.deepcopy(layer), copy.deepcopy(layer)
    ya = la(x).view(m_count, b, *shape[1:])  # (M, B, ...)
    yb = lb(x2).view(m_count, b, *shape[1:])
    for m in (0, 2):
        torch.testing.assert_close(ya[m], yb[m], rtol=0, atol=0)
        torch.testing.assert_close(la.running_mean[m], lb.running_mean[m], rtol=0, atol=0)
        torch.testing.assert_close(la.running_var[m], lb.running_var[m], rtol=0, atol=0)
    # member 1's running stats follow its own slice only: 0.9·init + 0.1·(mean, unbiased var)
    for lay, inp in ((la, x), (lb, x2)):
        sl = inp[b : 2 * b].transpose(0, 1).flatten(1)  # (C, B·prod(S))
        torch.testing.assert_close(lay.running_mean[1], 0.1 * sl.mean(1))
        torch.testing.assert_close(lay.running_var[1], 0.9 + 0.1 * sl.var(1, unbiased=True))
    assert (la.running_mean[1] - lb.running_mean[1]).abs().min() > 0.1
    # the affine map of member 1 differs, so its outputs change although both are normalised
    assert not torch.allclose(ya[1], yb[1])
    assert la.num_batches_tracked.tolist() == [1, 1, 1]


@pytest.mark.parametrize("variant", ["sigma", "film"])
@pytest.mark.parametrize("momentum", [0.3, None])
def test_batchnorm_training_matches_per_member_reference(variant, momentum):
    m_count, b, c = 3, 4, 5
    layer = SigmaBatchNorm2d(c, m_count, momentum=momentum, variant=variant, generator=_gen())
    _randomize_affine(layer)
    rm, rv = torch.zeros(m_count, c), torch.ones(m_count, c)  # reference running stats
    g = _gen(5)
    for _step in range(3):
        x = (torch.randn(m_count * b, c, 3, 3, generator=g) * 2 + 1).requires_grad_(True)
        x_ref = x.detach().clone().requires_grad_(True)
        up = torch.randn(m_count * b, c, 3, 3, generator=g)  # upstream gradient
        y = layer(x)
        # momentum None = cumulative average: nn.BatchNorm's factor 1/num_batches_tracked
        factor = momentum if momentum is not None else 1.0 / (_step + 1)
        y_ref = _bn_reference(x_ref, layer, rm, rv, True, momentum=factor)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.running_mean, rm, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(layer.running_var, rv, rtol=1e-6, atol=1e-6)
        # gradients of the fused autograd function equal autograd through the reference
        params = [p for p in (layer.weight, layer.bias, layer.gamma) if p is not None]
        grads = torch.autograd.grad(y, [x, *params], up)
        grads_ref = torch.autograd.grad(y_ref, [x_ref, *params], up)
        for got, want in zip(grads, grads_ref):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert layer.num_batches_tracked.tolist() == [3] * m_count


def test_batchnorm_gradcheck_float64():
    layer = SigmaBatchNorm2d(3, 2, generator=_gen()).double()
    _randomize_affine(layer)
    x = torch.randn(2 * 3, 3, 2, 2, dtype=torch.float64, generator=_gen(3)).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x, w, b, g: layer(x), (x, layer.weight, layer.bias, layer.gamma)
    )


def test_batchnorm_eval_uses_running_stats_and_is_deterministic():
    m_count, b, c = 2, 3, 4
    layer = SigmaBatchNorm2d(c, m_count, generator=_gen())
    _randomize_affine(layer)
    with torch.no_grad():
        layer.running_mean.copy_(torch.randn(m_count, c, generator=_gen(7)))
        layer.running_var.copy_(torch.rand(m_count, c, generator=_gen(8)) + 0.5)
    layer.eval()
    x = torch.randn(m_count * b, c, 4, 4, generator=_gen(9))
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    y1, y2 = layer(x), layer(x)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    ref = _bn_reference(x, layer, layer.running_mean, layer.running_var, False)
    torch.testing.assert_close(y1, ref, rtol=1e-5, atol=1e-6)
    for k, v in layer.state_dict().items():  # eval never updates buffers
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    # a sample's eval output does not depend on the other samples of the batch
    torch.testing.assert_close(layer(x[[0, b]])[0], y1[0], rtol=1e-6, atol=1e-6)


def test_batchnorm_without_running_stats_uses_batch_stats_in_eval():
    layer = SigmaBatchNorm1d(4, 2, track_running_stats=False, generator=_gen())
    assert layer.running_mean is None and layer.num_batches_tracked is None
    x = torch.randn(2 * 5, 4, generator=_gen(1)) * 3 + 2
    y_train = layer(x)
    layer.eval()
    y_eval = layer(x)
    torch.testing.assert_close(y_train, y_eval, rtol=0, atol=0)
    torch.testing.assert_close(y_eval, _bn_reference(x, layer, None, None, True))


def test_batchnorm_channels_last_and_bf16_autocast():
    m_count, b, c = 2, 4, 6
    layer = SigmaBatchNorm2d(c, m_count, generator=_gen())
    _randomize_affine(layer)
    x = torch.randn(m_count * b, c, 5, 5, generator=_gen(4)) * 2 + 3
    xcl = x.contiguous(memory_format=torch.channels_last)
    ref_layer, bf_layer, exact = (copy.deepcopy(layer) for _ in range(3))
    y_ref = ref_layer(x)
    y_cl = layer(xcl)
    assert y_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y_cl, y_ref, rtol=1e-5, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_bf = bf_layer(xcl.bfloat16())
    assert y_bf.dtype == torch.bfloat16
    assert y_bf.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y_bf.float(), y_ref, rtol=0.02, atol=0.05)
    # statistics are float32 and match the float32 statistics of the bf16-rounded input
    assert bf_layer.running_mean.dtype == torch.float32
    exact(xcl.bfloat16().float())
    torch.testing.assert_close(bf_layer.running_mean, exact.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bf_layer.running_var, exact.running_var, rtol=1e-5, atol=1e-6)
    layer.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ev = layer(xcl.bfloat16())
    assert y_ev.dtype == torch.bfloat16
    assert y_ev.is_contiguous(memory_format=torch.channels_last)


def test_invalid_inputs_raise():
    layer = SigmaBatchNorm2d(3, 4)
    with pytest.raises(ValueError, match="not a multiple of num_members=4"):
        layer(torch.randn(6, 3, 2, 2))
    with pytest.raises(ValueError, match="expects 4-D input"):
        layer(torch.randn(8, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        SigmaBatchNorm1d(3, 4)(torch.randn(4, 3))
    with pytest.raises(ValueError, match="variant must be one of"):
        SigmaLayerNorm(8, 2, variant="batchensemble")
    with pytest.raises(ValueError, match="variant must be one of"):
        convert_to_ensemble(nn.BatchNorm2d(3), 2, variant="bogus")
    with pytest.raises(ValueError, match="not divisible by num_groups"):
        SigmaGroupNorm(3, 8, 2)


# --------------------------------------------------------------------------------------------
# LayerNorm / GroupNorm
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalized_shape", [(8,), (5, 8)])
def test_layernorm_equals_per_member_layernorm_times_sigmoid_gamma(normalized_shape):
    m_count, b = 3, 2
    layer = SigmaLayerNorm(normalized_shape, m_count, eps=1e-6, generator=_gen())
    _randomize_affine(layer)
    x = torch.randn(m_count * b, 5, 8, generator=_gen(3)) * 2 + 1  # (M·B, N, C) ViT tokens
    y = layer(x).view(m_count, b, 5, 8)
    for m in range(m_count):
        ref = nn.LayerNorm(normalized_shape, eps=1e-6)
        with torch.no_grad():
            ref.weight.copy_(layer.weight[m])
            ref.bias.copy_(layer.bias[m])
        s = torch.sigmoid(layer.gamma[m])
        torch.testing.assert_close(y[m], s * ref(x[m * b : (m + 1) * b]), rtol=1e-5, atol=1e-6)


def test_timm_layernorm2d_is_channels_first():
    timm = pytest.importorskip("timm")
    norm = timm.layers.LayerNorm2d(6)
    with torch.no_grad():
        norm.weight.normal_(generator=_gen(1))
        norm.bias.normal_(generator=_gen(2))
    sig = convert_to_ensemble(norm, 2, generator=_gen(), preserve_outputs=True)
    assert isinstance(sig, SigmaLayerNorm) and sig.channels_first
    x = torch.randn(3, 6, 4, 4, generator=_gen(3))
    out = sig(x.repeat(2, 1, 1, 1)).view(2, 3, 6, 4, 4)
    for m in range(2):
        torch.testing.assert_close(out[m], norm(x), rtol=1e-5, atol=1e-5)


def test_groupnorm_equals_per_member_groupnorm_times_sigmoid_gamma():
    m_count, b, c = 2, 3, 8
    layer = SigmaGroupNorm(4, c, m_count, generator=_gen())
    _randomize_affine(layer)
    x = torch.randn(m_count * b, c, 3, 3, generator=_gen(3))
    y = layer(x).view(m_count, b, c, 3, 3)
    for m in range(m_count):
        ref = nn.GroupNorm(4, c)
        with torch.no_grad():
            ref.weight.copy_(layer.weight[m])
            ref.bias.copy_(layer.bias[m])
        s = torch.sigmoid(layer.gamma[m]).view(c, 1, 1)
        torch.testing.assert_close(y[m], s * ref(x[m * b : (m + 1) * b]), rtol=1e-5, atol=1e-6)


def test_film_variant_is_per_member_affine_without_gamma():
    layer = SigmaGroupNorm(2, 4, 2, variant="film")
    assert layer.gamma is None
    assert {n for n, _ in layer.named_parameters()} == {"weight", "bias"}
    _randomize_affine(layer)
    x = torch.randn(4, 4, 3, 3, generator=_gen(3))
    y = layer(x).view(2, 2, 4, 3, 3)
    for m in range(2):
        ref = F.group_norm(x[2 * m : 2 * m + 2], 2, layer.weight[m], layer.bias[m])
        torch.testing.assert_close(y[m], ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="no σNorm layer with γ"):
        diversity_loss(layer, tau=0.1, lam=1.0)


# --------------------------------------------------------------------------------------------
# Converter and wrapper
# --------------------------------------------------------------------------------------------
