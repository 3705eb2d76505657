"""`single_continued`: the single model trained further from a trained single model, the
control of a pretrained conversion (methods/single.py says why it is a method of its own).

A conversion (σN-Ens or FiLM-Ensemble with ``pretrain_epochs: N`` and a fine-tuning recipe)
starts from the suite's `single` cell trained N epochs; this method starts from the same model
and trains it the same extra epochs under the same recipe, paired by seed. The control is ours
(the σN-Ens paper reports the conversion against the model it starts from).
"""

from __future__ import annotations

from dataclasses import dataclass

from methods._base import MethodSpec, pretrain_epochs_field, pretrained_field, register_method
from methods.single import SingleModel


@dataclass(frozen=True)
class ContinuedHparams:
    pretrained: str | None = pretrained_field("continue")
    pretrain_epochs: int = pretrain_epochs_field("then continue it")


register_method(
    MethodSpec(
        name="single_continued",
        build=lambda ctx, hp: SingleModel(ctx),
        hparams=ContinuedHparams,
        min_members=1,
        max_members=1,
        reference="one deterministic network trained further (the conversion control; ours)",
        pretrained_conversion=True,
    )
)
