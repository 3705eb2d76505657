"""A real 2-epoch σN-Ens cell through the harness's cell runner, on synthetic data: the step
mode of each epoch, read from its record (the check that a cell stays CUDA-graphed after its
first epoch).

    OUT=artifacts/gpu python benchmarks/gpu_cell.py          # ResNet-18, 32×32, B=128, on a GPU
    SMALL=1 OUT=/tmp/x python benchmarks/gpu_cell.py         # the digits CNN at 8×8, on the CPU

The data are random uint8 images (fixed seed) registered as a dataset here, so the check needs
no download and no scikit-learn (an offline GPU machine with only torch and the wheels of
benchmarks/gpu_wheels.sh runs it). The suite (2 epochs, no corruptions, OOD sets, calibration
or cost measurement) and the cell's folder are written under ``$OUT/cell``. Prints one JSON line:
each epoch's step mode, why a graphed step fell back if it did, and the epochs' seconds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.config.parse import load_suite
from harness.data._machinery.base import DatasetSpec, ImageSet, register_dataset
from harness.engine.runner import run_cell

SMALL = os.environ.get("SMALL") == "1"
SHAPE = (1, 8, 8) if SMALL else (3, 32, 32)
BACKBONE = "digits_cnn" if SMALL else "resnet18"
BATCH = 16 if SMALL else 128
STEPS = 8  # steps per epoch: 3 eager warm-up steps, the capture, replays; epoch 2 all replays


def _load(root: Path) -> dict[str, ImageSet]:
    g = torch.Generator().manual_seed(0)

    def split(n: int) -> ImageSet:
        images = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=g)
        return ImageSet(images, torch.randint(0, 10, (n,), generator=g))

    return {"train": split(BATCH * STEPS), "test": split(4 * BATCH)}


SUITE = f"""
name: gpu_cell
grid:
  datasets: [gpu_check_synthetic]
  backbones: [{BACKBONE}]
  M: [4]
  seeds: [0]
  methods: [sigma_ens]
recipe:
  epochs: 2
  batch_size: {BATCH}
  augment: none
evaluation:
  corruptions: []
  ood: []
  calibrate: false
  cost: false
"""


def main() -> int:
    out = Path(os.environ.get("OUT", "artifacts/gpu")) / "cell"
    out.mkdir(parents=True, exist_ok=True)
    register_dataset(
        DatasetSpec(
            name="gpu_check_synthetic",
            in_shape=SHAPE,
            num_classes=10,
            mean=(0.5,) * SHAPE[0],
            std=(0.25,) * SHAPE[0],
            load=_load,
            location=lambda root: root,
            description="benchmarks/gpu_cell.py: random images, fixed seed",
        )
    )
    suite_file = out / "suite.yaml"
    suite_file.write_text(SUITE)
    (cell,) = load_suite(suite_file).cells()
    rec = run_cell(cell, out / "results", data_root=out / "data", progress=False, force=True)
    history = rec.get("history", [])
    row = {
        "status": rec.get("status"),
        "device": rec.get("cost", {}).get("device") or rec.get("environment", {}).get("device"),
        "step_modes": [h.get("step_mode") for h in history],
        "epoch_s": [round(h.get("time_s", 0.0), 3) for h in history],
        "error": rec.get("error"),
    }
    print(json.dumps(row))
    (out / "cell.json").write_text(json.dumps(row, indent=1) + "\n")
    return 0 if rec.get("status") == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
