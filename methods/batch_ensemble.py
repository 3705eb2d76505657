"""`batch_ensemble`: BatchEnsemble (Wen, Tran & Ba, "BatchEnsemble: an Alternative Approach to
Efficient Ensemble and Lifelong Learning", ICLR 2020), torch-uncertainty's models and layers.

Members share each weight W and own rank-1 fast weights r_m, s_m: W_m = W ∘ (r_m s_mᵀ).
Batch feeding (``batch``): ``repeat`` (default) tiles the batch so every member sees every image
of the step, as uncertainty-baselines' ``baselines/cifar/batchensemble.py`` (``tf.tile``), the
source of the published numbers; ``split`` gives each member a B/M slice (torch-uncertainty's
"paper" strategy). Member losses are averaged (shared weights; UB averages over the tiled rows).
Recipe deltas (uncertainty-baselines ``baselines/cifar/batchensemble.py``, the source of the
published numbers): no weight decay on the fast weights r, s (its model regularizes only kernels,
BatchNorm and the dense layer's bias), and a learning-rate multiplier on the fast weights,
``fast_weight_lr_multiplier: 0.5`` (UB's flag and default: in ``train_step`` every gradient that is
neither a BatchNorm variable nor a ``kernel`` — r, s and the per-member biases — is multiplied by
0.5 before ``optimizer.apply_gradients``). Under SGD with momentum a constant gradient factor on a
parameter is exactly that factor on its learning rate (momentum and weight decay are linear in the
gradient), so it is applied as the learning rate of the fast-weight group. ``1.0`` is
torch-uncertainty's behaviour (one learning rate for all parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

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
    fast_weight_lr_multiplier: float = field(
        default=0.5,
        metadata={
            "gt": 0,
            "help": "lr factor of r, s and the per-member biases (UB 0.5; torch-uncertainty 1)",
        },
    )


def _fast_weight_groups(model: nn.Module) -> tuple[list, list, list]:
    """(slow, fast r/s, per-member biases): a bias of a rank-1 layer is (M, C_out), one row per
    member, so UB's multiplier reaches it (UB: "not batch_norm and not kernel")."""
    from torch_uncertainty.layers import BatchConv2d, BatchLinear

    slow, fast, biases = [], [], []
    for module in model.modules():
        rank1 = isinstance(module, BatchConv2d | BatchLinear)
        for name, p in module.named_parameters(recurse=False):
            if name in FAST_WEIGHTS:
                fast.append(p)
            elif rank1 and name == "bias":
                biases.append(p)
            else:
                slow.append(p)
    return slow, fast, biases


class BatchEnsembleModel(RepeatOrSplitEnsemble):
    fast_lr: float = 1.0  # learning-rate factor of the fast weights (the builder sets it)

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Slow weights; r, s without decay; per-member biases with decay (as UB's dense bias);
        the last two at ``lr_scale`` = the fast-weight multiplier (read by make_optimizer)."""
        slow, fast, biases = _fast_weight_groups(self)
        groups = [
            {"params": slow, "weight_decay": weight_decay},
            {"params": fast, "weight_decay": 0.0, "lr_scale": self.fast_lr},
        ]
        if biases:
            groups.append(
                {"params": biases, "weight_decay": weight_decay, "lr_scale": self.fast_lr}
            )
        return groups


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

        model = BatchEnsembleModel(batched_text_transformer(ctx, split), ctx.num_members, split)
        model.fast_lr = hp.fast_weight_lr_multiplier
        return model
    net = build_tu(
        ctx,
        batched_resnet,
        batched_wideresnet28x10,
        lambda c: _digits(c, split),
        repeat_strategy="paper" if split else "legacy",  # legacy: repeat in training too
    )
    model = BatchEnsembleModel(net, ctx.num_members, split)
    model.fast_lr = hp.fast_weight_lr_multiplier
    return model


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
