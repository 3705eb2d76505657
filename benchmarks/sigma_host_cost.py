"""Host time of the σBatchNorm kernel path per call, with the Triton launches stubbed: what the
Python launcher costs a GPU step before any kernel runs.

    python benchmarks/sigma_host_cost.py    # forward + backward, and eval, vs nn.BatchNorm2d

At CIFAR sizes a GPU step is launch-bound (docs/benchmarks.md): the host's time per layer, not
the kernels', sets the pace. This replaces each of the five kernels of
``methods/_triton/sigma_bn.py`` by a stub whose launch does nothing, then times
``MemberBatchNorm.apply`` forward + backward (and ``eval_forward``) on a tiny CPU tensor, where
the arithmetic is negligible, against ``nn.BatchNorm2d`` forward + backward on the same tensor
(whose host time is its dispatch: on a GPU, cuDNN's launch). Median of ``--repeats`` runs of
``--calls`` calls each, one thread. Not a test: the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from methods._triton import sigma_bn

KERNELS = sigma_bn.KERNEL_NAMES


class _Stub:
    """A kernel whose ``kernel[grid](*args, **meta)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _per_call(fn, calls: int, repeats: int) -> float:
    """Median microseconds per call of ``fn`` over ``repeats`` runs of ``calls`` calls."""
    for _ in range(20):
        fn()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per run (default 300)")
    ap.add_argument("--repeats", type=int, default=7, help="runs, median taken (default 7)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    m, b, c = 4, 2, 8
    x = torch.randn(m * b, c, 2, 2, requires_grad=True)
    grad = torch.randn_like(x)
    w, bias = torch.ones(m, c, requires_grad=True), torch.zeros(m, c, requires_grad=True)
    gamma = torch.zeros(m, c, requires_grad=True)
    rm, rv, nbt = torch.zeros(m, c), torch.ones(m, c), torch.zeros(m, dtype=torch.long)
    saved = {k: getattr(sigma_bn, k) for k in KERNELS}
    for k in KERNELS:
        setattr(sigma_bn, k, _Stub())
    try:
        cfg = (m, 1e-5, 0.1, 1.0, 1.0)

        def sigma_train() -> None:
            y = sigma_bn.MemberBatchNorm.apply(x, w, bias, gamma, rm, rv, nbt, cfg)
            y.backward(grad)

        def sigma_eval() -> None:
            with torch.no_grad():
                sigma_bn.eval_forward(x, w, bias, gamma, rm, rv, m, 1e-5, 1.0)

        t_sigma = _per_call(sigma_train, args.calls, args.repeats)
        e_sigma = _per_call(sigma_eval, args.calls, args.repeats)
    finally:
        for k, v in saved.items():
            setattr(sigma_bn, k, v)
    bn = nn.BatchNorm2d(c)

    def bn_train() -> None:
        bn.train()
        bn(x).backward(grad)

    def bn_eval() -> None:
        bn.eval()
        with torch.no_grad():
            bn(x)

    t_bn = _per_call(bn_train, args.calls, args.repeats)
    e_bn = _per_call(bn_eval, args.calls, args.repeats)
    print(f"σBatchNorm kernel path, launches stubbed: train fwd+bwd {t_sigma:.1f} µs, "
          f"eval {e_sigma:.1f} µs")  # fmt: skip
    print(f"nn.BatchNorm2d (CPU, tiny tensor):       train fwd+bwd {t_bn:.1f} µs, "
          f"eval {e_bn:.1f} µs")  # fmt: skip
    print(f"ratio: train {t_sigma / t_bn:.2f}×, eval {e_sigma / e_bn:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
