"""Micro-benchmarks of the σNorm layers against the plain norms they replace (pytest-benchmark).

    pytest benchmarks/ --benchmark-only          # CPU here; on a GPU add --device cuda

Not part of the test suite (``testpaths = tests``): timings are measured, never asserted.
The σNorm layer at M members on (M·B, ...) is compared with the plain norm on the same (M·B, ...)
tensor, the cost a shared-backbone ensemble cannot avoid.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from methods._sigma.norm import SigmaBatchNorm2d, SigmaLayerNorm

M, B = 4, 32
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _step(layer: nn.Module, x: torch.Tensor, train: bool):
    layer.train(train)

    def run():
        if train:
            out = layer(x)
            out.sum().backward()
        else:
            with torch.no_grad():
                layer(x)
        _sync()

    return run


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("kind", ["plain", "sigma"])
def test_batchnorm2d(benchmark, kind: str, train: bool) -> None:
    c, hw = 64, 16
    layer = (nn.BatchNorm2d(c) if kind == "plain" else SigmaBatchNorm2d(c, M)).to(DEVICE)
    x = torch.randn(M * B, c, hw, hw, device=DEVICE, requires_grad=train)
    x = x.contiguous(memory_format=torch.channels_last) if DEVICE.type == "cuda" else x
    benchmark(_step(layer, x, train))


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("kind", ["plain", "sigma"])
def test_layernorm(benchmark, kind: str, train: bool) -> None:
    tokens, dim = 65, 192
    layer = (nn.LayerNorm(dim) if kind == "plain" else SigmaLayerNorm(dim, M)).to(DEVICE)
    x = torch.randn(M * B, tokens, dim, device=DEVICE, requires_grad=train)
    benchmark(_step(layer, x, train))
