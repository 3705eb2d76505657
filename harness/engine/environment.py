"""Provenance of a result: versions, git commit, host and device."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]  # harness/engine/ → the checkout


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    The entries of ``CUDA_VISIBLE_DEVICES`` when it is set (indices or UUIDs, kept as written so
    a worker's value names the same physical GPU), else ``0 .. n-1`` from torch's device count.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    # device_count() does not create a CUDA context in this process; workers are spawned anyway.
    import torch  # only without CUDA_VISIBLE_DEVICES: the executors import this module

    return [str(i) for i in range(torch.cuda.device_count())]


#: What a device may be called: ``recipe.device`` takes the first three, ``harness bench
#: --device`` also ``cuda:N``.
DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N")


def resolve_device(name: str) -> torch.device:
    """The one place a device name becomes a device: ``auto`` → CUDA when torch sees a GPU,
    else the CPU; ``cpu``; ``cuda`` (the current GPU: a local worker sees only its own, as
    ``cuda:0``; without one, torch's first CUDA call says so); ``cuda:N``, checked against the
    GPUs this process sees. Creates no CUDA context (a launcher asks before its ranks start).

    Raises:
        ValueError: an unknown name, or ``cuda:N`` beyond the GPUs this process sees.
    """
    import torch

    kind, colon, index = name.partition(":")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if name in ("auto", "cuda"):
        return torch.device("cuda")
    if kind == "cuda" and colon and index.isdigit():
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index) >= n:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f", CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
            raise ValueError(f"device {name!r}: this process sees {n} GPU(s){where}")
        return torch.device("cuda", int(index))
    raise ValueError(f"unknown device {name!r}; valid: {', '.join(DEVICE_NAMES)}")


#: What decides a cell's numbers, relative to the checkout (the suite is in the record).
CODE_PATHS = ("harness", "methods", "reports", "pyproject.toml")


@cache
def git_commit() -> str:
    """The harness checkout's commit (with '+dirty' for local changes to its code), or
    'unknown'.

    Only the code that computes results counts (``CODE_PATHS``): a grid that writes its records
    into a tracked folder of the checkout (``docs/results``) rewrites tracked ``suite.json`` and
    failed records there, which said "+dirty" of every record though the code was the commit's.
    """
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(mod: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(mod)
    except PackageNotFoundError:
        return "absent"


def device_name(device: torch.device) -> str:
    """The one name of a device (``cuda:0 NVIDIA H200``, ``cpu``), as every file of a cell says
    it: ``cost.device``; ``environment.device`` (a CPU's processor and threads added);
    ``progress.json`` (the physical GPU added when the process sees only some)."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    return "cpu"


#: The CPU features that decide which kernels torch, oneDNN and MKL dispatch to (x86: the SSE4,
#: AVX2 and AVX-512 paths, bf16/VNNI dot products, AMX tiles; Arm: NEON, SVE, bf16 and int8
#: matrix multiply). A record lists those present, in this order: the 100-odd others (``sse``,
#: ``rdrand``, ``vmx``…) change no number.
KERNEL_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2",
    "bf16", "i8mm",
)  # fmt: skip


@cache
def _cpuinfo() -> str | None:
    """``/proc/cpuinfo``'s text, or None where the system has none (macOS, Windows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cpuinfo_field(text: str | None, keys: tuple[str, ...]) -> str | None:
    """The first non-empty value of one of ``keys`` in ``/proc/cpuinfo``'s text (each processor
    repeats it; the first stands for all), or None."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys and value.strip():
            return value.strip()
    return None


def cpu_model(cpuinfo: str | None = None) -> str:
    """The processor's model name (``AMD EPYC 7B13``, ``Intel(R) Xeon(R) Processor``) where the
    system says it, else the architecture (``x86_64``). Seeded CPU runs agree to the last digit
    on one processor model, not across models (their kernels take other vector paths), and CPU
    throughput depends on it, so a record names it. ``platform.processor()`` gives only the
    architecture on Linux; ``/proc/cpuinfo`` is where Linux says the model (``cpuinfo``: its
    text, default this machine's)."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    return (
        _cpuinfo_field(text, ("model name", "Model")) or platform.processor() or platform.machine()
    )


def cpu_flags(cpuinfo: str | None = None) -> str | None:
    """The :data:`KERNEL_FLAGS` this processor has, space-separated (``"avx avx2 fma
    avx512f"``), from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on Arm; ``cpuinfo``: its
    text, default this machine's); None where it has no such line. Two machines of one model
    name can differ here (a VM may hide AVX-512 or AMX from its guest), and the kernels follow
    the flags, not the name."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    line = _cpuinfo_field(text, ("flags", "Features"))
    if line is None:
        return None
    present = set(line.split())
    return " ".join(f for f in KERNEL_FLAGS if f in present)


def torch_libraries(config: str) -> dict[str, str | None]:
    """The CPU math libraries torch was built with, from ``torch.__config__.show()``'s text:
    ``blas`` (its BLAS, ``BLAS_INFO``: ``mkl``, ``open``…), ``mkl`` (MKL's version, ``2024.2``)
    and ``onednn`` (oneDNN's, ``3.12.0``); None for one the build does not name. These libraries
    pick their own kernels and summation orders, so one torch version built against another MKL
    or oneDNN can differ in the last digits."""
    patterns = {
        "blas": r"BLAS_INFO=([^,\s]+)",
        "mkl": r"Math Kernel Library Version ([0-9][^\s-]*)",
        "onednn": r"(?:MKL-DNN|oneDNN) v([0-9][^\s)]*)",
    }
    found = {key: re.search(pattern, config) for key, pattern in patterns.items()}
    return {key: m.group(1) if m else None for key, m in found.items()}


def numpy_blas() -> str | None:
    """numpy's BLAS, name and version (``scipy-openblas 0.3.31.188.0``), or None where numpy
    does not say (numpy before 1.26 has no ``show_config(mode="dicts")``). The harness computes
    some statistics in numpy, not its training."""
    try:
        import numpy as np

        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return " ".join(str(blas[k]) for k in ("name", "version") if blas.get(k)) or None
    except (ImportError, TypeError, ValueError, KeyError, AttributeError):
        return None


@cache
def _process() -> dict[str, Any]:
    """What stays fixed for the life of a process: the installed versions, the host, the
    processor and the libraries torch was built with. Computed once (the package metadata and
    ``/proc/cpuinfo`` are read from disk), as a grid writes a record per cell."""
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "torch_uncertainty": _version("torch-uncertainty"),
        "timm": _version("timm"),
        "harness": _version("implicit-ensemble-harness"),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        **torch_libraries(torch.__config__.show()),
        "numpy_blas": numpy_blas(),
    }


@cache
def _cudnn() -> int | None:
    """cuDNN's version as torch reports it (``92400``), or None. Asked only for a GPU cell:
    loading the library costs a CPU cell a fifth of a second and nothing it computes."""
    import torch

    try:
        return torch.backends.cudnn.version()
    except RuntimeError:  # a cuDNN torch cannot use: training on it fails and says so
        return None


def _cpu_detail(device: torch.device) -> str:
    """`` (x86_64, 2 threads)`` for the CPU: what its throughput depends on."""
    import torch

    if device.type == "cuda":
        return ""
    return f" ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def environment(device: torch.device) -> dict[str, Any]:
    """JSON-ready provenance block of a result record (docs/records.md, ``environment``): what
    tells apart two runs of one seeded cell that need not agree to the last digit."""
    import torch

    return {
        **_process(),
        "device": device_name(device) + _cpu_detail(device),
        # what a seeded CPU cell's last digits depend on besides the code and the processor
        # (``cpu``, ``cpu_flags`` and the libraries, in _process): the intra-op thread count
        # (it splits reductions) and the vector instruction set torch dispatched to (AVX2 and
        # AVX-512 kernels sum in different orders); docs/records.md
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda or "none",
        "cudnn": _cudnn() if device.type == "cuda" else None,
        "git_commit": git_commit(),
    }
