"""Shared helpers of the σNorm tests: reference implementations, small models, fixtures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from methods._sigma.norm import (
    SigmaNorm,
)

PLAIN_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors: intra-op threading only adds overhead (and suffers badly on shared CPUs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomize_affine(layer: SigmaNorm, seed: int = 1) -> None:
    g = _gen(seed)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * 0.5 + 1)
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g))


def _count_plain_norms(model: nn.Module) -> int:
    return sum(isinstance(m, PLAIN_NORMS) and not isinstance(m, SigmaNorm) for m in model.modules())


def _small_cnn(num_classes: int = 5) -> nn.Module:
    """A CNN with every supported norm type (BN2d, GN, LN over features, BN1d)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32, 16),
        nn.LayerNorm(16),
        nn.ReLU(),
        nn.Linear(16, 16),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Linear(16, num_classes),
    )


def _train_briefly(model: nn.Module, in_shape: tuple[int, ...], steps: int = 3, bs: int = 8):
    """A few SGD steps on random data, so affine and running stats move off their defaults."""
    g = _gen(123)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    for _ in range(steps):
        x = torch.randn(bs, *in_shape, generator=g)
        y = torch.randint(0, 5, (bs,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x)[:, :5], y).backward()
        opt.step()
    return model


def _bn_reference(x, layer, running_mean, running_var, training, momentum=None):
    """Per-member loop of F.batch_norm (reference only; the implementation never loops)."""
    if momentum is None:
        momentum = layer.momentum if layer.momentum is not None else 0.0
    m_count = layer.num_members
    b = x.shape[0] // m_count
    scale, shift = layer.effective_affine()  # (M, C)
    outs = []
    for m in range(m_count):
        outs.append(
            F.batch_norm(
                x[m * b : (m + 1) * b],
                running_mean[m] if running_mean is not None else None,
                running_var[m] if running_var is not None else None,
                scale[m],
                shift[m],
                training,
                momentum,
                layer.eps,
            )
        )
    return torch.cat(outs)


# --------------------------------------------------------------------------------------------
# BatchNorm
# --------------------------------------------------------------------------------------------
