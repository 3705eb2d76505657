"""`batch_ensemble`: BatchEnsemble (Wen, Tran & Ba, "BatchEnsemble: an Alternative Approach to
Efficient Ensemble and Lifelong Learning", ICLR 2020), torch-uncertainty's models and layers.

Members share each weight W and own rank-1 fast weights r_m, s_m: W_m = W ∘ (r_m s_mᵀ).
Batch feeding (``batch``): ``repeat`` (default) tiles the batch so every member sees every image
of the step, as uncertainty-baselines' ``baselines/cifar/batchensemble.py`` (``tf.tile``), the
source of the published numbers; ``split`` gives each member a B/M slice (torch-uncertainty's
"paper" strategy). Member losses are averaged (shared weights; UB averages over the tiled rows).
Recipe delta (paper, and uncertainty-baselines): no weight decay on the fast weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from methods.base import BuildContext, MethodSpec, register_method
from methods.tu_common import (
    TU_FAMILIES,
    RepeatOrSplitEnsemble,
    build_tu,
    digits_cnn,
    repeat_or_split,
)

FAST_WEIGHTS = ("r_group", "s_group")


@dataclass(frozen=True)
class BatchEnsembleHparams:
    batch: Literal["repeat", "split"] = field(
        default="repeat",
        metadata={"help": "training: every member sees the whole batch, or a B/M slice each"},
    )


class BatchEnsembleModel(RepeatOrSplitEnsemble):
    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        fast, slow = [], []
        for name, p in self.named_parameters():
            (fast if name.rsplit(".", 1)[-1] in FAST_WEIGHTS else slow).append(p)
        return [
            {"params": slow, "weight_decay": weight_decay},
            {"params": fast, "weight_decay": 0.0},
        ]


def _digits(ctx: BuildContext, split: bool):
    from torch_uncertainty.layers import BatchConv2d, BatchLinear
    from torch_uncertainty.methods import BatchEnsemble

    m = ctx.num_members
    core = digits_cnn(
        ctx,
        conv=lambda ci, co, first: BatchConv2d(ci, co, 3, num_estimators=m, padding=1, bias=False),
        linear=lambda fi, fo: BatchLinear(fi, fo, num_estimators=m),
    )
    # The wrapper always repeats in eval; in training only when asked to.
    return BatchEnsemble(core, num_estimators=m, repeat_training_inputs=not split)


def build(ctx: BuildContext, hp: BatchEnsembleHparams) -> BatchEnsembleModel:
    from torch_uncertainty.models.classification import batched_resnet, batched_wideresnet28x10

    split = hp.batch == "split"
    if ctx.family == "transformer":  # text_transformer with rank-1 linear layers
        from methods.tu_text import batched_text_transformer

        return BatchEnsembleModel(batched_text_transformer(ctx, split), ctx.num_members, split)
    net = build_tu(
        ctx,
        batched_resnet,
        batched_wideresnet28x10,
        lambda c: _digits(c, split),
        repeat_strategy="paper" if split else "legacy",  # legacy: repeat in training too
    )
    return BatchEnsembleModel(net, ctx.num_members, split)


register_method(
    MethodSpec(
        name="batch_ensemble",
        build=build,
        hparams=BatchEnsembleHparams,
        families=(*TU_FAMILIES, "transformer"),
        reference="Wen et al., ICLR 2020",
        batch_feeding=repeat_or_split,
    )
)
