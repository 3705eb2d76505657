"""Start-up cost of the harness command line and of a cell's process: min and median of N
runs, each a fresh process, in wall seconds and CPU seconds (user + system).

    python benchmarks/startup.py REPO N

REPO goes first on PYTHONPATH and is the working directory (its suites/smoke.yaml is used);
``harness ls`` gets a cache folder of its own, filled once before the timed runs (the figure
is the cached listing's). The "first step" rows time a one-epoch cell of smoke.yaml from the
start of the process that trains it until its first optimizer step
(``benchmarks/startup_probe.py``, loaded with ``--plugin``): in this process
(``--executor inprocess``: parsing and validating the suite included) or in a spawned local
worker (``--executor local --workers 1``: the worker's own start only). The results are
printed, one row per case, then as JSON (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(
    argv: list[str], repo: str, env: dict[str, str], probe: Path | None
) -> tuple[float, float]:
    """(wall, CPU) seconds of ``python ARGV``: until it exits, or what the probe wrote at the
    first training step (the run is then stopped: its parent may wait for a lost worker)."""
    if probe is not None:
        probe.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        env=env,
        cwd=repo,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if probe is None:
        _, status, usage = os.wait4(proc.pid, 0)
        if status != 0:
            raise RuntimeError(f"{argv} failed (status {status}): {proc.stderr.read()[-2000:]}")
        return time.perf_counter() - start, usage.ru_utime + usage.ru_stime
    while proc.poll() is None and not probe.exists():
        time.sleep(0.05)
    time.sleep(0.1)  # the file is written just before the probe's process exits
    with contextlib.suppress(ProcessLookupError):  # the parent may wait for its lost worker
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if not probe.exists():
        raise RuntimeError(f"{argv} reached no training step: {proc.stderr.read()[-2000:]}")
    wall, cpu = map(float, probe.read_text().split())
    return wall, cpu


def cases(results: str) -> dict[str, list[str]]:
    """Case name → the interpreter's arguments."""
    h = ["-m", "harness.cli"]
    cell = [
        *("run", "suites/smoke.yaml", "--plugin", "startup_probe", "-q", "--force"),
        *("--results", results, "recipe.epochs=1", "recipe.warmup_epochs=0"),
    ]
    return {
        "harness --help": [*h, "--help"],
        "harness ls": [*h, "ls"],
        "harness validate suites/smoke.yaml": [*h, "validate", "suites/smoke.yaml"],
        "first step, in process: single": [
            *h,
            *cell,
            "--executor",
            "inprocess",
            "--only",
            "method=single,seed=0",
        ],
        "first step, in process: sigma_ens": [
            *h,
            *cell,
            "--executor",
            "inprocess",
            "--only",
            "method=sigma_ens,seed=0",
        ],
        "first step, local worker: single": [
            *h,
            *cell,
            "--executor",
            "local",
            "--workers",
            "1",
            "--only",
            "method=single,seed=0",
        ],
        "first step, local worker: sigma_ens": [
            *h,
            *cell,
            "--executor",
            "local",
            "--workers",
            "1",
            "--only",
            "method=sigma_ens,seed=0",
        ],
    }


def main() -> None:
    repo, n = sys.argv[1], int(sys.argv[2])
    only = sys.argv[3:]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "first_step.txt"
        env = dict(
            os.environ,
            PYTHONPATH=f"{repo}{os.pathsep}{HERE}",
            HARNESS_CACHE_DIR=str(Path(tmp) / "cache"),
            STARTUP_PROBE_OUT=str(probe),
        )
        env.pop("HARNESS_PLUGINS", None)
        for name, argv in cases(str(Path(tmp) / "results")).items():
            if only and not any(o in name for o in only):
                continue
            if name == "harness ls":
                timed(argv, repo, env, None)  # fills the cache
            p = probe if name.startswith("first step") else None
            ts = [timed(argv, repo, env, p) for _ in range(n)]
            walls, cpus = [t[0] for t in ts], [t[1] for t in ts]
            rows[name] = {
                "wall_min": min(walls),
                "wall_median": statistics.median(walls),
                "cpu_min": min(cpus),
                "cpu_median": statistics.median(cpus),
            }
            print(
                f"{name:40s} wall min {min(walls):6.2f} median {statistics.median(walls):6.2f}"
                f"  cpu min {min(cpus):6.2f} median {statistics.median(cpus):6.2f}  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
