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


@cache
def git_commit() -> str:
    """The harness checkout's commit (with '+dirty' for local changes), or 'unknown'."""
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
            ["git", "status", "--porcelain", "--untracked-files=no"],
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
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


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
        "device": device_name(device),
        "cuda": torch.version.cuda or "none",
        "git_commit": git_commit(),
    }
