"""`masksembles`: Masksembles (Durasov et al., "Masksembles for Uncertainty Estimation",
CVPR 2021), torch-uncertainty's models and layers.

M fixed binary channel masks with controlled overlap (``scale``) applied to one shared network;
training gives each member a B/M slice of the batch ("paper" strategy), evaluation repeats it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import torch
from torch import nn

from methods.base import BuildContext, MethodSpec, register_method
from methods.tu_common import TU_BACKBONES, RepeatInEval, SplitBatchEnsemble, build_tu, digits_cnn


@dataclass(frozen=True)
class MasksemblesHparams:
    scale: float = field(default=2.0, metadata={"gt": 1, "help": "mask overlap scale"})


def _digits(ctx: BuildContext, hp: MasksemblesHparams):
    from torch_uncertainty.layers import MaskedConv2d, MaskedLinear

    m = ctx.num_members

    def conv(ci: int, co: int, first: bool) -> nn.Module:
        if first:  # like torch-uncertainty's masked ResNet: the stem is a plain convolution
            return nn.Conv2d(ci, co, 3, padding=1, bias=False)
        return MaskedConv2d(ci, co, 3, num_estimators=m, scale=hp.scale, padding=1, bias=False)

    core = digits_cnn(
        ctx, conv=conv, linear=lambda fi, fo: MaskedLinear(fi, fo, num_estimators=m, scale=hp.scale)
    )
    return RepeatInEval(core, m)


@contextlib.contextmanager
def seeded_mask_generation():
    """torch-uncertainty 0.13 draws the masks from an unseeded ``np.random.default_rng()``, so
    the same cell gave different masks, and different results, on every run. Within this
    context an unseeded ``default_rng()`` is seeded from torch's generator, which the runner
    seeds with the cell's seed."""
    real = np.random.default_rng

    def seeded(seed=None, *args, **kwargs):
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        return real(seed, *args, **kwargs)

    with mock.patch.object(np.random, "default_rng", seeded):
        yield


def build(ctx: BuildContext, hp: MasksemblesHparams) -> SplitBatchEnsemble:
    from torch_uncertainty.models.classification import masked_resnet, masked_wideresnet28x10

    with seeded_mask_generation():
        return _build(ctx, hp, masked_resnet, masked_wideresnet28x10)


def _build(ctx, hp, masked_resnet, masked_wideresnet28x10) -> SplitBatchEnsemble:
    net = build_tu(
        ctx,
        masked_resnet,
        masked_wideresnet28x10,
        lambda c: _digits(c, hp),
        scale=hp.scale,
        repeat_strategy="paper",
    )
    return SplitBatchEnsemble(net, ctx.num_members)


register_method(
    MethodSpec(
        name="masksembles",
        build=build,
        hparams=MasksemblesHparams,
        backbones=TU_BACKBONES,
        min_members=2,
        reference="Durasov et al., CVPR 2021",
    )
)
