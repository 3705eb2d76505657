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

torch-uncertainty's ``BatchLinear`` and ``BatchConv2d`` compute the right function but, on an
accelerator, not at the right cost: ``BatchLinear`` puts the rows per member in a device tensor
and hands it to einops ``repeat``, which reads it back (a device synchronisation per call, ~7
per forward of a ResNet head), and both multiply the fp32 fast weights into the activations,
which promotes bf16 activations to fp32 under autocast (BatchEnsemble alone would then train in
fp32, at twice the activation memory). :func:`sync_free` gives the built layers our forward
(same function, same parameters and state-dict keys): Python-int row counts and fast weights
cast to the activation's dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from methods._base import BuildContext, MethodSpec, register_method
from methods._tu.common import (
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


def member_rows(p: Tensor, batch: int, like: Tensor, trailing: int) -> Tensor:
    """Each row's member parameters, as torch-uncertainty's ``repeat(p, "m h -> (m b) h")``
    followed by ``cat([rows, rows[:extra]])``, from Python ints (no device read).

    Args:
        p: (M, H) per-member fast weights or biases.
        batch: N rows, member-major blocks of N // M rows; the N % M extra rows at the end take
            the first rows' parameters (torch-uncertainty's convention).
        like: the activation whose dtype the result takes (bf16 under autocast: a fp32 factor
            would promote the activation to fp32).
        trailing: singleton dimensions appended (2 for (N, C, H, W) activations).

    Returns:
        (N, H, 1 × trailing).
    """
    m, h = p.shape
    per, extra = divmod(batch, m)
    rows = p.to(like.dtype)[:, None].expand(m, per, h).reshape(m * per, h)  # (M·per, H)
    rows = torch.cat([rows, rows[:extra]])  # (N, H)
    return rows.view(batch, h, *([1] * trailing))


def _linear_forward(self: nn.Module, inputs: Tensor) -> Tensor:
    """``BatchLinear.forward``: (N, H_in) → (N, H_out), y = ((x ∘ r) Wᵀ) ∘ s + b."""
    n = inputs.size(0)
    out = self.linear(inputs * member_rows(self.r_group, n, inputs, 0))
    out = out * member_rows(self.s_group, n, out, 0)
    return out if self.bias is None else out + member_rows(self.bias, n, out, 0)


def _conv_forward(self: nn.Module, inputs: Tensor) -> Tensor:
    """``BatchConv2d.forward``: (N, C_in, H, W) → (N, C_out, H', W'), y = conv(x ∘ r) ∘ s + b."""
    n = inputs.size(0)
    out = self.conv(inputs * member_rows(self.r_group, n, inputs, 2))
    out = out * member_rows(self.s_group, n, out, 2)
    return out if self.bias is None else out + member_rows(self.bias, n, out, 2)


@functools.cache
def _sync_free_classes() -> dict[type, type]:
    from torch_uncertainty.layers import BatchConv2d, BatchLinear

    linear = type("SyncFreeBatchLinear", (BatchLinear,), {"forward": _linear_forward})
    conv = type("SyncFreeBatchConv2d", (BatchConv2d,), {"forward": _conv_forward})
    return {BatchLinear: linear, BatchConv2d: conv}


def sync_free(net: nn.Module) -> nn.Module:
    """Give every torch-uncertainty ``BatchLinear``/``BatchConv2d`` of ``net`` our forward (a
    subclass: parameters, buffers and state-dict keys stay the library's). In place."""
    classes = _sync_free_classes()
    for module in net.modules():
        if type(module) in classes:
            module.__class__ = classes[type(module)]
    return net


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
        from methods._tu.text import batched_text_transformer

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
    model = BatchEnsembleModel(sync_free(net), ctx.num_members, split)
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
