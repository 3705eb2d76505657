"""The one interface every ensemble method implements.

Layout convention: member predictions are **(M, B, K)** at the method boundary. Libraries such as
torch-uncertainty return **(M·B, K)** member-major (row ``m·B + b``); the conversion happens only
in :func:`to_members`, which is tested on its own.

The contract leaves nothing to be guessed from shapes or names: a training step returns a
:class:`TrainOutput` (logits, the targets of every row, and how member losses combine), and the
:class:`MethodSpec` declares batch feeding (:class:`BatchFeeding`), stochastic evaluation,
pre-trained conversion and the backbone families the method can be built on.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from harness.contract import Diagnostic
from harness.registry import METHODS


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
        seed: The cell's seed, for methods that draw random structure outside torch's
            initialisers (Masksembles' masks); None draws it from torch's generator instead.
    """

    backbone: str
    in_shape: tuple[int, int, int]
    num_classes: int
    num_members: int
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    pretrained: dict[str, Tensor] | None = None
    seed: int | None = None

    @property
    def family(self) -> str:
        """The backbone's family ("cnn", "resnet", "wideresnet", ...), which picks builders."""
        from harness.registry import BACKBONES

        return BACKBONES.get(self.backbone).family

    def numpy_rng(self, purpose: str) -> np.random.Generator:
        """An explicit NumPy generator for one purpose, fixed by the seed (no global state).

        Without a seed, the seed is drawn from torch's generator, which the runner seeds with
        the cell's seed before building, so a build stays reproducible either way.
        """
        seed = self.seed
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        return np.random.default_rng([seed, zlib.crc32(purpose.encode())])

    def build_backbone(self, **overrides: Any) -> nn.Module:
        """Build one plain member of the registered backbone."""
        from harness.registry import BACKBONES

        spec = BACKBONES.get(self.backbone)
        return spec.build(self.in_shape, self.num_classes, **{**self.backbone_kwargs, **overrides})


Reduction = Literal["mean", "sum"]


@dataclass(frozen=True)
class TrainOutput:
    """What one training forward pass hands to the loss.

    Attributes:
        logits: (M, B', K) member logits; row b' of member m is an image that member saw. A
            method that trains a single network (MC Dropout: one stochastic pass) has M = 1.
        targets: (M, B') integer class of every row (the method permutes or splits them together
            with the images, so they always match the logits).
        reduction: how the M per-member mean cross-entropies combine. ``"mean"`` when members
            share weights (the shared weights get one model's gradient scale); ``"sum"`` when each
            member has its own weights and trains as if alone (deep ensembles; MIMO, Havasi et al.
            eq. 1), so that each member follows the recipe's learning rate instead of 1/M of it.
    """

    logits: Tensor
    targets: Tensor
    reduction: Reduction

    def __post_init__(self) -> None:
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {self.reduction!r}")
        if self.logits.dim() != 3 or tuple(self.targets.shape) != tuple(self.logits.shape[:2]):
            raise ValueError(
                f"logits must be (M, B', K) and targets (M, B'), got {tuple(self.logits.shape)} "
                f"and {tuple(self.targets.shape)}"
            )

    def num_correct(self) -> Tensor:
        """Rows whose member's arg-max equals the row's target (a 0-d tensor: no host sync).

        Divided by :attr:`num_rows` it is the training accuracy averaged over members, the one
        definition that holds for every layout: members on the same images, on permuted copies
        (MIMO) or on disjoint slices (split batches).
        """
        return (self.logits.detach().argmax(-1) == self.targets).sum()

    @property
    def num_rows(self) -> int:
        """M · B'."""
        return self.targets.numel()


FeedingMode = Literal["shared", "split", "independent"]


@dataclass(frozen=True)
class BatchFeeding:
    """How the images of one training step reach the members (a declared, tested property).

    Attributes:
        mode: ``"shared"`` (the harness default): every member sees every image of the step.
            ``"split"``: member m sees only the m-th B/M slice (torch-uncertainty's "paper"
            strategy for BatchEnsemble and Masksembles). ``"independent"``: the training loader
            draws one batch per member, each with its own order and augmentation (deep ensembles,
            Lakshminarayanan et al. 2017); the model then receives (M, B, C, H, W).
        repetitions: rows per image per member (MIMO's batch repetition: each member sees each
            image of the step this many times, in its own order).
    """

    mode: FeedingMode = "shared"
    repetitions: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("shared", "split", "independent"):
            raise ValueError(f"mode must be shared, split or independent, got {self.mode!r}")
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions}")

    def streams(self, num_members: int) -> int:
        """Batches the training loader draws per step: M when independent, else 1."""
        return num_members if self.mode == "independent" else 1

    def images_per_member(self, batch_size: int, num_members: int) -> int:
        """Distinct images each member receives in one step, for a loader batch of B."""
        return batch_size // num_members if self.mode == "split" else batch_size

    def to_json(self, batch_size: int, num_members: int) -> dict[str, Any]:
        """The record's statement of what each member saw per step."""
        images = self.images_per_member(batch_size, num_members)
        return {
            "mode": self.mode,
            "streams": self.streams(num_members),
            "images_per_member_per_step": images,
            "rows_per_member_per_step": images * self.repetitions,
        }


def shared_feeding(hp: Any) -> BatchFeeding:
    """The harness-wide default: every member sees every image of the step."""
    return BatchFeeding()


class EnsembleModel(nn.Module):
    """Base class of all ensemble models.

    Subclasses implement :meth:`forward` returning (M, B, K) logits. The default
    :meth:`training_outputs` suits shared-weight methods whose every member sees the full batch.
    """

    num_members: int

    def forward(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        """Args: x (B, C, H, W). Returns: member logits (M, B, K)."""
        raise NotImplementedError

    def training_outputs(self, x: Tensor, y: Tensor) -> TrainOutput:
        """Logits, matching targets and the loss reduction of one training step.

        Args:
            x: (B, C, H, W) inputs; (M, B, C, H, W), one batch per member, when the method's
                :class:`BatchFeeding` is ``"independent"``.
            y: (B,) integer targets; (M, B) with per-member batches.

        Returns:
            A :class:`TrainOutput`; this default (every member on the whole batch, shared
            weights) uses reduction ``"mean"``.
        """
        logits = self(x)  # (M, B, K)
        return TrainOutput(logits, y.unsqueeze(0).expand(logits.shape[0], -1), "mean")  # (M, B)

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

    def clip_groups(self) -> list[list[nn.Parameter]]:
        """Parameter sets whose gradient norms ``recipe.grad_clip`` clips separately (default:
        one set, the norm over all parameters, as a single network's)."""
        return [list(self.parameters())]

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
        families: Supported backbone families (``BackboneSpec.family``), or None for any
            registered backbone; :attr:`backbones` lists the matching backbone names.
        min_members / max_members: Allowed range of M (max None = unbounded).
        reference: Paper reference shown in ``harness ls`` and reports.
        check: Optional extra validation of (hparams, M) returning error messages.
        check_build: Optional validation that needs the cell's backbone and input shape,
            ``check_build(ctx, hparams) -> messages``; run by ``harness validate`` (and before a
            run) for every method entry × backbone × dataset × M, with a
            :class:`BuildContext` that holds no weights. For what only sizing the model shows
            (Packed-Ensembles' ``alpha: auto`` finding no α within its tolerance).
        batch_feeding: ``batch_feeding(hparams) -> BatchFeeding``: how a training step's images
            reach the members (default: every member sees every image).
        stochastic_eval: Evaluation is random (MC Dropout's passes): two evaluations of the same
            input differ; every other method must be deterministic in eval mode.
        pretrained_conversion: The method converts a trained single backbone; its hparams then
            have ``pretrained`` (path or None) and ``pretrain_epochs`` (int) fields, which the
            runner reads to load or first train that backbone.
        diagnostics: The per-epoch diagnostics (keys of ``model.diagnostics()``) the reporter
            shows, each with its label, group, format, epoch and optional figure
            (:class:`harness.contract.Diagnostic`); the engine writes them into each record.
    """

    name: str
    build: Callable[[BuildContext, Any], EnsembleModel]
    hparams: type
    families: tuple[str, ...] | None = None
    min_members: int = 1
    max_members: int | None = None
    reference: str = ""
    check: Callable[[Any, int], list[str]] | None = None
    check_build: Callable[[BuildContext, Any], list[str]] | None = None
    batch_feeding: Callable[[Any], BatchFeeding] = shared_feeding
    stochastic_eval: bool = False
    pretrained_conversion: bool = False
    diagnostics: tuple[Diagnostic, ...] = ()

    def __post_init__(self) -> None:
        if self.pretrained_conversion and not {"pretrained", "pretrain_epochs"} <= set(
            self.hparam_fields()
        ):
            raise ValueError(
                f"method {self.name!r} declares pretrained_conversion but its hparams lack "
                "'pretrained' and 'pretrain_epochs' fields"
            )

    def problems(self, hp: Any, num_members: int) -> list[str]:
        """Every rule on a cell's hyper-parameters: the conversion rule every
        ``pretrained_conversion`` method shares (:func:`conversion_problems`), then the method's
        own ``check``. The one entry point the validator calls."""
        out = conversion_problems(hp) if self.pretrained_conversion else []
        return out + (list(self.check(hp, num_members)) if self.check else [])

    def hparam_fields(self) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(self.hparams)}

    @property
    def backbones(self) -> tuple[str, ...] | None:
        """Names of the registered backbones of a supported family (None: any backbone)."""
        if self.families is None:
            return None
        from harness.registry import BACKBONES

        return tuple(n for n in BACKBONES.names() if BACKBONES.get(n).family in self.families)

    def make_hparams(self, values: Mapping[str, Any]) -> Any:
        """The hyper-parameter dataclass from a cell's (JSON-shaped) values; lists → tuples.

        Called once per setting when a suite expands (``harness.config.suite.entry_settings``);
        the cells carry the object (``Cell.typed_hparams``) to the validator, the loader's
        batch feeding, the model and the loss, so nothing builds it again."""
        from harness.contract import hparams_values

        return self.hparams(**hparams_values(values))

    def feeding_for(self, values: Mapping[str, Any]) -> BatchFeeding:
        """The declared batch feeding for hyper-parameter values given as JSON (a cell's
        process reads ``batch_feeding(cell.typed_hparams)`` instead)."""
        return self.batch_feeding(self.make_hparams(values))


def pretrained_field(what: str = "convert") -> Any:
    """The ``pretrained`` field of a conversion method's hyper-parameters (one definition for
    σN-Ens, FiLM-Ensemble and ``single_continued``)."""
    return dataclasses.field(
        default=None,
        metadata={
            "help": f"state dict of a trained single model to {what} (harness final.pt or any)"
        },
    )


def pretrain_epochs_field(what: str = "then convert and fine-tune") -> Any:
    """The ``pretrain_epochs`` field of a conversion method's hyper-parameters."""
    return dataclasses.field(
        default=0,
        metadata={"ge": 0, "help": f"train the suite's own single model this long first, {what}"},
    )


def conversion_problems(hp: Any) -> list[str]:
    """The rule every conversion method shares: one source of the trained backbone, a file
    (``pretrained``) or the suite's own single cell (``pretrain_epochs``), not both (which one
    would win is not for the harness to guess)."""
    if getattr(hp, "pretrained", None) and getattr(hp, "pretrain_epochs", 0):
        return ["set either pretrained or pretrain_epochs, not both"]
    return []


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
