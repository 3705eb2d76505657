"""`packed_ensemble`: Packed-Ensembles (Laurent et al., "Packed-Ensembles for Efficient
Uncertainty Estimation", ICLR 2023), torch-uncertainty's models and layers.

M members packed into grouped convolutions of a network α times wider, each member split into
γ groups. Every member sees the whole batch; the output is (M·B, K) member-major; member losses
are averaged (torch-uncertainty's routine averages the cross-entropy over all M·B rows).

``alpha: auto`` sizes the ensemble to a parameter budget: α is the multiple of 1/(16·M) that the
layers accept whose parameter count is closest to ``alpha_reference`` (a method's count at the
same backbone, M and K, e.g. ``sigma_ens``, or a plain number of parameters); it must come within
``alpha_tolerance`` (5%) of it. This makes comparisons across M at equal parameters possible
(at a fixed α Packed shrinks as M grows: each member gets α/M of the width).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from methods._base import (
    BuildContext,
    EnsembleModel,
    MethodSpec,
    Reduction,
    TrainOutput,
    register_method,
    to_members,
)
from methods._tu.common import TU_FAMILIES, build_tu, digits_cnn

STEPS_PER_UNIT = 16  # α grid of alpha: auto: multiples of 1/(16·M)


@dataclass(frozen=True)
class PackedHparams:
    alpha: float | Literal["auto"] = field(
        default=2.0, metadata={"gt": 0, "help": "width expansion α, or auto (sized to a budget)"}
    )
    gamma: int = field(default=2, metadata={"ge": 1, "help": "groups per member γ"})
    alpha_reference: str | int | None = field(
        default=None,
        metadata={"help": "alpha: auto matches this method's parameter count, or this count"},
    )
    alpha_tolerance: float = field(
        default=0.05,
        metadata={"gt": 0, "lt": 1, "help": "alpha: auto's allowed relative count difference"},
    )
    # torch-uncertainty's routine averages the cross-entropy over all M·B rows, so each member's
    # (unshared, grouped) weights get 1/M of the gradient they would get alone; "sum" trains every
    # member at the recipe's learning rate, as the harness's deep ensemble and MIMO do.
    loss_reduction: Literal["mean", "sum"] = field(
        default="mean",
        metadata={"help": "member losses: mean (torch-uncertainty) or sum (each as if alone)"},
    )


class PackedEnsemble(EnsembleModel):
    def __init__(
        self,
        net,
        num_members: int,
        alpha: float,
        loss_reduction: Reduction = "mean",
        gamma: int = 1,
    ) -> None:
        super().__init__()
        self.net = net
        self.gamma = gamma  # the requested γ (gamma_effective: what each layer has)
        self.num_members = num_members
        self.alpha = alpha  # the resolved α (alpha: auto is solved at build time)
        self.loss_reduction = loss_reduction

    def forward(self, x: Tensor) -> Tensor:
        return to_members(self.net(x), self.num_members)  # (M·B, K) → (M, B, K)

    def training_outputs(self, x: Tensor, y: Tensor) -> TrainOutput:
        """Every member on the whole batch; member losses combined by ``loss_reduction``."""
        out = super().training_outputs(x, y)
        return TrainOutput(out.logits, out.targets, self.loss_reduction)

    def diagnostics(self) -> dict[str, Any]:
        """α, and the γ each packed layer really has (``gamma_effective``, layer name → γ;
        None for a ``first`` layer, which is one dense group): torch-uncertainty lowers γ where a
        group would get fewer than ``minimum_channels_per_group`` (64) input channels, e.g. 14
        of the 19 convolutions of ResNet-18 at α=2, γ=2, M=4 run at γ=1."""
        gammas = effective_gammas(self.net)
        heads = {n for n, layer in self.net.named_modules() if getattr(layer, "last", False)}
        lowered = sum(  # hidden layers below the requested γ (heads are γ=1 by design)
            1 for n, g in gammas.items() if g is not None and g < self.gamma and n not in heads
        )
        return {"alpha": self.alpha, "gamma_effective": gammas, "gamma_lowered_layers": lowered}


def effective_gammas(net: torch.nn.Module) -> dict[str, int | None]:
    """{layer name: groups per member} of every PackedConv2d/PackedLinear of ``net``."""
    from torch_uncertainty.layers import PackedConv1d, PackedConv2d, PackedConv3d, PackedLinear

    out: dict[str, int | None] = {}
    for name, layer in net.named_modules():
        if isinstance(layer, PackedConv1d | PackedConv2d | PackedConv3d):
            groups = layer.conv.groups
        elif isinstance(layer, PackedLinear):
            groups = layer.groups
        else:
            continue
        out[name] = None if layer.first else groups // layer.num_estimators
    return out


def _digits(ctx: BuildContext, alpha: float, gamma: int):
    from torch_uncertainty.layers import PackedConv2d, PackedLinear

    m = ctx.num_members
    # Digits' channel counts are far below the library default of 64 channels per group.
    return digits_cnn(
        ctx,
        conv=lambda ci, co, first: PackedConv2d(
            ci,
            co,
            3,
            alpha=alpha,
            num_estimators=m,
            gamma=1 if first else gamma,
            padding=1,
            bias=False,
            first=first,
            minimum_channels_per_group=1,
        ),
        # The head: one group per member (γ=1), as torch-uncertainty's packed ResNet/WRN heads
        # (``PackedLinear(..., last=True)`` at its default gamma=1); γ splits hidden layers only.
        linear=lambda fi, fo: PackedLinear(fi, fo, alpha=alpha, num_estimators=m, last=True),
        channels=alpha,
    )


def _build_net(ctx: BuildContext, alpha: float, gamma: int):
    from torch_uncertainty.models.classification import packed_resnet, packed_wideresnet28x10

    if ctx.family == "transformer":  # text_transformer from the library's packed layers
        from methods._tu.text import packed_text_transformer

        return packed_text_transformer(ctx, alpha, gamma)
    return build_tu(
        ctx,
        packed_resnet,
        packed_wideresnet28x10,
        lambda c: _digits(c, alpha, gamma),
        alpha=alpha,
        gamma=gamma,
    )


def _count(build: Any) -> int:
    """Parameters of ``build()``, on the meta device when the build allows it (no memory, no
    init time), else on the CPU; torch's random state is left as it was either way."""
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = build()
        except (RuntimeError, NotImplementedError):  # e.g. .item() in an initialiser
            with torch.device("cpu"), torch.no_grad():
                model = build()
    return sum(p.numel() for p in model.parameters())


def _ctx_key(ctx: BuildContext) -> tuple:
    return (
        ctx.backbone,
        tuple(ctx.in_shape),
        ctx.num_classes,
        ctx.num_members,
        tuple(sorted(ctx.backbone_kwargs.items())),
    )


def _ctx_from_key(key: tuple, num_members: int | None = None) -> BuildContext:
    backbone, in_shape, k, m, kwargs = key
    return BuildContext(backbone, in_shape, k, num_members or m, dict(kwargs))


@functools.lru_cache(maxsize=64)
def reference_count(key: tuple, reference: str) -> int:
    """Parameters of method ``reference`` with its default hyper-parameters on the cell's
    backbone, M (clamped to the method's range) and K."""
    from harness.registry import METHODS

    spec = METHODS.get(reference)
    m = max(spec.min_members, min(key[3], spec.max_members or key[3]))
    ctx = _ctx_from_key(key, m)
    return _count(lambda: spec.build(ctx, spec.make_hparams({})))


@functools.lru_cache(maxsize=256)
def packed_count(key: tuple, alpha: float, gamma: int) -> int | None:
    """Parameters of Packed-Ensembles at (α, γ), or None where the layers reject α."""
    ctx = _ctx_from_key(key)
    try:
        return _count(lambda: _build_net(ctx, alpha, gamma))
    except ValueError:  # channels not divisible by γ·M at this α
        return None


def solve_alpha(
    ctx: BuildContext, gamma: int, budget: int, tolerance: float, max_alpha: float = 16.0
) -> float:
    """The α (a multiple of 1/(16·M)) whose parameter count is closest to ``budget``.

    The count grows with α (up to torch-uncertainty lowering γ where groups get too thin), so a
    bisection over j (α = j/(16·M)) finds where the count crosses the budget, and the α the
    layers accept (channels divisible by γ·M) within 1/M of it, and the nearest accepted on
    either side, are compared; among equal counts the smallest α wins (int() truncation makes
    neighbouring α identical networks).

    Raises:
        ValueError: when the closest count is not within ``tolerance`` of the budget.
    """
    key, m = _ctx_key(ctx), ctx.num_members
    unit = STEPS_PER_UNIT * m
    top = int(max_alpha * unit)

    lo, hi = 1, top
    while lo < hi:  # smallest j whose next valid count reaches the budget
        mid = (lo + hi) // 2
        j = _nearest_valid(key, mid, +1, gamma, unit, top)
        if j is not None and packed_count(key, j / unit, gamma) >= budget:
            hi = mid
        else:
            lo = mid + 1
    # Candidates: the valid α within a unit of the crossing (neighbouring α can be the same
    # network), and always the nearest valid α on either side of it: at large M the layers
    # accept only every (16·M/…)-th step, which can lie outside that window (M = 8 on a
    # 16-channel CNN accepts α in steps of 0.5, i.e. 64 of these steps).
    window = set(range(max(1, lo - STEPS_PER_UNIT), min(top, lo + STEPS_PER_UNIT) + 1))
    window |= {
        j
        for j in (
            _nearest_valid(key, lo, -1, gamma, unit),
            _nearest_valid(key, lo, +1, gamma, unit, top),
        )
        if j is not None
    }
    found = [
        (j, n) for j in sorted(window) if (n := packed_count(key, j / unit, gamma)) is not None
    ]
    if not found:
        raise ValueError(f"no valid alpha up to {max_alpha} for M={m}, gamma={gamma}")
    j, n = min(found, key=lambda c: (abs(c[1] - budget), c[0]))
    if abs(n - budget) > tolerance * budget:
        raise ValueError(
            f"alpha: auto found no alpha within {tolerance:.0%} of {budget:,} parameters; the "
            f"closest is alpha={j / unit:g} with {n:,} (M={m}, gamma={gamma}); members this "
            "thin take whole channels, so raise alpha_tolerance or widen the backbone"
        )
    return j / unit


def _nearest_valid(
    key: tuple, start: int, step: int, gamma: int, unit: int, top: int | None = None
) -> int | None:
    """The first j from ``start`` (exclusive when walking down) in direction ``step`` whose
    α = j/unit the layers accept, or None before 1 / after ``top``."""
    j = start - 1 if step < 0 else start
    while j >= 1 and (top is None or j <= top):
        if packed_count(key, j / unit, gamma) is not None:
            return j
        j += step
    return None


def resolve_alpha(ctx: BuildContext, hp: PackedHparams) -> float:
    """α as given, or solved for the budget of ``alpha_reference``."""
    if hp.alpha != "auto":
        return float(hp.alpha)
    ref = hp.alpha_reference
    budget = ref if isinstance(ref, int) else reference_count(_ctx_key(ctx), str(ref))
    return solve_alpha(ctx, hp.gamma, budget, hp.alpha_tolerance)


def build(ctx: BuildContext, hp: PackedHparams) -> PackedEnsemble:
    alpha = resolve_alpha(ctx, hp)
    return PackedEnsemble(
        _build_net(ctx, alpha, hp.gamma), ctx.num_members, alpha, hp.loss_reduction, hp.gamma
    )


def check(hp: PackedHparams, num_members: int) -> list[str]:
    from harness.registry import METHODS

    if hp.alpha == "auto":
        ref = hp.alpha_reference
        if ref is None:
            return ["alpha: auto needs alpha_reference (a method name or a parameter count)"]
        if isinstance(ref, str) and ref not in METHODS:
            return [
                f"alpha_reference: unknown method {ref!r}; choices: {', '.join(METHODS.names())}"
            ]
        if ref == "packed_ensemble":
            return ["alpha_reference: packed_ensemble cannot size itself"]
        if isinstance(ref, int) and ref <= 0:
            return [f"alpha_reference: a parameter count must be > 0, got {ref}"]
        return []
    if hp.alpha_reference is not None:
        return ["alpha_reference applies only with alpha: auto"]
    if (hp.alpha * num_members) % 1:
        return [f"alpha·M must be an integer, got alpha={hp.alpha}, M={num_members}"]
    return []


def check_build(ctx: BuildContext, hp: PackedHparams) -> list[str]:
    """``alpha: auto`` solved for the cell's backbone, K and M at validation: a budget no α can
    meet within ``alpha_tolerance`` is a problem of the suite, not of a cell that starts later."""
    if hp.alpha != "auto" or check(hp, ctx.num_members):
        return []
    try:
        resolve_alpha(ctx, hp)
    except ValueError as err:
        return [str(err)]
    return []


register_method(
    MethodSpec(
        name="packed_ensemble",
        build=build,
        hparams=PackedHparams,
        families=(*TU_FAMILIES, "transformer"),
        reference="Laurent et al., ICLR 2023",
        check=check,
        check_build=check_build,
    )
)
