"""Operators dispatched per training step, per method: the launch count a GPU pays, on a CPU.

    python benchmarks/op_count.py                          # every registered method, ResNet-18
    python benchmarks/op_count.py sigma_ens single --backbone wrn28_10
    python benchmarks/op_count.py sigma_ens film_ensemble --kernels triton   # CUDA's σNorm path

On an accelerator every dispatched operator that computes is a kernel launch, and its Python
and dispatcher overhead is paid whatever the batch: a model whose step dispatches many small
operators is launch-bound at CIFAR batch sizes (docs/benchmarks.md: eager σN-Ens on an H200).
This counts them below Python with a ``TorchDispatchMode`` over the real loop ``harness bench
--loop real`` times (``train_epoch``: forward, loss, backward, optimizer step, schedule), as the
difference between a pass of ``2 + STEPS`` steps and one of 2, so the fixed costs drop out. The
count does not depend on the batch or image size; a small batch keeps it quick. Metadata-only
operators (``view``, ``detach``, ``t``, …) launch nothing but still cost dispatch time; both are
listed.

``--kernels triton`` counts the σNorm layers' CUDA path: the fused Triton kernels (run here by
Triton's CPU interpreter, whose own host copies are not counted) each count as one launch, in
the ``triton`` column, beside the PyTorch operators the layer still dispatches.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--kernels" in sys.argv and "triton" in sys.argv:  # before Triton decorates the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness.config.suite import expand_hparams
from harness.contract.config import Recipe
from harness.engine.cost import real_loop_throughput
from harness.registry import METHODS
from methods._base import BuildContext

#: Operators that only change metadata (no kernel on a GPU).
METADATA = {"view", "detach", "t", "unsqueeze", "squeeze", "expand", "as_strided", "alias",
            "select", "slice", "permute", "transpose", "reshape", "_unsafe_view", "unbind",
            "split", "lift_fresh"}  # fmt: skip


class Count(TorchDispatchMode):
    """Counts dispatched operators by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


class Launches:
    """A Triton kernel whose launches count as one operator ``triton`` each; the interpreter's
    own tensor operations inside a launch are not counted (a GPU runs the kernel, not them)."""

    def __init__(self, kernel, counter: Count) -> None:
        self.kernel, self.counter = kernel, counter

    def __getitem__(self, grid):
        from torch.utils._python_dispatch import _disable_current_modes

        def launch(*args, **kwargs):
            self.counter.ops["triton"] += 1
            with _disable_current_modes():
                return self.kernel[grid](*args, **kwargs)

        return launch


@contextlib.contextmanager
def counted_kernels(counter: Count):
    """methods._triton.sigma_bn's kernels counted as launches by ``counter``."""
    from methods._triton import sigma_bn

    real = {k: getattr(sigma_bn, k) for k in sigma_bn.KERNEL_NAMES}
    try:
        for k, kernel in real.items():
            setattr(sigma_bn, k, Launches(kernel, counter))
        yield
    finally:
        for k, kernel in real.items():
            setattr(sigma_bn, k, kernel)


@contextlib.contextmanager
def cuda_optimizer(on: bool):
    """The optimizer as on CUDA (``on``): torch picks its foreach implementation there, one
    operator per parameter group and update, where on the CPU it loops over the parameters (an
    operator per parameter and update), so a CPU count would charge a method for each parameter
    it adds; a graphed CUDA step uses the fused SGD, fewer still."""
    import harness.engine.cost as cost

    if not on:
        yield
        return
    real = cost.make_optimizer

    def foreach(model, recipe):
        opt = real(model, recipe)
        for group in opt.param_groups:
            group["foreach"] = True
        return opt

    cost.make_optimizer = foreach
    try:
        yield
    finally:
        cost.make_optimizer = real


def ops_per_step(
    name: str,
    backbone: str,
    members: int,
    steps: int = 4,
    batch: int = 8,
    kernels: str = "reference",
    image_size: int = 32,
):
    """Mean operators per training step of method ``name`` (a Counter by operator): the harness
    bench's real loop (:func:`harness.engine.cost.real_loop_throughput`, no warm-up) counted at
    ``2 + steps`` and at 2 steps, the difference divided by ``steps``."""
    spec = METHODS.get(name)
    m = max(spec.min_members, min(members, spec.max_members or members))
    params = expand_hparams(spec, {})[0]
    shape, classes = (3, image_size, image_size), 100
    torch.manual_seed(0)
    model = spec.build(BuildContext(backbone, shape, classes, m), spec.make_hparams(params))
    recipe, cpu = Recipe(epochs=1, batch_size=batch), torch.device("cpu")
    streams = spec.feeding_for(params).streams(m)

    def count(n: int) -> Counter[str]:
        from methods._triton import kernels as mode

        counter = Count()
        with mode(kernels), counted_kernels(counter), cuda_optimizer(kernels == "triton"), counter:
            real_loop_throughput(
                model,
                recipe,
                cpu,
                batch,
                shape,
                classes,
                steps=n,
                warmup=0,
                streams=streams,
                phases=False,
            )
        return counter.ops

    base, more = count(2), count(2 + steps)
    return Counter({k: (more[k] - base[k]) / steps for k in more if more[k] != base[k]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("methods", nargs="*", help="default: every registered method")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--M", type=int, default=4)
    parser.add_argument(
        "--image-size", type=int, default=32,
        help="the count does not depend on it; 8 keeps the interpreted kernels quick",
    )  # fmt: skip
    parser.add_argument(
        "--kernels", choices=["reference", "triton"], default="reference",
        help="the σNorm layers' path: reference (PyTorch, the CPU's) or triton (CUDA's)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| method | operators / step | of which compute | top compute operators |")
    print("|---|---:|---:|---|")
    for name in args.methods or METHODS.names():
        ops = ops_per_step(
            name, args.backbone, args.M, kernels=args.kernels, image_size=args.image_size
        )
        compute = {k: v for k, v in ops.items() if k not in METADATA}
        top = ", ".join(f"{k} {v:.0f}" for k, v in Counter(compute).most_common(6))
        print(f"| {name} | {sum(ops.values()):,.0f} | {sum(compute.values()):,.0f} | {top} |")


if __name__ == "__main__":
    main()
