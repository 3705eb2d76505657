"""`batch_ensemble`: BatchEnsemble (Wen, Tran & Ba, "BatchEnsemble: an Alternative Approach to
Efficient Ensemble and Lifelong Learning", ICLR 2020), torch-uncertainty's models and layers.

Members share each weight W and own rank-1 fast weights r_m, s_m: W_m = W ∘ (r_m s_mᵀ).
Training follows the paper ("paper" repeat strategy): each member sees a B/M slice of the batch.
Recipe delta (paper, and uncertainty-baselines): no weight decay on the fast weights.
"""

from __future__ import annotations

from typing import Any

from methods.base import BuildContext, MethodSpec, NoHparams, register_method
from methods.tu_common import TU_BACKBONES, SplitBatchEnsemble, build_tu, digits_cnn

FAST_WEIGHTS = ("r_group", "s_group")


class BatchEnsembleModel(SplitBatchEnsemble):
    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        fast, slow = [], []
        for name, p in self.named_parameters():
            (fast if name.rsplit(".", 1)[-1] in FAST_WEIGHTS else slow).append(p)
        return [
            {"params": slow, "weight_decay": weight_decay},
            {"params": fast, "weight_decay": 0.0},
        ]


def _digits(ctx: BuildContext):
    from torch_uncertainty.layers import BatchConv2d, BatchLinear
    from torch_uncertainty.methods import BatchEnsemble

    m = ctx.num_members
    core = digits_cnn(
        ctx,
        conv=lambda ci, co, first: BatchConv2d(ci, co, 3, num_estimators=m, padding=1, bias=False),
        linear=lambda fi, fo: BatchLinear(fi, fo, num_estimators=m),
    )
    return BatchEnsemble(core, num_estimators=m)  # repeats the batch in eval only


def build(ctx: BuildContext, hp: NoHparams) -> BatchEnsembleModel:
    from torch_uncertainty.models.classification import batched_resnet, batched_wideresnet28x10

    net = build_tu(ctx, batched_resnet, batched_wideresnet28x10, _digits, repeat_strategy="paper")
    return BatchEnsembleModel(net, ctx.num_members)


register_method(
    MethodSpec(
        name="batch_ensemble",
        build=build,
        hparams=NoHparams,
        backbones=TU_BACKBONES,
        reference="Wen et al., ICLR 2020",
    )
)
