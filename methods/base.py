"""The one interface every ensemble method implements.

Layout convention (DESIGN.md §2/§3): member predictions are **(M, B, K)** at the method boundary.
Libraries such as torch-uncertainty return **(M·B, K)** member-major (row ``m·B + b``); the
conversion happens only in :func:`to_members`, which is tested on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from harness.registries import METHODS


def to_members(flat: Tensor, num_members: int) -> Tensor:
    """Reshape member-major stacked outputs to the ensemble layout.

    Args:
        flat: (M·B, K) logits, row ``m·B + b`` belongs to member m and sample b.
        num_members: M.

    Returns:
        (M, B, K) view.
    """
    if flat.shape[0] % num_members:
        raise ValueError(f"{flat.shape[0]} rows cannot be split into {num_members} members")
    return flat.view(num_members, flat.shape[0] // num_members, *flat.shape[1:])  # (M, B, K)


def repeat_members(x: Tensor, num_members: int) -> Tensor:
    """Repeat a batch member-major: (B, ...) → (M·B, ...) with row ``m·B + b`` = ``x[b]``."""
    return x.repeat(num_members, *([1] * (x.dim() - 1)))  # (M·B, ...)


@dataclass(frozen=True)
class BuildContext:
    """What a method needs to build itself for one cell.

    Attributes:
        backbone: Backbone registry name.
        in_shape: (C, H, W) of one input image.
        num_classes: K.
        num_members: M.
        backbone_kwargs: Extra keyword arguments for the backbone builder (from the suite).
        pretrained: State dict of a trained single backbone, for methods that convert one.
    """

    backbone: str
    in_shape: tuple[int, int, int]
    num_classes: int
    num_members: int
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    pretrained: dict[str, Tensor] | None = None

    def build_backbone(self, **overrides: Any) -> nn.Module:
        """Build one plain member of the registered backbone."""
        from harness.registries import BACKBONES

        spec = BACKBONES.get(self.backbone)
        return spec.build(self.in_shape, self.num_classes, **{**self.backbone_kwargs, **overrides})


class EnsembleModel(nn.Module):
    """Base class of all ensemble models.

    Subclasses implement :meth:`forward` returning (M, B, K) logits. The defaults below suit
    methods whose every member sees the full batch during training.
    """

    num_members: int
    # How member losses combine (harness.train.ensemble_loss): "mean" when members share
    # weights, "sum" when each member has its own weights and should train as if alone.
    member_loss: str = "mean"

    def forward(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        """Args: x (B, C, H, W). Returns: member logits (M, B, K)."""
        raise NotImplementedError

    def training_outputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Logits and matching targets for the training loss.

        Args:
            x: (B, C, H, W) inputs.
            y: (B,) integer targets.

        Returns:
            logits (M, B', K) and targets (M, B'); B' = B unless the method splits the batch
            between members (BatchEnsemble's "paper" strategy).
        """
        logits = self(x)  # (M, B, K)
        return logits, y.unsqueeze(0).expand(logits.shape[0], -1)  # (M, B)

    def regularizer(self) -> Tensor | None:
        """Method-specific loss term added to the task loss (σN-Ens's L_div), or None."""
        return None

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer parameter groups; override for recipe deltas (no decay on fast weights)."""
        return [
            {
                "params": [p for p in self.parameters() if p.requires_grad],
                "weight_decay": weight_decay,
            }
        ]

    def set_progress(self, epoch: int, num_epochs: int) -> None:
        """Called at the start of every epoch, for hyper-parameter schedules."""

    def diagnostics(self) -> dict[str, Any]:
        """JSON-serialisable per-epoch diagnostics (σN-Ens: k_eff per layer)."""
        return {}


@dataclass(frozen=True)
class MethodSpec:
    """Registration record of a method.

    Attributes:
        name: Registry name used in suites.
        build: ``build(ctx, hparams) -> EnsembleModel``.
        hparams: Frozen dataclass type of hyper-parameters with defaults; the single source of
            truth for which keys a suite may set and of which types.
        backbones: Supported backbone names, or None for any registered backbone.
        min_members / max_members: Allowed range of M (max None = unbounded).
        reference: Paper reference shown in ``harness ls`` and reports.
        check: Optional extra validation of (hparams, M) returning error messages.
    """

    name: str
    build: Callable[[BuildContext, Any], EnsembleModel]
    hparams: type
    backbones: tuple[str, ...] | None = None
    min_members: int = 1
    max_members: int | None = None
    reference: str = ""
    check: Callable[[Any, int], list[str]] | None = None

    def hparam_fields(self) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(self.hparams)}


@dataclass(frozen=True)
class NoHparams:
    """For methods without hyper-parameters."""


def register_method(spec: MethodSpec) -> MethodSpec:
    """Register a method spec in the global method registry."""
    METHODS.register(spec.name, spec)
    return spec


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (optionally only those with ``requires_grad``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@torch.no_grad()
def predict_members(model: EnsembleModel, x: Tensor) -> Tensor:
    """Eval-mode member probabilities (M, B, K) in float32."""
    return model(x).float().softmax(-1)  # (M, B, K)
