"""σN-Ens's per-epoch gradient diagnostic runs in the training step's precision, on a bounded
number of images (methods.sigma_ens.SigmaEns.gradient_diagnostics)."""

from __future__ import annotations

import math

import torch
from torch import nn

import methods.sigma_ens as sigma_ens
from harness.config.suite import expand_hparams
from harness.registry import METHODS
from methods._base import BuildContext


def test_diagnostic_uses_the_training_autocast_and_a_bounded_batch(monkeypatch):
    monkeypatch.setattr(sigma_ens, "DIAGNOSTIC_ROWS", 4)
    spec = METHODS.get("sigma_ens")
    torch.manual_seed(0)
    model = spec.build(
        BuildContext("digits_cnn", (1, 8, 8), 8, 2), spec.hparams(**expand_hparams(spec, {})[0])
    )
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 8, (8,))
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.training_outputs(x, y)
    seen: list[tuple[int, torch.dtype]] = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(lambda mod, i, out: seen.append((out.shape[0], out.dtype)))
    diag = model.diagnostics()  # called outside autocast, as the runner does
    assert math.isfinite(diag["grad_ratio"]) and diag["grad_ratio"] > 0
    assert seen and all(rows == 2 * 4 for rows, _ in seen)  # M · DIAGNOSTIC_ROWS images
    assert all(dtype == torch.bfloat16 for _, dtype in seen)  # the step's bf16 autocast
