"""Helpers to find and use the local single-node Slurm cluster (slurm/local_cluster/start.sh).

Plain module, not a test file. Test modules take the ``slurm_env`` fixture of
``tests/conftest.py``, which is::

    with slurm_environment() as env:  # skips (fails if HARNESS_REQUIRE_SLURM=1) + reason
        yield env

``slurm_environment`` / ``require_slurm`` read ``$SLURM_LOCAL_DIR/env.sh`` (default
``/tmp/harness-slurm/env.sh``), let ``SLURM_CONF``/``SLURM_LOCAL_DIR`` from the environment
override it, and check that the cluster answers (a node up in ``sinfo``, ``sacct`` working).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LOCAL_DIR = "/tmp/harness-slurm"
REQUIRE_ENV = "HARNESS_REQUIRE_SLURM"
_USABLE_NODE_STATES = {"idle", "mix", "alloc", "comp"}
_EXPORT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def local_dir() -> Path:
    return Path(os.environ.get("SLURM_LOCAL_DIR") or DEFAULT_LOCAL_DIR)


def read_env_file(path: Path | None = None) -> dict[str, str]:
    """Parse the ``export KEY=VALUE`` lines written by start.sh; {} when the file is missing."""
    path = path or local_dir() / "env.sh"
    try:
        text = path.read_text()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for line in text.splitlines():
        match = _EXPORT.match(line)
        if match:
            key, value = match.groups()
            env[key] = value.strip().strip("'\"")
    return env


def slurm_env() -> dict[str, str]:
    """Variables needed to reach the cluster: env.sh's exports, overridden by the environment."""
    env = read_env_file()
    for key in ("SLURM_CONF", "SLURM_LOCAL_DIR"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float = 15) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} timed out after {timeout:.0f}s"
    except OSError as exc:
        return 127, str(exc)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode, out


def slurm_available(env: dict[str, str] | None = None) -> tuple[bool, str]:
    """(True, summary) when sinfo shows an up node and sacct answers, else (False, reason)."""
    env = slurm_env() if env is None else env
    for tool in ("sinfo", "sbatch", "sacct", "scancel"):
        if shutil.which(tool) is None:
            return False, f"{tool} not found"
    conf = env.get("SLURM_CONF") or os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        return False, f"SLURM_CONF={conf} does not exist (run slurm/local_cluster/start.sh)"
    rc, out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], env)
    if rc != 0:
        last = out.splitlines()[-1] if out else f"exit {rc}"
        return False, f"sinfo failed: {last}"
    nodes = [line.split() for line in out.splitlines() if line.strip()]
    states = {n[1].rstrip("*~#!%$@^-") for n in nodes if len(n) == 2}
    if not states & _USABLE_NODE_STATES:
        listing = ", ".join(" ".join(n) for n in nodes) or "no nodes"
        return False, f"no idle node (sinfo: {listing})"
    rc, out = _run(["sacct", "-n", "-X", "-S", "now"], env)
    if rc != 0:
        last = out.splitlines()[-1] if out else f"exit {rc}"
        return False, f"sacct does not answer (no accounting?): {last}"
    return True, f"slurm up: {', '.join(' '.join(n) for n in nodes)}"


def slurm_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def require_slurm() -> dict[str, str]:
    """Fixture body: the cluster's env vars (apply them to os.environ), or skip/fail.

    Skips with a one-line reason when Slurm is unavailable, unless HARNESS_REQUIRE_SLURM=1
    (CI), where it fails instead.
    """
    import pytest

    env = slurm_env()
    ok, reason = slurm_available(env)
    if not ok:
        if slurm_required():
            pytest.fail(f"Slurm required ({REQUIRE_ENV}=1) but unavailable: {reason}")
        pytest.skip(f"Slurm not available: {reason}")
    return env


@contextlib.contextmanager
def slurm_environment() -> Iterator[dict[str, str]]:
    """``require_slurm()`` plus its variables set in ``os.environ`` for the duration.

    submitit runs ``sbatch``/``sacct``/``scancel`` with ``os.environ``; jobs inherit it too
    (sbatch's default ``--export=ALL``), so ``scontrol requeue`` inside a job finds the cluster.
    """
    import pytest

    env = require_slurm()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env
