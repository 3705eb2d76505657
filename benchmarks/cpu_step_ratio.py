"""Step time of each ensemble ÷ the bound's, on the CPU, in one process, interleaved.

    python benchmarks/cpu_step_ratio.py                        # fmnist_cnn B=128 and ResNet-18
    python benchmarks/cpu_step_ratio.py --threads 1 2 --rounds 15 --reference

The bound is the plain backbone on M·B images (what any shared-backbone ensemble of M members
costs at best). Every round times one training step (forward, loss, backward, SGD step: the
bench's bare step, :func:`harness.engine.cost.bare_steps`) and one evaluation forward of every
row, in turn, so that a load change on the machine hits every row alike; the table gives the
median over rounds of each row's time and of its ratio to the bound's time *in the same round*.
Ratios are times (≤ 1.15 is the σN-Ens target for training, ≤ 1.10 for evaluation), not the
throughput ratios ``harness bench`` prints (their inverse).

``--reference`` adds σN-Ens on the reference σNorm path (``var_mean`` over strided member views,
``methods._triton.kernels("reference")``), the CPU path before PyTorch's batch-norm kernels
were used per member. Not a test: wall time is measured here and written to docs/benchmarks.md,
never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.contract import Recipe
from harness.engine.cost import bare_steps
from harness.registry import METHODS
from methods._base import BuildContext
from methods._triton import kernels

#: (backbone, in_shape, classes, batch B): the issue's two settings.
SETTINGS = {
    "fmnist_cnn": ((1, 28, 28), 10, 128),
    "resnet18": ((3, 32, 32), 100, 32),
}
ROWS = ("bound", "sigma_ens", "film_ensemble", "deep_ensemble")


def build(method: str, backbone: str, in_shape, classes: int, m: int):
    spec = METHODS.get(method)
    torch.manual_seed(0)
    return spec.build(BuildContext(backbone, in_shape, classes, m), spec.make_hparams({}))


def measure(backbone: str, m: int, rounds: int, reference: bool) -> dict[str, dict[str, list]]:
    """{row: {"train": [s per round], "eval": [...], "train_ratio": [...], "eval_ratio": [...]}}"""
    in_shape, classes, batch = SETTINGS[backbone]
    recipe, cpu = Recipe(), torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *in_shape, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    rows: dict[str, tuple[Callable, Callable, Callable[[], contextlib.AbstractContextManager]]] = {}
    for name in ROWS + (("sigma_ens (reference σNorm)",) if reference else ()):
        if name == "bound":  # the plain backbone on M·B images
            model = build("single", backbone, in_shape, classes, 1)
            xb, yb = x.repeat(m, 1, 1, 1), y.repeat(m)
        else:
            model = build(name.split(" ")[0], backbone, in_shape, classes, m)
            xb, yb = x, y
        train, evaluate, _ = bare_steps(model, xb, yb, recipe, cpu)
        mode = "reference" if "reference" in name else "auto"
        rows[name] = (train, evaluate, lambda mode=mode: kernels(mode))
    times = {name: {"train": [], "eval": []} for name in rows}
    for r in range(rounds + 1):  # round 0 warms up every row
        for name, (train, evaluate, ctx) in rows.items():
            with ctx():
                for kind, fn in (("train", train), ("eval", evaluate)):
                    start = time.perf_counter()
                    fn()
                    if r:
                        times[name][kind].append(time.perf_counter() - start)
    for name in rows:
        for kind in ("train", "eval"):
            bound = times["bound"][kind]
            times[name][kind + "_ratio"] = [t / b for t, b in zip(times[name][kind], bound)]
    return times


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--backbones",
        nargs="+",
        default=list(SETTINGS),
        choices=list(SETTINGS),
        help="which settings to time (default: both)",
    )
    ap.add_argument(
        "--threads",
        nargs="+",
        type=_positive,
        default=[1, 2],
        help="torch.set_num_threads values, one table each (default: 1 2)",
    )
    ap.add_argument("--M", type=_positive, default=4, help="members (default 4)")
    ap.add_argument(
        "--rounds", type=_positive, default=10, help="timed rounds per table (default 10)"
    )
    ap.add_argument(
        "--reference", action="store_true", help="also time σN-Ens on the reference σNorm path"
    )
    args = ap.parse_args(argv)
    print(
        f"# cpu_step_ratio {dt.date.today()} commit {commit()} torch {torch.__version__} "
        f"cpu {torch.backends.cpu.get_cpu_capability()} M={args.M} rounds={args.rounds}"
    )
    print("| backbone | B | threads | row | train ms | train ÷ bound | eval ms | eval ÷ bound |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for backbone in args.backbones:
            times = measure(backbone, args.M, args.rounds, args.reference)
            for name, t in times.items():
                med = {k: statistics.median(v) for k, v in t.items()}
                print(
                    f"| {backbone} | {SETTINGS[backbone][2]} | {threads} | {name} | "
                    f"{med['train'] * 1e3:.1f} | {med['train_ratio']:.2f} | "
                    f"{med['eval'] * 1e3:.1f} | {med['eval_ratio']:.2f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
