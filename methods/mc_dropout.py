"""`mc_dropout`: Monte-Carlo Dropout (Gal & Ghahramani, "Dropout as a Bayesian Approximation",
ICML 2016) with torch-uncertainty's wrapper.

One network trained with dropout; at evaluation its dropout stays on and M stochastic passes
(the batch repeated M times, member-major) form the ensemble. M is the number of passes.

Where the dropout goes (``placement``):

- ``every_layer`` (Gal & Ghahramani: a Bernoulli variational distribution on the weights of
  every layer is dropout on the input of every weight layer): element-wise ``nn.Dropout(rate)``
  before every ``Conv2d`` and ``Linear`` except the stem, whose input is the image (as
  uncertainty-baselines' non-residual mode, ``wide_resnet_dropout.py`` ``apply_dropout`` after
  the stem conv onwards, and Gal & Ghahramani's Bayesian CNNs, dropout after every conv layer).
  The backbone's own dropouts are built with rate 0.
- ``residual`` (uncertainty-baselines' CIFAR recipe, ``baselines/cifar/dropout.py`` defaults
  ``residual_dropout=True``, ``filterwise_dropout=False``; ``uncertainty_baselines/models/
  wide_resnet_dropout.py`` ``basic_block``): element-wise dropout on the output of the first
  conv of every residual block and nowhere else. torch-uncertainty's WideResNet block holds its
  channel-wise ``Dropout2d`` at that very place (conv1 → dropout → BN), so this placement makes
  those element-wise and turns the head's ``final_dropout`` off. WideResNets only.
- ``backbone``: the backbone's own placement at ``dropout_rate`` (torch-uncertainty's ResNet and
  WRN: channel-wise ``Dropout2d`` once per block and ``Dropout`` before the head; the digits
  CNN: before the head only; timm's ViT and the text encoders: their ``drop_rate``/hidden
  dropouts). This was the only placement before.
- ``auto`` (default): ``every_layer`` on the convolutional families
  (:data:`CONV_FAMILIES`), ``backbone`` elsewhere.

``last_layer: true`` is torch-uncertainty's option: only the last dropout module stays on at
evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor, nn

from methods._base import BuildContext, EnsembleModel, MethodSpec, register_method, to_members

#: Backbone families whose weight layers are convolutions (and the linear head).
CONV_FAMILIES = ("cnn", "resnet", "wideresnet", "wideresnet28x8", "torchvision")


@dataclass(frozen=True)
class MCDropoutHparams:
    dropout_rate: float = field(default=0.1, metadata={"gt": 0, "lt": 1})
    last_layer: bool = field(default=False, metadata={"help": "dropout before the head only"})
    placement: Literal["auto", "every_layer", "residual", "backbone"] = field(
        default="auto",
        metadata={"help": "before every weight layer, UB's residual branch, or the backbone's"},
    )


def _drop_input(module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the weight layer's input through its ``input_dropout``."""
    return (module.input_dropout(args[0]), *args[1:])


def dropout_before_weight_layers(net: nn.Module, rate: float) -> int:
    """Element-wise dropout on the input of every Conv2d/Linear of ``net`` but the first (the
    stem); returns how many. The dropout is a child module (``input_dropout``) applied by a
    pre-hook, so torch-uncertainty's wrapper finds it and the state dict keeps its keys."""
    layers = [m for m in net.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    for layer in layers[1:]:
        layer.input_dropout = nn.Dropout(rate)
        layer.register_forward_pre_hook(_drop_input)
    return len(layers) - 1


def residual_branch_dropout(net: nn.Module, rate: float) -> int:
    """torch-uncertainty's WideResNet with UB's residual dropout: every block's ``Dropout2d``
    becomes element-wise ``Dropout(rate)``, the head's ``final_dropout`` is off; returns how
    many blocks."""
    blocks = [m for m in net.modules() if isinstance(getattr(m, "dropout", None), nn.Dropout2d)]
    if not hasattr(net, "final_dropout") or not blocks:
        raise ValueError(
            "placement 'residual' (uncertainty-baselines' WRN) needs torch-uncertainty's "
            f"WideResNet (wrn28_10, wrn28_8), got {type(net).__name__}"
        )
    for block in blocks:
        block.dropout = nn.Dropout(rate)
    net.final_dropout = nn.Dropout(0.0)
    return len(blocks)


def resolve_placement(ctx: BuildContext, hp: MCDropoutHparams) -> str:
    if hp.placement != "auto":
        return hp.placement
    return "every_layer" if ctx.family in CONV_FAMILIES else "backbone"


class MCDropout(EnsembleModel):
    def __init__(self, ctx: BuildContext, hp: MCDropoutHparams) -> None:
        super().__init__()
        from torch_uncertainty.methods import mc_dropout

        self.num_members = ctx.num_members
        self.placement = resolve_placement(ctx, hp)
        if self.placement == "every_layer":
            core = ctx.build_backbone(dropout_rate=0.0)
            dropout_before_weight_layers(core, hp.dropout_rate)
        else:
            core = ctx.build_backbone(dropout_rate=hp.dropout_rate)
            if self.placement == "residual":
                residual_branch_dropout(core, hp.dropout_rate)
        self.net = mc_dropout(
            core, num_estimators=ctx.num_members, last_layer=hp.last_layer, on_batch=True
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.training:  # one stochastic pass of the single network
            return self.net(x).unsqueeze(0)  # (1, B, K)
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)


register_method(
    MethodSpec(
        name="mc_dropout",
        build=lambda ctx, hp: MCDropout(ctx, hp),
        hparams=MCDropoutHparams,
        reference="Gal & Ghahramani, ICML 2016",
        stochastic_eval=True,
    )
)
