"""Kernels a training step launches, per method, counted by torch.profiler on the device.

    python benchmarks/kernels_per_step.py --backbone resnet18 -o kernels.json   # on a GPU
    SMALL=1 python benchmarks/kernels_per_step.py -o kernels.json                # on the CPU

A GPU step at CIFAR size is launch-bound (docs/benchmarks.md), so the kernel count is the cost a
CUDA graph removes from the host and the count fused kernels lower. Each row is the bare
training step of ``harness bench`` (:func:`harness.engine.cost.bare_steps`: forward, loss,
backward, SGD step) for the bound (the plain backbone on M·B images) and each method at M
members, bf16 autocast and channels_last on CUDA as the bench; after two warm-up steps,
``STEPS`` steps are profiled and every event the profiler puts on the device is counted (CUDA
kernels and memcpy/memset), divided by the steps. On the CPU (``SMALL=1``, no device) the row
counts the ATen operators the profiler records instead, named as such: it proves the script,
not a GPU figure (``benchmarks/op_count.py`` counts dispatched operators below Python).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.contract import Recipe
from harness.engine.cost import bare_steps
from harness.registry import METHODS
from methods._base import BuildContext

SMALL = os.environ.get("SMALL") == "1"
STEPS = 3


def count(method: str, m: int, backbone: str, shape, classes: int, batch: int, device) -> dict:
    """Device events (CUDA) or ATen operators (CPU) per training step of ``method``."""
    spec = METHODS.get(method)
    torch.manual_seed(0)
    members = 1 if method == "single" else m
    model = spec.build(BuildContext(backbone, shape, classes, members), spec.make_hparams({}))
    model.to(device)
    cuda = device.type == "cuda"
    recipe = Recipe(amp=True, channels_last=True)
    rows = batch * (m if method == "single" else 1)  # the bound: the backbone on M·B images
    x = torch.randn(rows, *shape, device=device)
    if cuda:
        model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (rows,), device=device)
    train, _, _ = bare_steps(model, x, y, recipe, device)
    for _ in range(2):
        train()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(STEPS):
            train()
        if cuda:
            torch.cuda.synchronize(device)
    events = prof.events()
    if cuda:
        n = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
        what = "device kernels"
    else:
        n = sum(e.name.startswith("aten::") for e in events)
        what = "ATen operators (CPU: no device kernels)"
    return {"method": method, "M": members, "rows": rows, "per_step": n / STEPS, "counts": what}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backbone", default="digits_cnn" if SMALL else "resnet18",
                    help="backbone (default resnet18; digits_cnn with SMALL=1)")  # fmt: skip
    ap.add_argument("--M", type=int, default=4, help="members (default 4)")
    ap.add_argument("--batch", type=int, default=4 if SMALL else 128, help="B (default 128)")
    ap.add_argument("--methods", nargs="+", default=["sigma_ens", "film_ensemble"],
                    help="methods beside the bound (default sigma_ens film_ensemble)")  # fmt: skip
    ap.add_argument("-o", "--output", type=Path, required=True, help="JSON written here")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not SMALL else "cpu")
    shape, classes = ((1, 8, 8), 10) if args.backbone == "digits_cnn" else ((3, 32, 32), 100)
    rows = []
    for method in ["single", *args.methods]:
        row = count(method, args.M, args.backbone, shape, classes, args.batch, device)
        row["label"] = "bound (backbone on M·B)" if method == "single" else method
        rows.append(row)
        print(f"{row['label']:28s} {row['per_step']:8.0f} {row['counts']} per step", flush=True)
    out = {"backbone": args.backbone, "M": args.M, "batch": args.batch, "device": str(device),
           "rows": rows}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
