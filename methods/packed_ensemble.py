"""`packed_ensemble`: Packed-Ensembles (Laurent et al., "Packed-Ensembles for Efficient
Uncertainty Estimation", ICLR 2023), torch-uncertainty's models and layers.

M members packed into grouped convolutions of a network α times wider, each member split into
γ groups. Every member sees the whole batch; the output is (M·B, K) member-major.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from methods.base import BuildContext, EnsembleModel, MethodSpec, register_method, to_members
from methods.tu_common import TU_FAMILIES, build_tu, digits_cnn


@dataclass(frozen=True)
class PackedHparams:
    alpha: float = field(default=2.0, metadata={"gt": 0, "help": "width expansion α"})
    gamma: int = field(default=2, metadata={"ge": 1, "help": "groups per member γ"})


class PackedEnsemble(EnsembleModel):
    def __init__(self, net, num_members: int) -> None:
        super().__init__()
        self.net = net
        self.num_members = num_members

    def forward(self, x: Tensor) -> Tensor:
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)


def _digits(ctx: BuildContext, hp: PackedHparams):
    from torch_uncertainty.layers import PackedConv2d, PackedLinear

    m = ctx.num_members
    # Digits' channel counts are far below the library default of 64 channels per group.
    return digits_cnn(
        ctx,
        conv=lambda ci, co, first: PackedConv2d(
            ci,
            co,
            3,
            alpha=hp.alpha,
            num_estimators=m,
            gamma=1 if first else hp.gamma,
            padding=1,
            bias=False,
            first=first,
            minimum_channels_per_group=1,
        ),
        linear=lambda fi, fo: PackedLinear(
            fi, fo, alpha=hp.alpha, num_estimators=m, gamma=hp.gamma, last=True
        ),
        channels=hp.alpha,
    )


def build(ctx: BuildContext, hp: PackedHparams) -> PackedEnsemble:
    from torch_uncertainty.models.classification import packed_resnet, packed_wideresnet28x10

    net = build_tu(
        ctx,
        packed_resnet,
        packed_wideresnet28x10,
        lambda c: _digits(c, hp),
        alpha=hp.alpha,
        gamma=hp.gamma,
    )
    return PackedEnsemble(net, ctx.num_members)


def check(hp: PackedHparams, num_members: int) -> list[str]:
    if (hp.alpha * num_members) % 1:
        return [f"alpha·M must be an integer, got alpha={hp.alpha}, M={num_members}"]
    return []


register_method(
    MethodSpec(
        name="packed_ensemble",
        build=build,
        hparams=PackedHparams,
        families=TU_FAMILIES,
        reference="Laurent et al., ICLR 2023",
        check=check,
    )
)
