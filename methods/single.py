"""`single`: one deterministic model (M=1), the reference every ensemble is compared with; and
`single_continued`, the same model trained further from a trained single model: the control of a
pretrained conversion.

A conversion (σN-Ens or FiLM-Ensemble with ``pretrain_epochs: N`` and a fine-tuning recipe such as
2 epochs at a low learning rate) starts from the suite's `single` cell trained N epochs. Whether it
improves on that model, or only trains it longer, needs the single model trained the same extra
epochs under the same recipe: ``single_continued`` with the same ``pretrain_epochs`` and recipe
delta, paired by seed. The control is ours (the σN-Ens paper reports the conversion against the
model it starts from); it is a method of its own, rather than hyper-parameters of `single`,
so that `single`'s cell identities (which hash every hyper-parameter) stay those of every
existing record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from methods.base import BuildContext, EnsembleModel, MethodSpec, NoHparams, register_method


class SingleModel(EnsembleModel):
    """A plain backbone presented as a one-member ensemble: logits (1, B, K). Starts from
    ``ctx.pretrained`` (a trained single backbone's state dict) when the runner gives one."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.num_members = 1
        self.net = ctx.build_backbone()
        if ctx.pretrained is not None:
            self.net.load_state_dict(ctx.pretrained)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).unsqueeze(0)  # (1, B, K)


@dataclass(frozen=True)
class ContinuedHparams:
    pretrained: str | None = field(
        default=None, metadata={"help": "state dict of a trained single model to continue"}
    )
    pretrain_epochs: int = field(
        default=0,
        metadata={"ge": 0, "help": "continue the suite's own single cell of this many epochs"},
    )


def _check_continued(hp: ContinuedHparams, M: int) -> list[str]:
    if hp.pretrained and hp.pretrain_epochs:
        return ["set either pretrained or pretrain_epochs, not both"]
    return []


register_method(
    MethodSpec(
        name="single",
        build=lambda ctx, hp: SingleModel(ctx),
        hparams=NoHparams,
        min_members=1,
        max_members=1,
        reference="one deterministic network",
    )
)

register_method(
    MethodSpec(
        name="single_continued",
        build=lambda ctx, hp: SingleModel(ctx),
        hparams=ContinuedHparams,
        min_members=1,
        max_members=1,
        reference="one deterministic network trained further (the conversion control; ours)",
        check=_check_continued,
        pretrained_conversion=True,
    )
)
