"""`masksembles`: Masksembles (Durasov et al., "Masksembles for Uncertainty Estimation",
CVPR 2021), torch-uncertainty's models and layers.

M fixed binary channel masks with controlled overlap (``scale``) applied to one shared network.
Batch feeding (``batch``): ``repeat`` (default, the harness rule: every member sees every image
of the step) or ``split`` (each member a B/M slice, torch-uncertainty's "paper" strategy and the
Masksembles reference code); evaluation repeats the batch. Member losses are averaged.

The masks are drawn from an explicit generator seeded by the cell's seed:
torch-uncertainty 0.13 draws them from an unseeded ``np.random.default_rng()`` with no way to
pass one, so the same cell got different masks on every run. They are held as buffers
(:class:`FixedMasks`): the library keeps them as float64 ``nn.Parameter(requires_grad=False)``
(``layers/masksembles.py``, ``Mask1d``/``Mask2d``), which counted them as parameters and made
every masked activation a float64 product before casting it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from methods._base import BuildContext, MethodSpec, register_method
from methods._tu.common import (
    TU_FAMILIES,
    RepeatInEval,
    RepeatOrSplitEnsemble,
    build_tu,
    digits_cnn,
    repeat_or_split,
)


@dataclass(frozen=True)
class MasksemblesHparams:
    scale: float = field(default=2.0, metadata={"gt": 1, "help": "mask overlap scale"})
    batch: Literal["repeat", "split"] = field(
        default="repeat",
        metadata={"help": "training: every member sees the whole batch, or a B/M slice each"},
    )


def _masks(m: int, n: int, s: float, rng: np.random.Generator) -> np.ndarray:
    """n binary masks of m ones among int(m·s) positions, all-zero columns dropped (the
    algorithm of torch-uncertainty's ``_generate_masks``, with the generator passed in)."""
    total = int(m * s)
    masks = np.zeros((n, total))
    for row in masks:
        row[rng.choice(total, m, replace=False)] = 1
    return masks[:, ~np.all(masks == 0, axis=0)]


def seeded_masks(c: int, n: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """(n, c) masks as torch-uncertainty's ``generation_wrapper`` makes them (the same search
    for the scale that yields exactly c channels), drawn from ``rng``. Re-implemented because
    the library's version cannot take a generator."""
    active = int(c / (scale * (1 - (1 - 1 / scale) ** n)))

    def sized(s: float) -> np.ndarray:  # torch-uncertainty's generate_masks
        expected = int(active * s * (1 - (1 - 1 / s) ** n))
        while (masks := _masks(active, n, s, rng)).shape[1] != expected:
            pass
        return masks

    up, down = 4 * scale, max(0.2 * scale, 1.0)
    s = (down + up) / 2
    masks = sized(s)
    while masks.shape[1] != c:
        if masks.shape[1] < c:
            down = s
        else:
            up = s
        s = (down + up) / 2
        masks = sized(s)
    return masks


class FixedMasks(nn.Module):
    """torch-uncertainty's ``Mask1d``/``Mask2d`` with the (n, C) masks as a buffer.

    Forward as the library's: the batch (B, C[, H, W]) is cut into n member-major blocks of
    B/n rows and block m is multiplied channel-wise by mask m. The 0/1 masks are cast to the
    input's dtype (exact in any dtype), so activations keep their precision.
    """

    def __init__(self, masks: Tensor) -> None:
        super().__init__()
        self.num_masks = masks.shape[0]
        self.register_buffer("masks", masks.to(torch.get_default_dtype()))

    def forward(self, inputs: Tensor) -> Tensor:
        n = self.num_masks
        x = inputs.unflatten(0, (n, inputs.shape[0] // n))  # (n, B/n, C, ...)
        mask = self.masks.to(inputs.dtype).view(n, 1, -1, *[1] * (inputs.dim() - 2))
        return (x * mask).flatten(0, 1)


@torch.no_grad()
def reseed_masks(net: nn.Module, scale: float, rng: np.random.Generator) -> int:
    """Replace every torch-uncertainty mask of ``net`` (all built with ``scale``, as in the
    library's masked ResNet/WRN and our digits CNN) by a :class:`FixedMasks` drawn from
    ``rng``; returns how many."""
    from torch_uncertainty.layers.masksembles import Mask1d, Mask2d

    count = 0
    for parent in list(net.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Mask1d | Mask2d):
                n, c = child.masks.shape
                masks = torch.from_numpy(seeded_masks(c, n, scale, rng))
                setattr(parent, name, FixedMasks(masks.to(child.masks.device)))
                count += 1
    return count


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
    return RepeatInEval(core, m, split_in_training=hp.batch == "split")


def build(ctx: BuildContext, hp: MasksemblesHparams) -> RepeatOrSplitEnsemble:
    from torch_uncertainty.models.classification import masked_resnet, masked_wideresnet28x10

    split = hp.batch == "split"
    net = build_tu(
        ctx,
        masked_resnet,
        masked_wideresnet28x10,
        lambda c: _digits(c, hp),
        scale=hp.scale,
        repeat_strategy="paper" if split else "legacy",  # legacy: repeat in training too
    )
    reseed_masks(net, hp.scale, ctx.numpy_rng("masksembles"))
    return RepeatOrSplitEnsemble(net, ctx.num_members, split)


register_method(
    MethodSpec(
        name="masksembles",
        build=build,
        hparams=MasksemblesHparams,
        families=TU_FAMILIES,
        min_members=2,
        reference="Durasov et al., CVPR 2021",
        batch_feeding=repeat_or_split,
    )
)
