"""Under the shipped CIFAR suites' λ, L_div is not negligible next to the task loss at the start
of training: ‖∇γ L_div‖ / ‖∇γ L_task‖ ≥ 0.1 on ResNet-18 after a few steps (CPU, fabricated
CIFAR-shaped data)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.config.parse import load_suite
from harness.engine.train import ensemble_loss, make_optimizer
from harness.registry import METHODS
from methods._base import BuildContext
from tests.sigma_helpers import _single_thread  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[2]
CIFAR_SUITES = ("tau_sweep", "finetune", "vit_cifar", "cifar100_wrn", "cifar10_resnet18")
# The suites' working τ. The ratio falls as λ/τ²: a τ sweep at fixed λ necessarily reaches τ where
# L_div is negligible (that is how high τ switches diversity off), so only τ ≤ TAU_MAX is pinned.
TAU_MAX = 0.5


def _shipped_pairs() -> dict[float, float]:
    """λ → the largest τ ≤ TAU_MAX it is used with in any shipped CIFAR suite (the hardest case
    for that λ)."""
    pairs: dict[float, float] = {}
    for name in CIFAR_SUITES:
        for cell in load_suite(REPO / "suites" / f"{name}.yaml").cells():
            hp = cell.hparams
            if cell.method != "sigma_ens" or hp["tau"] > TAU_MAX or hp["lam"] == 0:
                continue
            pairs[hp["lam"]] = max(pairs.get(hp["lam"], 0.0), hp["tau"])
    return pairs


def test_every_shipped_cifar_suite_uses_a_measured_lambda():
    pairs = _shipped_pairs()
    assert pairs, "no σN-Ens cell with τ ≤ 0.5 in the shipped CIFAR suites"
    assert min(pairs) >= 0.005  # 1e-4 (the old default) gave a ratio of ~1e-3


@pytest.mark.slow
@pytest.mark.parametrize(("lam", "tau"), sorted(_shipped_pairs().items()))
def test_gradient_ratio_at_the_first_epoch_is_not_negligible(lam, tau):
    torch.manual_seed(0)
    spec = METHODS.get("sigma_ens")
    ctx = BuildContext("resnet18", (3, 32, 32), 100, 4, seed=0)
    model = spec.build(ctx, spec.make_hparams({"tau": tau, "lam": lam}))
    suite = load_suite(REPO / "suites" / "tau_sweep.yaml")
    recipe = suite.recipe  # the shared CIFAR recipe (SGD, lr 0.1, weight decay 5e-4)
    opt = make_optimizer(model, recipe)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 3, 32, 32, generator=g)  # 3 steps of 8 CIFAR-shaped images
    y = torch.randint(0, 100, (3, 8), generator=g)
    model.train()
    for step in range(3):
        loss = ensemble_loss(model, x[step], y[step], recipe)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    diag = model.diagnostics()
    assert diag["grad_ratio"] >= 0.1, f"λ={lam}, τ={tau}: ratio {diag['grad_ratio']:.3g}"
    assert diag["grad_ratio"] < 100  # and not so large that γ only follows L_div
