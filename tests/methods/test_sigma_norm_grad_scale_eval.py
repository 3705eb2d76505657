"""The member gradient scaling (methods._sigma.norm_base._GradScale) is an autograd Function
whose Python call tripled a σNorm layer's evaluation host time (34.6 → 102 µs per call measured
on the CPU; on a GPU the eval forward is host-bound): it runs only while gradients are recorded,
and scales them exactly as before."""

from __future__ import annotations

import torch

from methods._sigma import norm_base
from methods._sigma.norm import SigmaBatchNorm2d


def test_gradient_scaling_runs_in_training_only(monkeypatch):
    calls = []
    real = norm_base._GradScale.apply
    monkeypatch.setattr(norm_base._GradScale, "apply", lambda *a: calls.append(1) or real(*a))
    layer = SigmaBatchNorm2d(3, 2)
    layer.member_grad_scale = 2.0
    x = torch.randn(4, 3, 2, 2)
    with torch.no_grad():
        layer.eval()(x)
        layer.train()(x)
    assert calls == []  # no gradient recorded: the values are the same without it
    r = torch.randn(4, 3, 2, 2)  # a loss whose gradient is not zero (Σ of a BatchNorm's output is)
    (layer.train()(x) * r).sum().backward()
    assert len(calls) == 3  # weight, bias, γ
    plain = SigmaBatchNorm2d(3, 2)
    plain.load_state_dict(layer.state_dict())
    (plain.train()(x) * r).sum().backward()
    assert plain.weight.grad.abs().max() > 0.1
    torch.testing.assert_close(layer.weight.grad, 2.0 * plain.weight.grad)
