"""`single`: one deterministic model (M=1), the reference every ensemble is compared with.
Its model class also serves `single_continued` (methods/single_continued.py).

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

from torch import Tensor

from methods._base import BuildContext, EnsembleModel, MethodSpec, NoHparams, register_method


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
