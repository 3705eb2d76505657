"""Start-up cost of the harness command line: min and median of N runs, each a fresh process.

    python benchmarks/startup.py REPO N

REPO goes first on PYTHONPATH and is the working directory (its suites/smoke.yaml is used).
The last row times a one-cell ``harness run`` from the process's start until torch's global
optimizer-step hook fires: the start-up a worker pays before its first training step. The
results are printed, one row per command, then as JSON (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

FIRST_STEP = r"""
import os, sys, time
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
def hook(opt, args, kwargs):
    print("FIRST_STEP", time.time(), flush=True)
    os._exit(0)
register_optimizer_step_pre_hook(hook)
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


def timed(argv: list[str], repo: str) -> float:
    """Seconds from starting ``python ARGV`` until it exits (or reports its first step)."""
    env = dict(os.environ, PYTHONPATH=repo)
    start = time.time()
    out = subprocess.run([sys.executable, *argv], env=env, cwd=repo, capture_output=True, text=True)
    end = time.time()
    for line in out.stdout.splitlines():
        if line.startswith("FIRST_STEP"):
            return float(line.split()[1]) - start
    return end - start


def main() -> None:
    repo, n = sys.argv[1], int(sys.argv[2])
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = ["run", "suites/smoke.yaml", "--only", "method=single,seed=0"]
        cases = {
            "harness --help": ["-m", "harness.cli", "--help"],
            "harness ls": ["-m", "harness.cli", "ls"],
            "harness validate suites/smoke.yaml": ["-m", "harness.cli", "validate", run[1]],
            "run: start to first training step": [
                *("-c", FIRST_STEP, *run, "--executor", "inprocess", "-q"),
                *("--results", tmp, "recipe.epochs=1", "--force"),
            ],
        }
        for name, argv in cases.items():
            ts = [timed(argv, repo) for _ in range(n)]
            rows[name] = (min(ts), statistics.median(ts))
            print(f"{name:40s} min {min(ts):6.2f} s  median {statistics.median(ts):6.2f} s")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
