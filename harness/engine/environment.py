"""Provenance of a result: versions, git commit, host and device."""

from __future__ import annotations

import os
import platform
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


def cpu_model() -> str:
    """The processor's model name (``AMD EPYC 7B13``, ``Intel(R) Xeon(R) Processor``) where the
    system says it, else the architecture (``x86_64``). Seeded CPU runs agree to the last digit
    on one processor model, not across models (their kernels take other vector paths), and CPU
    throughput depends on it, so a record names it. ``platform.processor()`` gives only the
    architecture on Linux; ``/proc/cpuinfo`` is where Linux says the model."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_detail(device: torch.device) -> str:
    """`` (x86_64, 2 threads)`` for the CPU: what its throughput depends on."""
    import torch

    if device.type == "cuda":
        return ""
    return f" ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def environment(device: torch.device) -> dict[str, Any]:
    """JSON-ready provenance block of a result record."""
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
        "device": device_name(device) + _cpu_detail(device),
        "cpu": cpu_model(),
        # what a seeded CPU cell's last digits depend on besides the code: the intra-op thread
        # count (it splits reductions) and the vector instruction set torch dispatched to
        # (AVX2 and AVX-512 kernels sum in different orders); docs/records.md
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda or "none",
        "git_commit": git_commit(),
    }
