"""Provenance of a result: versions, git commit, host and device."""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent


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
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def environment(device: torch.device) -> dict[str, Any]:
    """JSON-ready provenance block of a result record."""
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
