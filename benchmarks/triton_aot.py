"""Compile every σNorm Triton kernel for real GPUs on a machine without one, and check the result.

    python benchmarks/triton_aot.py --arch 80 90                         # every case, as CI does
    python benchmarks/triton_aot.py --arch 80 90 --json artifacts/triton_aot.json
    python benchmarks/triton_aot.py --arch 90 --quick                    # the tests' subset

The fused kernels of σN-Ens's normalisation layer (``methods/_triton/sigma_bn.py``) are tested
for their numbers in Triton's CPU interpreter, which never compiles them; CPU-only CI would not
see a kernel that Triton or ``ptxas`` refuses for a GPU, or one that spills registers to local
memory. This script compiles each of them, PTX to cubin with the ``ptxas`` that ships with
Triton, for sm_80 (A100) and sm_90 (H100/H200), with the specialisations and meta-parameters
the launcher produces for the layers it serves:

- shapes: every BatchNorm input of ResNet-18 (CIFAR style), WRN-28-10 (both on 32×32),
  ``digits_cnn`` (8×8) and ``fmnist_cnn`` (28×28), read off the registered backbones by running
  them on the meta device, plus an odd channel count on an odd spatial size; B = 128 rows per
  member, M = 4;
- activations float32 and bfloat16 (bf16 autocast: the layer's parameters and statistics stay
  float32), NCHW-contiguous and channels_last;
- σN-Ens (gated) and FiLM-Ensemble (no gate) layers: training forward, backward and
  evaluation forward.

Each case runs the σNorm layer itself (a ``SigmaBatchNorm2d`` built as ``from_norm`` builds it
from the backbone's BatchNorm) on meta tensors through its kernel path, so the grid, block
sizes, constexprs and pointer alignments are exactly the launcher's (``sigma_bn._Geometry``);
its kernel launches are recorded instead of run, then compiled with ``JITFunction.warmup``
under a stand-in CUDA driver that reports the target GPU. A meta tensor's pointer is its storage
offset × element size, so the divisibility-by-16 attributes Triton derives are those of CUDA
allocations (PyTorch's caching allocator aligns them to 512 bytes) at the same offsets.
Triton's own kernel cache key (specialisation and options) dedupes the cases, most layers
sharing one; the number of distinct compilations is reported, and the distinct work is spread
over ``--jobs`` forked processes.

Checked, per case: the compiler accepts the kernel; no register spills (``n_spills`` as
Triton's ``CompiledKernel`` defines it: local memory per thread / 4; ``cuobjdump -res-usage``
reports spill slots as ``STACK``, so both are counted); registers ≤ 255 per thread and ≤ 64 K
per block; shared memory within the target's per-block limit (163 KiB on sm_80, 227 KiB on
sm_90: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"). Any
failure is named (kernel, arch, dtype, layout, layer, phase) and the exit status is 1.

Why no library serves: Triton has no ahead-of-time "compile this ``@triton.jit`` kernel for
target X without a GPU" API for kernels called with torch tensors. ``triton.compile`` and
``triton/tools/compile.py`` (the AOT tool that emits C launchers) do take a target, but with the
signature, divisibility hints and constexprs written by hand — precisely what must come from
the launcher's real arguments to mean anything. ``JITFunction.warmup`` derives them from the
arguments, but asks the active driver for the target, and Triton's CUDA driver needs a GPU. So
the one stand-in here is that driver (``get_current_target`` returning ``GPUTarget("cuda",
arch, 32)``); Triton specialises, lowers and runs ``ptxas`` itself. A compiled kernel's
registers and spills are normally read when the driver loads the cubin, so they are read from
the cubin with NVIDIA's ``cuobjdump`` (bundled with Triton) instead.

Exit status: 0 all compiled within limits; 1 a refusal, spill or limit; 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class ArchLimits:
    """What a GPU generation allows one block (CUDA C++ Programming Guide, "Technical
    Specifications per Compute Capability")."""

    gpus: str
    smem_per_block: int  # bytes, the opt-in maximum of dynamic + static shared memory
    regs_per_thread: int = 255
    regs_per_block: int = 65536


ARCHS: dict[int, ArchLimits] = {
    80: ArchLimits("A100", 163 * 1024),
    90: ArchLimits("H100/H200", 227 * 1024),
}

M, B = 4, 128  # members, rows per member: the harness's default CIFAR batch at M = 4
#: The backbones whose BatchNorm layers the kernels serve, with their datasets' input shapes
#: (harness/data: CIFAR 3×32×32, digits 1×8×8, Fashion-MNIST 1×28×28).
BACKBONES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("resnet18", (3, 32, 32)),
    ("wrn28_10", (3, 32, 32)),
    ("digits_cnn", (1, 8, 8)),
    ("fmnist_cnn", (1, 28, 28)),
)
#: Channel counts that are not a power of two (the channel mask, a narrow channel block) on
#: spatial sizes that are odd (no divisibility-by-16 specialisation of the strides).
ODD: tuple[tuple[int, int, int], ...] = ((7, 5, 5), (3, 9, 9))
DTYPES = ("fp32", "bf16")
LAYOUTS = ("nchw", "channels_last")
VARIANTS = ("sigma", "film")  # σN-Ens's gated layer; FiLM-Ensemble's (no gate) uses the same
#: --quick: one layer (ResNet-18's first), σN-Ens, every kernel, two (dtype, layout) pairs.
QUICK_COMBOS = (("bf16", "channels_last"), ("fp32", "nchw"))

TABLE_COLUMNS = (
    "kernel", "arch", "dtype", "layout", "shape_class", "cases", "regs", "spills", "smem_bytes",
    "binaries", "failed",
)  # fmt: skip
SUMMARY_COLUMNS = ("kernel", "arch", "cases", "binaries", "regs", "spills", "smem_bytes")

_RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


# ------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Layer:
    """One BatchNorm input a backbone produces: (C, H, W) per sample, the norm module (meta)."""

    shape_class: str
    chw: tuple[int, int, int]
    norm: Any = field(compare=False, repr=False)


@dataclass
class Launch:
    """One kernel launch the layer's kernel path made, recorded instead of run."""

    kernel: str
    fn: Any  # triton.runtime.jit.JITFunction
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    phase: str = ""


@dataclass
class Case:
    """A recorded launch and the layer input it came from."""

    layer: Layer
    dtype: str
    layout: str
    variant: str
    launch: Launch


def backbone_layers(names: Sequence[str]) -> list[Layer]:
    """The distinct BatchNorm inputs of the named backbones, read by running each on the meta
    device (the shapes are the networks', not a transcription), then the odd ones."""
    import torch
    from torch import nn

    from harness.registry import BACKBONES as REGISTRY

    layers: list[Layer] = []
    for name, in_shape in BACKBONES:
        if name not in names:
            continue
        with torch.device("meta"):
            net = REGISTRY.get(name).build(in_shape, 10)
        seen: dict[tuple, Layer] = {}

        def hook(norm: nn.Module, inputs: tuple, name: str = name, seen: dict = seen) -> None:
            x = inputs[0]
            if x.dim() != 4:
                raise ValueError(f"{name}: a {x.dim()}-D BatchNorm input; only 2-D maps here")
            key = (tuple(x.shape[1:]), norm.eps, norm.momentum, norm.track_running_stats)
            seen.setdefault(key, Layer(name, tuple(x.shape[1:]), norm))

        norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        handles = [m.register_forward_pre_hook(hook) for m in norms]
        net(torch.empty(2, *in_shape, device="meta"))
        for h in handles:
            h.remove()
        layers += seen.values()
    if "odd" in names:
        for c, h, w in ODD:
            layers.append(Layer("odd", (c, h, w), torch.nn.BatchNorm2d(c, device="meta")))
    return layers


@contextlib.contextmanager
def recording(sink: list[Launch]) -> Iterator[None]:
    """Inside: the σNorm layers take their kernel path (their tensors are on the meta device,
    not CUDA) and every kernel launch of ``methods._triton.sigma_bn`` is appended to ``sink``
    instead of run; the module is restored on exit, before anything compiles."""
    from triton.runtime.jit import JITFunction

    import methods._sigma.batchnorm as layer_module
    from methods._triton import sigma_bn

    class Recorder:
        def __init__(self, name: str, fn: JITFunction) -> None:
            self.name, self.fn = name, fn

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            def launch(*args: Any, **kwargs: Any) -> None:
                sink.append(Launch(self.name, self.fn, tuple(grid), args, kwargs))

            return launch

    kernels = {k: v for k, v in vars(sigma_bn).items() if isinstance(v, JITFunction)}
    if not kernels:
        raise RuntimeError(
            "methods._triton.sigma_bn has no compilable kernels: it was imported under "
            "TRITON_INTERPRET=1 (run this script in a process of its own)"
        )
    saved_use = layer_module.use_kernels
    try:
        for k, v in kernels.items():
            setattr(sigma_bn, k, Recorder(k, v))
        layer_module.use_kernels = lambda x: True
        yield
    finally:
        for k, v in kernels.items():
            setattr(sigma_bn, k, v)
        layer_module.use_kernels = saved_use


def layer_cases(layer: Layer, dtype: str, layout: str, variant: str) -> list[Case]:
    """The launches of one σNorm layer on this input: training forward, backward (the
    gradient in the output's layout, as the next layer's backward gives it) and evaluation."""
    import torch

    from methods._sigma.batchnorm import SigmaBatchNorm2d

    bn = layer.norm
    # What SigmaBatchNorm2d.from_norm builds from the backbone's norm (from_norm itself copies
    # the trained affine through the CPU, which meta tensors cannot; values do not matter here).
    norm = SigmaBatchNorm2d(
        bn.num_features, M, eps=bn.eps, momentum=bn.momentum,
        track_running_stats=bn.track_running_stats, device="meta", variant=variant,
    )  # fmt: skip
    norm.member_grad_scale = float(M)  # as the ensemble sets it (a float: no specialisation)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    x = torch.empty(M * B, *layer.chw, device="meta", dtype=dt, memory_format=fmt)
    x.requires_grad_()  # a convolution's output: dx is needed
    launches: list[Launch] = []

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        before = len(launches)
        with recording(launches):
            out = fn()
        for launch in launches[before:]:
            launch.phase = name
        return out

    norm.train()
    y = phase("train-fwd", lambda: norm(x))
    phase("train-bwd", lambda: y.backward(torch.empty_like(y)))
    norm.eval()
    with torch.no_grad():
        phase("eval-fwd", lambda: norm(x))
    return [Case(layer, dtype, layout, variant, launch) for launch in launches]


# --------------------------------------------------------------------------------- compiling


def stand_in_driver() -> Any:
    """A Triton driver that reports a CUDA GPU of the chosen arch and can launch nothing.

    ``JITFunction.run`` asks the active driver for the current device and stream and, on a
    device's first use, for its target; compiling needs nothing else from it. Each arch is
    reported as a device of its own (device id = arch), so Triton keeps one kernel cache per
    target in one process. Loading and launching would need ``utils``/``launcher_cls``, which
    this driver lacks on purpose: nothing may run.
    """
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class StandInCudaDriver(DriverBase):
        arch = 90

        @classmethod
        def is_active(cls) -> bool:
            return False  # never picked by Triton's own driver discovery

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", self.arch, 32)

        def get_current_device(self) -> int:
            return self.arch

        def get_current_stream(self, device: int) -> int:
            return 0

        def get_active_torch_device(self) -> torch.device:
            return torch.device("meta")

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError("the stand-in driver builds no launcher")

        def get_benchmarker(self) -> Any:
            raise NotImplementedError("the stand-in driver runs nothing")

    return StandInCudaDriver()


#: What a forked compile worker inherits: the cases, the Triton options to add.
_STATE: dict[str, Any] = {}


def compile_all(
    cases: list[Case], archs: Sequence[int], jobs: int, maxnreg: int | None
) -> tuple[list[dict], int]:
    """Every case compiled for every arch; returns one row per (arch, case), in that order, and
    the number of compilations run.

    Work is split by (arch, kernel, dtype, layout): launches in different groups never share a
    specialisation (the target, the kernel, the activations' pointer type or the unit stride
    differ), so each group dedupes on its own through Triton's in-memory kernel cache, and the
    groups run in ``jobs`` forked processes. Processes, not threads: Triton's compiler holds the
    GIL (two threads measured no faster than one).
    """
    from triton.runtime.driver import driver

    driver.set_active(stand_in_driver())  # before forking: the workers inherit it
    _STATE.update(cases=cases, extra={} if maxnreg is None else {"maxnreg": maxnreg})
    groups: dict[tuple, list[int]] = {}
    for arch in archs:
        for i, c in enumerate(cases):
            groups.setdefault((arch, c.launch.kernel, c.dtype, c.layout), []).append(i)
    # The largest kernels first, so that the last group to finish is a short one.
    tasks = sorted(groups.items(), key=lambda kv: -len(cases[kv[1][0]].launch.fn.src))
    results: dict[tuple[int, int], dict] = {}
    compilations = 0
    jobs = min(jobs, len(tasks))
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for rows, n in pool.imap_unordered(compile_group, tasks):
                results.update(rows)
                compilations += n
    else:
        for task in tasks:
            rows, n = compile_group(task)
            results.update(rows)
            compilations += n
    return [results[arch, i] for arch in archs for i in range(len(cases))], compilations


def compile_group(task: tuple[tuple, list[int]]) -> tuple[dict[tuple[int, int], dict], int]:
    """Compile the cases ``task`` names for its arch (in this process, serially): their rows by
    (arch, case index), and how many distinct compilations they took."""
    from triton.runtime.driver import driver

    (arch, *_), indices = task
    cases, extra = _STATE["cases"], _STATE["extra"]
    driver.active.arch = arch
    kernels: dict[int, Any] = {}  # id → CompiledKernel: Triton returns the cached one if equal
    usage: dict[str, dict[str, int]] = {}
    rows = {}
    for i in indices:
        case, ln = cases[i], cases[i].launch
        try:
            kernel = ln.fn.warmup(*ln.args, grid=ln.grid, **ln.kwargs, **extra)
        except Exception as e:  # any refusal is a finding, reported with its case
            rows[arch, i] = case_row(case, arch, None, None, f"{type(e).__name__}: {_brief(e)}")
            continue
        kernels[id(kernel)] = kernel
        rows[arch, i] = case_row(case, arch, kernel, resources(kernel, usage), None)
    return rows, len(kernels)


def _brief(e: Exception, n: int = 8) -> str:
    """The first lines of an error (ptxas's include the whole PTX after them)."""
    return " | ".join(line for line in str(e).strip().splitlines()[:n] if line.strip())


def resources(kernel: Any, cache: dict[str, dict[str, int]]) -> dict[str, int]:
    """Registers, stack, local memory and static shared memory of a compiled kernel, from its
    cubin (``cuobjdump -res-usage``; the driver reports the same when it loads the module)."""
    digest = kernel.metadata.hash
    if digest in cache:
        return cache[digest]
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = _RES_USAGE.search(out)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no resources for {kernel.name}:\n{out}")
    regs, stack, static_smem, local = map(int, found.groups())
    cache[digest] = {"regs": regs, "stack": stack, "static_smem": static_smem, "local": local}
    return cache[digest]


# ----------------------------------------------------------------------------------- results


def case_row(
    case: Case, arch: int, kernel: Any, res: dict[str, int] | None, error: str | None
) -> dict[str, Any]:
    """One JSON row: the case, its meta-parameters, what the compiler produced, and why it
    fails ("problems"; empty when within every limit)."""
    ln = case.launch
    row: dict[str, Any] = {
        "kernel": ln.kernel,
        "arch": arch,
        "dtype": case.dtype,
        "layout": case.layout,
        "shape_class": case.layer.shape_class,
        "shape": [M * B, *case.layer.chw],
        "variant": case.variant,
        "phase": ln.phase,
        "grid": list(ln.grid),
        "meta": {k: v for k, v in ln.kwargs.items()},
        "problems": [],
    }
    if error is not None:
        row["problems"].append(f"refused: {error}")
        return row
    md = kernel.metadata
    names = ln.fn.arg_names
    row["meta"].update(num_warps=md.num_warps, num_stages=md.num_stages)
    # Launch arguments Triton turned into constants (an integer equal to 1: a unit stride).
    row["specialised"] = {
        names[path[0]]: value
        for path, value in kernel.src.constants.items()
        if names[path[0]] not in ln.kwargs
    }
    spills = (res["stack"] + res["local"]) // 4
    # Triton's dynamic shared memory (passed at launch) plus what the cubin declares statically
    # (1 KiB in every sm_90 cubin here, none on sm_80): the block gets both.
    smem = md.shared + res["static_smem"]
    row.update(
        n_regs=res["regs"],
        n_spills=spills,
        smem_bytes=smem,
        smem_dynamic=md.shared,
        smem_static=res["static_smem"],
        binary=md.hash[:12],
    )
    lim = ARCHS[arch]
    if spills:
        row["problems"].append(f"spills: {res['stack'] + res['local']} bytes of local memory")
    if res["regs"] > lim.regs_per_thread:
        row["problems"].append(f"{res['regs']} registers > {lim.regs_per_thread}")
    # The register file is allocated per warp in units of 256: a block that needs more than
    # 64 K cannot launch at all ("too many resources requested").
    per_warp = -(-res["regs"] * 32 // 256) * 256
    if per_warp * md.num_warps > lim.regs_per_block:
        row["problems"].append(f"{per_warp * md.num_warps} registers per block > 65536")
    if smem > lim.smem_per_block:
        row["problems"].append(f"{smem} B shared memory > {lim.smem_per_block} ({lim.gpus})")
    return row


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows grouped by (kernel, arch, dtype, layout, shape class), over layers, variants and
    phases: register range, worst spills and shared memory, distinct binaries."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["kernel"], r["arch"], r["dtype"], r["layout"], r["shape_class"])
        groups.setdefault(key, []).append(r)
    out = []
    for (kernel, arch, dtype, layout, cls), rs in groups.items():
        ok = [r for r in rs if "n_regs" in r]
        out.append(
            {
                "kernel": kernel,
                "arch": arch,
                "dtype": dtype,
                "layout": layout,
                "shape_class": cls,
                "cases": len(rs),
                "regs": _span([r["n_regs"] for r in ok]),
                "spills": max((r["n_spills"] for r in ok), default=0),
                "smem_bytes": max((r["smem_bytes"] for r in ok), default=0),
                "binaries": len({r["binary"] for r in ok}),
                "failed": sum(bool(r["problems"]) for r in rs),
            }
        )
    return out


def format_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows`` (pipe-separated, padded to align in a terminal)."""
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(list(columns)), sep, *(line(r) for r in cells)])


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (kernel, arch): the register range, worst spills and shared memory over all cases."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "n_regs" in r:
            groups.setdefault((r["kernel"], r["arch"]), []).append(r)
    out = []
    for (kernel, arch), rs in sorted(groups.items()):
        out.append(
            {
                "kernel": kernel,
                "arch": f"sm_{arch}",
                "cases": len(rs),
                "binaries": len({r["binary"] for r in rs}),
                "regs": _span([r["n_regs"] for r in rs]),
                "spills": max(r["n_spills"] for r in rs),
                "smem_bytes": _span([r["smem_bytes"] for r in rs]),
            }
        )
    return out


def fail_line(row: dict[str, Any]) -> str:
    """A failing row as one line naming its case: kernel, arch, dtype, layout, layer, phase."""
    c, h, w = row["shape"][1:]
    return (
        f"FAIL {row['kernel']} sm_{row['arch']} {row['dtype']} {row['layout']} "
        f"{row['shape_class']} C={c} {h}x{w} {row['variant']} {row['phase']}: "
        + "; ".join(row["problems"])
    )


def _span(values: Sequence[int]) -> str:
    """ "lo-hi", or the one value, or "-" for none."""
    lo, hi = min(values, default=None), max(values, default=None)
    return "-" if lo is None else str(lo) if lo == hi else f"{lo}-{hi}"


def versions() -> dict[str, str | None]:
    """torch's and Triton's versions and the checkout's commit (None outside a git checkout)."""
    import torch
    import triton

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"torch": torch.__version__, "triton": triton.__version__, "commit": commit}


# -------------------------------------------------------------------------------------- main


def parse_arch(text: str) -> int:
    """``80``, ``sm_80`` or ``sm80`` → 80; an arch without recorded limits is a usage error."""
    digits = text.lower().removeprefix("sm_").removeprefix("sm")
    if not digits.isdigit() or int(digits) not in ARCHS:
        known = ", ".join(f"{a} ({lim.gpus})" for a, lim in ARCHS.items())
        raise argparse.ArgumentTypeError(f"unknown arch {text!r}: choose from {known}")
    return int(digits)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, validated (argparse exits with status 2 on a usage error)."""
    p = argparse.ArgumentParser(
        description="Compile the σNorm Triton kernels for GPUs without one; fail on a "
        "refusal, a spill or a resource limit.",
    )
    p.add_argument(
        "--arch",
        nargs="+",
        type=parse_arch,
        required=True,
        help="compute capabilities to compile for: 80 (A100), 90 (H100/H200)",
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="write every case's row here")
    p.add_argument(
        "--quick",
        action="store_true",
        help="ResNet-18's first layer, σN-Ens, bf16 channels_last and fp32 NCHW (every kernel; "
        "the tests' subset)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="compiler processes (default: the CPU count)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="Triton's kernel cache (default: a fresh temporary directory, so that everything "
        "compiles)",
    )
    p.add_argument(
        "--maxnreg",
        type=int,
        help="diagnostic: cap registers per thread (Triton's maxnreg option) to force spills; "
        "the tests check that they fail the run",
    )
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be ≥ 1, got {args.jobs}")
    args.arch = list(dict.fromkeys(args.arch))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The script: see the module docstring. Returns the exit status."""
    args = parse_args(argv)
    # Under TRITON_INTERPRET=1 ``@triton.jit`` builds interpreter objects that cannot compile;
    # the tests' conftest sets it on a machine without CUDA and a subprocess inherits it. It is
    # read when the kernels are decorated, so it goes before anything imports them.
    os.environ.pop("TRITON_INTERPRET", None)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        cache = args.cache_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        from triton import knobs

        knobs.cache.dir = str(cache)
        return run(args, start)


def run(args: argparse.Namespace, start: float) -> int:
    """Build the cases, compile them, print the tables, write the JSON; the exit status."""
    if args.quick:
        layers = backbone_layers(["resnet18"])[:1]
        combos = [(d, lay, "sigma") for d, lay in QUICK_COMBOS]
    else:
        layers = backbone_layers([name for name, _ in BACKBONES] + ["odd"])
        combos = [(d, lay, v) for d in DTYPES for lay in LAYOUTS for v in VARIANTS]
    cases = [c for layer in layers for combo in combos for c in layer_cases(layer, *combo)]
    rows, n_compiled = compile_all(cases, args.arch, args.jobs, args.maxnreg)
    # Distinct binaries (Triton's cache key per arch); equal to the compilations run unless two
    # work groups shared a specialisation (they cannot: see compile_all).
    n_distinct = len({(r["arch"], r["binary"]) for r in rows if "binary" in r})
    seconds = time.perf_counter() - start
    grouped = table(rows)
    print(format_table(grouped, TABLE_COLUMNS))
    print()
    print(format_table(summary(rows), SUMMARY_COLUMNS))
    info = versions()
    print(
        f"\n{len(rows)} cases ({len(layers)} layer shapes × {len(combos)} dtype/layout/variant "
        f"× {len(args.arch)} archs), {n_distinct} distinct compilations ({n_compiled} run) in "
        f"{seconds:.1f} s, {args.jobs} jobs; torch {info['torch']}, Triton {info['triton']}, "
        f"commit {info['commit']}, {datetime.date.today().isoformat()}"
    )
    failed = [r for r in rows if r["problems"]]
    for r in failed:
        print(fail_line(r), file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "date": datetime.date.today().isoformat(),
            **info,
            "archs": args.arch,
            "quick": args.quick,
            "members": M,
            "batch_per_member": B,
            "cases": len(rows),
            "distinct_compilations": n_distinct,
            "compilations_run": n_compiled,
            "jobs": args.jobs,
            "seconds": round(seconds, 1),
            "failed": len(failed),
            "table": grouped,
            "rows": rows,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if failed:
        print(f"{len(failed)} of {len(rows)} cases failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
