"""The GPU path end to end in one prepared run (102 s on an H200, 2026-12-04; CPU: ``SMALL=1``).

    python benchmarks/gpu_smoke.py            # on a GPU machine, the harness installed
    SMALL=1 python benchmarks/gpu_smoke.py    # the same parts on the CPU (gloo, fp32 and bf16)

Parts, each printed as ``PASS``/``FAIL`` with what it measured (exit status 1 if any failed):

1. **syncs**: one real-loop epoch per registered method (``harness.engine.train.train_epoch``, the
   device loader with crop/flip, the recipe's optimizer), listing every synchronising call by
   file:line. On CUDA ``torch.cuda.set_sync_debug_mode("warn")`` reports them; on the CPU a
   ``TorchDispatchMode`` counts value reads (``aten._local_scalar_dense``). Budget: the loop's
   own reads, one per ``sync_every`` steps plus the epoch's end. With ``SMALL=1`` the epoch
   runs twice: float32 and under CPU bf16 autocast.
2. **resume**: a cell in a subprocess, SIGKILLed after its first checkpoint, then run again: it
   resumes (``events.jsonl``), finishes, and equals an uninterrupted run.
3. **ddp**: a one-process ``DistributedDataParallel`` step loop through the harness's wrapper
   and the epoch-end all-reduce (NCCL on CUDA, gloo on the CPU).
4. **suite**: a small suite end to end through ``harness run`` (bf16 autocast, channels_last,
   the device loader on CUDA): every cell's record done.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SMALL = os.environ.get("SMALL") == "1"
DEVICE = torch.device("cpu" if SMALL or not torch.cuda.is_available() else "cuda")
STEPS, SYNC_EVERY = (6, 3) if SMALL else (60, 50)
RESULTS: list[tuple[str, bool, str]] = []


def report(part: str, ok: bool, detail: str) -> None:
    RESULTS.append((part, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {part}: {detail}", flush=True)


def caller(skip_torch: bool = True) -> str:
    """file:line of the innermost frame outside torch (where a synchronising call was made)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if skip_torch and ("/torch/" in frame.filename or frame.filename == __file__):
            continue
        return f"{Path(frame.filename).name}:{frame.lineno}"
    return "?"


class ReadCounter(TorchDispatchMode):
    """CPU stand-in of ``set_sync_debug_mode``: value reads by file:line."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten._local_scalar_dense:
            self.calls[caller()] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def sync_report():
    """Yields a Counter of synchronising calls by file:line while the block runs."""
    if DEVICE.type == "cuda":
        calls: Counter[str] = Counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield calls
            finally:
                torch.cuda.set_sync_debug_mode("default")
        for w in caught:
            if "synchroniz" in str(w.message):
                calls[f"{Path(w.filename).name}:{w.lineno}"] += 1
    else:
        with ReadCounter() as counter:
            yield counter.calls


def model_for(name: str, backbone: str, in_shape: tuple[int, ...], classes: int):
    from harness.config.suite import expand_hparams
    from harness.registry import METHODS
    from methods._base import BuildContext

    spec = METHODS.get(name)
    m = max(spec.min_members, min(4, spec.max_members or 4))
    torch.manual_seed(0)
    hp = spec.hparams(**expand_hparams(spec, {})[0])
    model = spec.build(BuildContext(backbone, in_shape, classes, m), hp).to(DEVICE)
    if DEVICE.type == "cuda":
        model.to(memory_format=torch.channels_last)
    return model, spec.feeding_for({}).streams(m)


def part_syncs() -> None:
    from harness.contract.config import Recipe
    from harness.data._machinery.loader import DeviceLoader
    from harness.engine.cost import synthetic_images
    from harness.engine.train import make_optimizer, make_scheduler, train_epoch
    from harness.registry import METHODS

    backbone, in_shape, classes, batch = (
        ("digits_cnn", (1, 8, 8), 8, 8) if SMALL else ("resnet18", (3, 32, 32), 100, 128)
    )
    precisions = [None, torch.bfloat16] if SMALL else [None]  # CUDA: the recipe's bf16 autocast
    budget = -(-STEPS // SYNC_EVERY)
    for name in METHODS.names():
        for dtype in precisions:
            label = name + (" bf16" if dtype else "")
            try:
                model, streams = model_for(name, backbone, in_shape, classes)
                recipe = Recipe(epochs=1, batch_size=batch)
                loader = DeviceLoader(
                    synthetic_images(batch * STEPS, in_shape, classes),
                    batch,
                    DEVICE,
                    mean=(0.5,) * in_shape[0],
                    std=(0.25,) * in_shape[0],
                    augment="crop_flip",
                    shuffle=True,
                    drop_last=True,
                    channels_last=DEVICE.type == "cuda",
                    streams=streams,
                )
                opt = make_optimizer(model, recipe)
                sched = make_scheduler(opt, recipe, len(loader))
                cpu_amp = torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)
                start = time.perf_counter()
                with cpu_amp, sync_report() as calls:
                    stats = train_epoch(
                        model, loader, opt, sched, recipe, DEVICE, sync_every=SYNC_EVERY
                    )
                    if DEVICE.type == "cuda":
                        torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
                # CPU: the loop's window reads are .tolist() (not a dispatch read), so 0 expected
                limit = budget if DEVICE.type == "cuda" else 0
                where = ", ".join(f"{k} ×{v}" for k, v in calls.most_common(8)) or "none"
                ok = sum(calls.values()) <= limit and stats["steps"] == STEPS
                report(
                    f"syncs {label}",
                    ok,
                    f"{stats['steps']} steps in {elapsed:.1f} s, loss {stats['train_loss']:.3f}, "
                    f"{sum(calls.values())} synchronising calls (budget {limit}): {where}",
                )
            except Exception as exc:  # one method failing must not hide the others
                report(f"syncs {label}", False, f"{type(exc).__name__}: {exc}")


def suite_text(name: str, epochs: int, methods: str, evaluation: str) -> str:
    return textwrap.dedent(
        f"""
        name: {name}
        grid:
          datasets: [digits]
          backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
          seeds: [0]
          methods: {methods}
        recipe: {{epochs: {epochs}, batch_size: 128, amp: true, channels_last: true}}
        evaluation: {evaluation}
        """
    )


NO_EVAL = "{corruptions: [], ood: [], cost: false}"
SMALL_EVAL = "{corruptions: [gaussian_noise], severities: [3], ood: [], cost_steps: 2}"


def harness(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if SMALL:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, "-m", "harness.cli", *args]
    return subprocess.Popen(cmd, env=env, cwd=REPO, **kwargs)


def part_resume(tmp: Path) -> None:
    from harness.config.parse import load_suite
    from harness.contract.record import read_record
    from harness.storage.checkpoint import read_events

    path = tmp / "resume.yaml"
    path.write_text(suite_text("resume", 4, "[sigma_ens]", NO_EVAL))
    cell = load_suite(path).cells()[0]
    killed, whole = tmp / "killed", tmp / "whole"
    run = ("run", str(path), "-q", "--executor", "inprocess", "--results")
    proc = harness(*run, str(killed))
    killed, whole = killed / "resume", whole / "resume"  # results/<suite>/<cell id>
    ckpt = killed / cell.cell_id / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is not None:
        report("resume", False, f"the cell ended (rc {proc.returncode}) before it was killed")
        return
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    again = harness(*run, str(killed.parent))
    ref = harness(*run, str(whole.parent))
    rc = again.wait(), ref.wait()
    rec, ref_rec = read_record(killed / cell.cell_id), read_record(whole / cell.cell_id)
    events = [e["event"] for e in read_events(killed / cell.cell_id)]
    resumed_from = [e.get("from_epoch") for e in read_events(killed / cell.cell_id)]
    acc = rec["metrics"]["clean"]["acc"] if rec and rec["status"] == "done" else float("nan")
    ref_acc = ref_rec["metrics"]["clean"]["acc"] if ref_rec else float("nan")
    ok = (
        rc == (0, 0)
        and rec is not None
        and rec["status"] == "done"
        and "train" in events
        and any(f and f > 0 for f in resumed_from)
        and (DEVICE.type == "cuda" or acc == ref_acc)  # bit-identical on the CPU
    )
    detail = (
        f"killed with {ckpt.name} present; resumed from epoch {max(f or 0 for f in resumed_from)}"
        f", status {rec and rec['status']}, acc {acc:.4f} vs uninterrupted {ref_acc:.4f}"
        + ("" if DEVICE.type == "cpu" else " (bit-identity on a GPU needs recipe.deterministic)")
    )
    report("resume", ok, detail)


def part_ddp(tmp: Path) -> None:
    import torch.distributed as dist

    from harness.config.parse import load_suite
    from harness.engine.distributed import DistributedTraining, end_epoch
    from harness.engine.train import make_optimizer, make_scheduler, train_epoch
    from harness.executors.ranks import free_port

    path = tmp / "ddp.yaml"
    path.write_text(suite_text("ddp", 1, "[sigma_ens]", NO_EVAL))
    cell = load_suite(path).cells()[0]
    backend = "nccl" if DEVICE.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        from harness.data._machinery.loader import DeviceLoader
        from harness.engine.cost import synthetic_images

        model, _ = model_for("sigma_ens", "digits_cnn", (1, 8, 8), 8)
        trainee = DistributedTraining(model, DEVICE)
        loader = DeviceLoader(
            synthetic_images(64 * 4, (1, 8, 8), 8), 64, DEVICE, (0.5,), (0.25,), shuffle=True
        )
        opt = make_optimizer(model, cell.recipe)
        sched = make_scheduler(opt, cell.recipe, len(loader))
        stats = train_epoch(trainee, loader, opt, sched, cell.recipe, DEVICE)
        stats = end_epoch(cell, model, stats, 0)
        ok = stats["steps"] == 4 and stats["train_loss"] > 0
        report("ddp", ok, f"{backend}: 4 DDP steps, loss {stats['train_loss']:.3f}")
    except Exception as exc:
        report("ddp", False, f"{backend}: {type(exc).__name__}: {exc}")
    finally:
        dist.destroy_process_group()


def part_suite(tmp: Path) -> None:
    from harness.config.parse import load_suite
    from harness.contract.record import read_record

    path = tmp / "suite.yaml"
    path.write_text(suite_text("smoke_suite", 2, "[single, sigma_ens, batch_ensemble]", SMALL_EVAL))
    cells = load_suite(path).cells()
    rc = harness("run", str(path), "-q", "--results", str(tmp / "suite")).wait()
    recs = [read_record(tmp / "suite" / "smoke_suite" / c.cell_id) for c in cells]
    done = [r for r in recs if r and r["status"] == "done"]
    detail = ", ".join(
        f"{r['config']['method']}: acc {r['metrics']['clean']['acc']:.3f}, "
        f"train {r['cost']['train_images_per_s']:,.0f} img/s"
        for r in done
    )
    report("suite", rc == 0 and len(done) == len(cells), f"{len(done)}/{len(cells)} done; {detail}")


def main() -> int:
    print(f"gpu_smoke: device {DEVICE}, torch {torch.__version__}, SMALL={int(SMALL)}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        for part in (part_syncs, part_resume, part_ddp, part_suite):
            try:
                part(*([] if part is part_syncs else [Path(tmp)]))
            except Exception as exc:
                report(part.__name__, False, f"{type(exc).__name__}: {exc}")
    failed = [p for p, ok, _ in RESULTS if not ok]
    print(json.dumps({"passed": len(RESULTS) - len(failed), "failed": failed}))
    print(f"gpu_smoke: {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
