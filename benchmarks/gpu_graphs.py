"""On a GPU: for every registered method, three CUDA-graphed training steps against three eager
ones — same initial weights, same batches — through the harness's own loop
(``harness.engine.train.train_epoch`` with and without a ``GraphedStep``). Prints one JSON line
per method: the step mode reached (``graphed``, or ``eager`` with the capture's failure), the
loss of each pass and the largest weight difference relative to the weights' scale.

    python benchmarks/gpu_graphs.py                 # ResNet-18, B=128, bf16, channels_last
    SMALL=1 python benchmarks/gpu_graphs.py         # digits CNN on the CPU (stand-in graph)

bf16 tolerance: the two passes run the same kernels in the same order, so the weights agree to
float32 rounding unless a kernel is non-deterministic (atomics in cuDNN's backward); the check
passes at a relative difference ≤ 1e-2 (bf16's resolution, 2^-8, with room for that), and says
the measured value.

On the CPU (``SMALL=1``) the graph is the tests' stand-in with a CUDA graph's semantics
(tests/graph_standin.py: replays run no Python), so the script's plumbing is checked before a
GPU runs it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.config.suite import expand_hparams
from harness.contract.config import Recipe
from harness.data._machinery.loader import DeviceLoader
from harness.engine.cost import FirstBatches, synthetic_images
from harness.engine.graphed import WARMUP_STEPS, CudaGraphs, GraphedStep, cell_step
from harness.engine.train import make_optimizer, make_scheduler, train_epoch
from harness.registry import METHODS
from methods._base import BuildContext

SMALL = os.environ.get("SMALL") == "1"
DEVICE = torch.device("cpu" if SMALL or not torch.cuda.is_available() else "cuda")
BACKBONE, SHAPE, CLASSES, BATCH = (
    ("digits_cnn", (1, 8, 8), 10, 8) if SMALL else ("resnet18", (3, 32, 32), 100, 128)
)
STEPS = WARMUP_STEPS + 3  # warm-up steps, then the capture and two replays: three graphed steps


def backend() -> CudaGraphs:
    if DEVICE.type == "cuda":
        return CudaGraphs(DEVICE)
    from tests.graph_standin import StandInCuda

    return CudaGraphs(DEVICE, StandInCuda)


def run(name: str, graphed: bool) -> tuple[torch.nn.Module, float, GraphedStep | None]:
    spec = METHODS.get(name)
    m = max(spec.min_members, min(4, spec.max_members or 4))
    params = expand_hparams(spec, {})[0]
    torch.manual_seed(0)
    model = spec.build(BuildContext(BACKBONE, SHAPE, CLASSES, m), spec.make_hparams(params))
    model.to(DEVICE)
    recipe = Recipe(epochs=1, batch_size=BATCH, cuda_graph="auto" if graphed else "off")
    cl = DEVICE.type == "cuda"
    if cl:
        model.to(memory_format=torch.channels_last)
    loader = DeviceLoader(
        synthetic_images(BATCH * STEPS, SHAPE, CLASSES), BATCH, DEVICE, mean=(0.5,) * SHAPE[0],
        std=(0.25,) * SHAPE[0], augment="crop_flip", shuffle=True, seed=0, drop_last=True,
        channels_last=cl, streams=spec.feeding_for(params).streams(m),
    )  # fmt: skip
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, STEPS)
    mode = "graphed" if graphed else "eager"
    step = cell_step(model, opt, recipe, DEVICE, mode, backend=backend() if graphed else None)
    torch.manual_seed(1)  # dropout draws: the same stream for both passes
    stats = train_epoch(model, FirstBatches(loader, STEPS), opt, sched, recipe, DEVICE, step=step)
    return model, stats["train_loss"], step if graphed else None


def main() -> int:
    failed = 0
    for name in METHODS.names():
        try:
            g_model, g_loss, step = run(name, True)
            e_model, e_loss, _ = run(name, False)
            worst = 0.0
            for a, b in zip(g_model.state_dict().values(), e_model.state_dict().values()):
                if a.is_floating_point():
                    scale = b.float().abs().max().clamp_min(1e-6)
                    worst = max(worst, float(((a.float() - b.float()).abs().max() / scale).cpu()))
            ok = worst <= 1e-2 and abs(g_loss - e_loss) <= 1e-2 * max(abs(e_loss), 1.0)
            row = {"method": name, "mode": step.mode, "graphed_steps": step.graphed_steps,
                   "capture_failed": step.failed, "loss_graphed": g_loss, "loss_eager": e_loss,
                   "max_rel_weight_diff": worst, "ok": ok}  # fmt: skip
        except Exception as exc:  # one method's failure is a row, not the end of the check
            row = {"method": name, "error": f"{type(exc).__name__}: {exc}"[:300], "ok": False}
        failed += not row["ok"]
        print(json.dumps(row), flush=True)
    print(json.dumps({"device": str(DEVICE), "methods": len(METHODS.names()), "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
