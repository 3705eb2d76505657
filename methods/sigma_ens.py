"""`sigma_ens`: σN-Ens, the normalization-based implicit ensemble with controllable diversity
(Suteu & Serban, "Controllable Diversity in Normalization-Based Implicit Ensembles via
Softmax-Temperature Modulation", 2026).

Every normalization layer of the backbone becomes M member-specific normalizations scaled by
sigmoid(γ_m); all other weights are shared. The loss adds
L_div = λ Σ_ℓ Σ_i Σ_m log softmax(sigmoid(γ_{·,ℓ,i}) / τ)_m, whose equilibrium τ sets (low τ:
one member owns each feature; high τ: features shared). τ and λ may follow a schedule.

Where the paper is silent, the harness chooses (each reachable the old way by a hyper-parameter):

- **γ initialisation: near-identity.** γ ~ N(3, 0.1²) per member and feature, so
  sigmoid(γ) = 0.953 (±1 std: 0.948–0.957). With diversity off the model then behaves like the
  backbone it wraps. The gate multiplies the member affine w, so the effective scale w·s moves
  at s² of the backbone's learning rate and weight decay on w pulls it 1/s² as hard: a gate at
  0.5 (γ ~ N(0, 1)) made the ensemble strongly under-confident, and even 0.9 (γ = 2.2) left it
  measurably so. Measured on digits_hard with λ = 0, 10 seeds (suites/claims/diversity_off.yaml):
  ECE 7.3% at γ = 2.2, 6.1% at γ = 3 and γ = 4, against 6.25% for `single`. 3 rather than 4
  keeps sigmoid'(γ) = 0.045 (0.018 at 4), so L_div still moves γ at a useful speed. The 0.1
  spread breaks the symmetry (with equal γ, L_div has zero gradient and members get identical
  updates) while changing each feature's scale by only ~0.5% between members.
  ``gamma_init_mean: 0, gamma_init_std: 1`` gives the previous N(0, 1).
- **Gate fold** (``gate_fold``, default "none"). ``constant`` multiplies every gate by the
  constant c = 1/sigmoid(γ0), γ0 = ``gamma_init_mean``: with γ0 = 0 the gate starts where the
  sigmoid is steep (sigmoid'(0) = 0.25) and c·sigmoid(γ0) = 1 keeps the backbone's scale and
  the member affine's learning rate at init — what the pretrained conversion does with
  1/sigmoid(γ_m) per member, here one fixed number (``methods/_sigma/norm_base.py``).
- **No weight decay on γ** (``gamma_weight_decay: 0``): γ is a gate, not a weight; like
  BatchEnsemble's fast weights it is exempt. Decay on γ (5e-4·|γ|) outweighed L_div's pull at
  λ = 1e-4 by orders of magnitude. ``gamma_weight_decay: null`` decays γ with the recipe's value.
- **Per-member parameters get their member's full gradient** (``member_grad``, see
  ``methods/_sigma/norm_ensemble.py``).
- The random γ draw uses an explicit generator seeded from the cell's seed.

Per-epoch diagnostics (computed once per epoch, on the last training batch): k_eff on sigmoid(γ)
and on the effective member scale |w_m·sigmoid(γ_m)|, per layer and overall, and the gradient
ratio ‖∇γ L_div‖ / ‖∇γ L_task‖ (``methods/_sigma/diversity.py``).

Pretrained conversion (``pretrained`` path or ``pretrain_epochs`` > 0, run by the harness): the
trained norms are copied into every member and the affine parameters divided by sigmoid(γ_m), so
at step 0 every member reproduces the original model's logits exactly (to float32 rounding; see
``methods/_sigma/convert.py``); the ensemble is then fine-tuned for the recipe's epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.contract import Diagnostic, DiagnosticFigure
from methods._base import (
    MethodSpec,
    TrainOutput,
    pretrain_epochs_field,
    pretrained_field,
    register_method,
)
from methods._sigma.diversity import diversity_loss, gradient_ratio, sharing_diagnostics
from methods._sigma.norm_ensemble import NormEnsemble

GAMMA_INIT_MEAN = 3.0  # sigmoid(3) = 0.953: near-identity gate (measured choice, see above)
GAMMA_INIT_STD = 0.1  # ~0.5% spread of the member scales: symmetry breaking only
#: Images of the last training batch the per-epoch gradient diagnostic uses at most (our
#: choice: CIFAR's whole batch of 128, a bounded sub-batch at ImageNet batch sizes).
DIAGNOSTIC_ROWS = 128


@dataclass(frozen=True)
class SigmaEnsHparams:
    tau: float = field(default=1.0, metadata={"gt": 0, "help": "softmax temperature τ"})
    lam: float = field(default=1e-3, metadata={"ge": 0, "help": "regularizer weight λ"})
    schedule: Literal["constant", "linear", "cosine"] = field(
        default="constant", metadata={"help": "τ/λ schedule from (tau, lam) to the *_end values"}
    )
    tau_end: float | None = field(default=None, metadata={"gt": 0})
    lam_end: float | None = field(default=None, metadata={"ge": 0})
    layers: str | None = field(
        default=None, metadata={"help": "regex of regularized σNorm layer names (default: all)"}
    )
    gamma_init_mean: float = field(
        default=GAMMA_INIT_MEAN, metadata={"help": "γ ~ N(mean, std²); 3: sigmoid(γ) ≈ 0.95"}
    )
    gamma_init_std: float = field(default=GAMMA_INIT_STD, metadata={"ge": 0})
    gate_fold: Literal["none", "constant"] = field(
        default="none",
        metadata={
            "help": "constant: multiply every gate by 1/sigmoid(gamma_init_mean), so a gate "
            "started where the sigmoid is steep (γ ≈ 0) leaves the backbone's scale at init"
        },
    )
    gamma_weight_decay: float | None = field(
        default=0.0,
        metadata={"ge": 0, "help": "weight decay of γ (null: the recipe's; default none)"},
    )
    member_weight_decay: float | None = field(
        default=None,
        metadata={"ge": 0, "help": "weight decay of the member affine (null: the recipe's)"},
    )
    member_grad: Literal["member", "mean"] = field(
        default="member",
        metadata={"help": "per-member params get their member's loss gradient (×M) or 1/M"},
    )
    pretrained: str | None = pretrained_field()
    pretrain_epochs: int = pretrain_epochs_field()


def gate_gain(hp: SigmaEnsHparams) -> float:
    """The constant c of c·sigmoid(γ): 1/sigmoid(γ0) under ``gate_fold: constant``, else 1.

    With γ0 = ``gamma_init_mean`` the folded gate starts at c·sigmoid(γ0) = 1 (±
    c·sigmoid'(γ0)·std per member), so the member affine w and its learning rate are the
    backbone's at init, as after the pretrained conversion, while γ sits where the sigmoid is
    steep (sigmoid'(0) = 0.25 against 0.045 at γ = 3) and the task loss and L_div move it.
    """
    if hp.gate_fold == "none":
        return 1.0
    return 1.0 / (1.0 / (1.0 + math.exp(-hp.gamma_init_mean)))


class SigmaEnsemble(NormEnsemble):
    """σN-Ens on any backbone; forward (M, B, K)."""

    variant = "sigma"

    def __init__(self, ctx: Any, hp: SigmaEnsHparams) -> None:
        super().__init__(ctx, hp)
        self._progress = 0.0
        self._last_batch: tuple[Tensor, Tensor] | None = None
        # τ and λ of the current epoch as tensors on the model's device, updated in place by
        # set_progress: a training step captured once as a CUDA graph reads the schedule's
        # current values at every replay (a Python float would be frozen at capture). Not
        # saved (persistent=False): set_progress fills them at every epoch's start.
        tau, lam = self.current()
        self.register_buffer("_tau", torch.tensor(tau), persistent=False)
        self.register_buffer("_lam", torch.tensor(lam), persistent=False)

    def convert_kwargs(self, hp: SigmaEnsHparams) -> dict[str, Any]:
        return {
            "gamma_init_mean": hp.gamma_init_mean,
            "gamma_init_std": hp.gamma_init_std,
            "gate_gain": gate_gain(hp),
        }

    def member_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """The member affine (see the base), then γ with ``gamma_weight_decay`` (None: the
        recipe's value; default 0)."""
        gammas = [layer.gamma for _, layer in self.norm_layers() if layer.gamma is not None]
        wd = self.hp.gamma_weight_decay
        return [
            *super().member_groups(weight_decay),
            {"params": gammas, "weight_decay": weight_decay if wd is None else wd},
        ]

    def training_outputs(self, x: Tensor, y: Tensor) -> TrainOutput:
        # Keep a reference (no copy, no sync) for the once-per-epoch gradient diagnostics, and
        # the autocast the step ran under, so the diagnostics run in the training precision.
        self._last_batch = (x, y)
        kind = x.device.type
        try:
            self._autocast = (kind, torch.get_autocast_dtype(kind), torch.is_autocast_enabled(kind))
        except RuntimeError:  # a device type without autocast (``meta``): nothing to replay
            self._autocast = None
        return super().training_outputs(x, y)

    def set_progress(self, epoch: int, num_epochs: int) -> None:
        self._progress = epoch / max(num_epochs - 1, 1)
        tau, lam = self.current()
        with torch.no_grad():  # in place: a captured step reads these very tensors
            self._tau.fill_(tau)
            self._lam.fill_(lam)

    def current(self) -> tuple[float, float]:
        """(τ, λ) at the current point of the schedule."""
        hp = self.hp
        if hp.schedule == "constant":
            return hp.tau, hp.lam
        t = (
            self._progress
            if hp.schedule == "linear"
            else 0.5 * (1 - math.cos(math.pi * self._progress))
        )
        tau_end = hp.tau if hp.tau_end is None else hp.tau_end
        lam_end = hp.lam if hp.lam_end is None else hp.lam_end
        # τ interpolates geometrically: it acts as a scale (1/τ bounds the logit gap).
        return hp.tau * (tau_end / hp.tau) ** t, hp.lam + (lam_end - hp.lam) * t

    def regularizer(self) -> Tensor | None:
        """λ·L_div at the schedule's current τ and λ (device tensors: no host read, and a
        captured step follows the schedule); None when λ is 0 at both ends of the schedule."""
        hp = self.hp
        if hp.lam == 0 and not hp.lam_end:
            return None
        return diversity_loss(self.net, self._tau, self._lam, hp.layers)

    def gradient_diagnostics(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        """‖∇γ L_div‖ / ‖∇γ L_task‖ on one batch, without side effects on the model.

        The forward runs in training mode (batch statistics, as in a training step) with the
        task loss of training: the mean over members of each member's cross-entropy (without
        the recipe's label smoothing). BatchNorm running statistics and the random state are
        restored afterwards, so diagnostics never change the training trajectory.

        Precision and size are the training step's: the forward and backward run under the
        autocast the last training step ran under (bf16 on a GPU recipe; a float32 pass would
        need twice the activation memory of training), on the first :data:`DIAGNOSTIC_ROWS`
        images of the batch at most (the whole batch up to that size, e.g. CIFAR's B = 128; a
        bounded sub-batch at ImageNet batch sizes, where M·B images of a second forward and
        backward could run out of memory).

        Args:
            x: (B, C, H, W) inputs; y: (B,) targets.
        """
        x, y = x[:DIAGNOSTIC_ROWS], y[:DIAGNOSTIC_ROWS]
        kind, dtype, enabled = getattr(self, "_autocast", None) or (x.device.type, None, False)
        tau, lam = self.current()
        was_training = self.training
        buffers = {k: b.clone() for k, b in self.named_buffers()}
        devices = [x.device] if x.device.type == "cuda" else []
        try:
            with (
                torch.random.fork_rng(devices=devices),
                torch.enable_grad(),
                torch.autocast(kind, dtype=dtype, enabled=enabled),
            ):
                self.train()
                logits = self(x).float()  # (M, B, K)
                m = logits.shape[0]
                task = F.cross_entropy(logits.flatten(0, 1), y.repeat(m))  # mean over M·B
                return gradient_ratio(self.net, task, tau, lam, self.hp.layers)
        finally:
            with torch.no_grad():
                for k, b in self.named_buffers():
                    b.copy_(buffers[k])
            self.train(was_training)

    def diagnostics(self) -> dict[str, Any]:
        tau, lam = self.current()
        with torch.no_grad():
            diag = sharing_diagnostics(self.net, self.hp.layers)
            l_div = diversity_loss(self.net, tau, 1.0, self.hp.layers)
        out = {**diag, "tau": tau, "lam": lam, "l_div": float(l_div)}
        if self._last_batch is not None:
            ratio = self.gradient_diagnostics(*self._last_batch)
            out["grad_ratio"] = ratio["grad_ratio"]
            for name, values in ratio["layers"].items():
                out["layers"][name].update(values)
        return out


register_method(
    MethodSpec(
        name="sigma_ens",
        build=lambda ctx, hp: SigmaEnsemble(ctx, hp),
        hparams=SigmaEnsHparams,
        reference="Suteu & Serban, 2026",
        pretrained_conversion=True,
        diagnostics=(
            Diagnostic(
                "k_eff",
                "k_eff",
                "Diversity",
                "f2",
                figure=DiagnosticFigure(
                    x="tau",
                    id="fig-keff",
                    title="σN-Ens k_eff vs τ",
                    caption="k_eff = 1/Σ q_m² of the last epoch, mean over layers; "
                    "dotted: 1 and M.",
                    x_label="τ",
                    y_label="k_eff (1 = owned, M = shared)",
                    reference_lines=(1.0, "M"),
                ),
            ),
            # On |w_m·sigmoid(γ_m)|: the member affine too.
            Diagnostic("k_eff_scale", "k_eff (scale)", "Diversity", "f2"),
            # ‖∇γ L_div‖ / ‖∇γ L_task‖ of the first epoch: whether λ matters at the start.
            Diagnostic("grad_ratio", "∇ ratio ep.1", "Diversity", "f2", epoch="first"),
            Diagnostic(
                "importance", "mean sigmoid(γ)", "Diversity", "f3", column="importance_mean"
            ),
            Diagnostic("l_div", "L_div", "Diversity", "f3"),
        ),
    )
)
