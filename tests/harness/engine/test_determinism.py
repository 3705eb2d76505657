"""``recipe.deterministic``: deterministic GPU kernels for bit-identical resumes, a speed-only
option (not in the cell id), set per cell both ways."""

from __future__ import annotations

import textwrap

import torch

from harness.config.parse import load_suite
from harness.engine.build import build_model
from harness.registry import DATASETS

SUITE = """
name: det
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0]
  methods: [single]
recipe: {epochs: 1, batch_size: 64, deterministic: DET}
"""


def test_deterministic_is_set_per_cell_and_keeps_the_cell_id(write_suite, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    on, off = (
        load_suite(write_suite(textwrap.dedent(SUITE).replace("DET", v), name=f"{v}.yaml")).cells()[
            0
        ]
        for v in ("true", "false")
    )
    assert on.recipe.deterministic and not off.recipe.deterministic
    assert on.cell_id == off.cell_id  # speed-only: the same computation, up to summation order
    try:
        build_model(on, DATASETS.get("digits"))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        build_model(off, DATASETS.get("digits"))  # the next cell in the same worker
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cudnn.deterministic
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
