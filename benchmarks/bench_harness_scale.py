"""The harness at study scale: report, validate, the run plan and status over N synthetic records.

    python benchmarks/bench_harness_scale.py --n 1000 10000 50000 [--root /tmp/scale] [--keep]

For each N it writes a suite of about N cells (the 2 built-in datasets × single, seven
comparators at M ∈ {2, 4, 8, 16} and a σN-Ens τ sweep at those M, × 10 seeds), writes a record
for every cell but 10 from a real record (``tests/golden/smoke_records.json.gz``, a smoke-suite
cell run on CPU) with the cell's own identity and per-configuration and per-seed noise on its
metrics, then times, each in a fresh process:

- ``report cold``: ``harness report`` with no record index (``--no-index``), without and with
  figures: every record read, every table and figure written;
- ``report, 10 changed``: a report with the index first (which writes it), then 10 records
  rewritten and a report again (the index re-reads those 10; every table and figure is written
  again: the index is the reporter's only cache), without and with figures;
- ``validate``, ``run plan`` (``harness run --dry-run``, which decides every cell) and ``status``.

Each row: wall seconds, CPU seconds, and the process's peak resident memory (VmHWM).

The table it prints is the one in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = Path(os.environ.get("BENCH_TEMPLATE", ROOT / "tests/golden/smoke_records.json.gz"))
DATASETS = ("digits", "digits_hard")  # the built-in ones: no download
COMPARATORS = ("deep_ensemble", "batch_ensemble", "packed_ensemble", "mimo", "masksembles",
               "mc_dropout", "film_ensemble")  # fmt: skip
SEEDS = 10
N_MISSING = 10  # cells left without a record: the run plan has these to run
N_CHANGED = 10  # records rewritten between the cold and the warm report


def suite_yaml(n: int) -> str:
    """A suite of about ``n`` cells (see the module docstring)."""
    per_dataset = n / SEEDS / len(DATASETS)
    taus = max(1, round((per_dataset - 1 - 4 * len(COMPARATORS)) / 4))
    tau_list = ", ".join(f"{0.05 * (i + 1):.2f}" for i in range(taus))
    methods = "\n".join(f"    - name: {m}\n      M: [2, 4, 8, 16]" for m in COMPARATORS)
    return f"""name: scale{n}
include: {ROOT}/suites/common/digits_hard_recipe.yaml
grid:
  datasets: [{DATASETS[0]}, {DATASETS[1]}]
  backbones: [digits_cnn]
  M: [4]
  seeds: [{", ".join(str(s) for s in range(SEEDS))}]
  methods:
    - single
{methods}
    - name: sigma_ens
      M: [2, 4, 8, 16]
      hparams: {{tau: [{tau_list}], lam: 0.1}}
evaluation:
  corruptions: []
  ood: []
"""


def _template() -> dict:
    with gzip.open(TEMPLATE, "rt", encoding="utf-8") as f:
        records = json.load(f)
    return next(r for r in records if r["status"] == "done")


def _noisy(metrics: dict, rng: random.Random, effect: float) -> dict:
    out = copy.deepcopy(metrics)
    clean = out.get("clean", {})
    for k in ("acc", "nll", "ece", "brier"):
        if isinstance(clean.get(k), float):
            sign = 1 if k == "acc" else -1
            clean[k] = max(0.0, clean[k] + sign * effect + rng.gauss(0, 0.01))
    return out


def write_folder(results: Path, n: int) -> tuple[Path, list[str]]:
    """The suite file and a results folder with every cell but ``N_MISSING`` done."""
    from harness.config.parse import load_suite
    from harness.contract import new_record
    from harness.executors.base import write_manifest

    results.mkdir(parents=True, exist_ok=True)
    suite_file = results.parent / f"scale{n}.yaml"
    suite_file.write_text(suite_yaml(n), encoding="utf-8")
    suite = load_suite(suite_file)
    cells = suite.cells()
    write_manifest(suite, results)
    template = _template()
    rng = random.Random(n)
    effects: dict[str, float] = {}
    for cell in cells[: len(cells) - N_MISSING]:
        rec = new_record(cell, template["environment"], template["started_at"])
        config = cell.label.rsplit("/seed", 1)[0]
        effect = effects.setdefault(config, rng.gauss(0, 0.01))
        for key in ("status", "cost", "history", "diagnostics", "timings", "finished_at"):
            rec[key] = copy.deepcopy(template[key])
        rec["metrics"] = _noisy(template["metrics"], rng, effect)
        folder = results / cell.cell_id
        folder.mkdir(exist_ok=True)
        (folder / "record.json").write_text(json.dumps(rec), encoding="utf-8")
    return suite_file, [c.cell_id for c in cells[:N_CHANGED]]


def change(results: Path, cell_ids: list[str]) -> None:
    """Rewrite ``cell_ids``' records with another accuracy (a re-evaluation, say)."""
    for cell_id in cell_ids:
        path = results / cell_id / "record.json"
        rec = json.loads(path.read_text(encoding="utf-8"))
        rec["metrics"]["clean"]["acc"] = round(rec["metrics"]["clean"]["acc"] * 0.99, 6)
        path.write_text(json.dumps(rec), encoding="utf-8")


# Peak memory from /proc/self/status VmHWM (the high-water mark of this process's own memory:
# getrusage's ru_maxrss carries the parent's peak across exec). CPU seconds beside wall seconds:
# on a machine shared with other jobs the wall time is mostly waiting for a core.
_CHILD = """
import os, sys, time
def cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
t, c = time.perf_counter(), cpu()
from harness.cli import main
sys.stdout = open(os.devnull, "w")
code = main(sys.argv[1:])
wall, cpu = time.perf_counter() - t, cpu() - c
peak = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) / 1024
print(f"@@ {wall:.3f} {peak:.0f} {code} {cpu:.3f}", file=sys.stderr)
"""


def timed(args: list[str]) -> tuple[float, float, float]:
    """(wall s, peak MiB, CPU s) of ``harness <args>`` in a fresh process (imports included)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT)  # fmt: skip
    line = [x for x in proc.stderr.splitlines() if x.startswith("@@ ")]
    if proc.returncode or not line or line[-1].split()[3] != "0":
        raise RuntimeError(f"harness {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    _, wall, peak, _, cpu = line[-1].split()
    return float(wall), float(peak), float(cpu)


def _cell(value: tuple[float, float, float]) -> str:
    wall, peak, cpu = value
    return f"{wall:.1f} s ({cpu:.1f} s CPU), {peak:.0f} MiB"


class _Rows(dict):
    """The timings of one N, each printed as it is measured (a long run keeps what it has)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __setitem__(self, key: str, value: tuple[float, float, float]) -> None:
        super().__setitem__(key, value)
        print(f"N={self.n}: {key}: {_cell(value)}", flush=True)


def bench(root: Path, n: int) -> dict[str, tuple[float, float, float]]:
    """Every timing of one N (see the module docstring)."""
    results = root / f"scale{n}" / f"scale{n}"
    if results.parent.exists():
        shutil.rmtree(results.parent)
    t = time.perf_counter()
    suite_file, changed = write_folder(results, n)
    os.sync()  # the folder's writeback is the generator's cost, not the first report's
    print(f"N={n}: wrote {len(list(results.glob('*/record.json')))} records in "
          f"{time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
    out = _Rows(n)
    report = ["report", str(results), "--output", str(root / f"scale{n}" / "page")]
    out["report cold, no figures"] = timed([*report, "--no-figures", "--no-index"])
    out["report cold"] = timed([*report, "--no-index"])
    out["report writing the index"] = timed(report)
    change(results, changed)
    os.sync()
    out["report, 10 changed, no figures"] = timed([*report, "--no-figures"])
    change(results, changed)
    os.sync()
    out["report, 10 changed"] = timed(report)
    out["validate"] = timed(["validate", str(suite_file), "--skip-data"])
    out["run plan (--dry-run)"] = timed(["run", str(suite_file), "--dry-run", "--results",
                                         str(results.parent)])  # fmt: skip
    out["status"] = timed(["status", str(results)])
    page = root / f"scale{n}" / "page" / "leaderboard.html"
    print(f"N={n}: leaderboard.html {page.stat().st_size / 2**20:.1f} MiB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--root", type=Path, default=Path("/tmp/harness-scale"))
    parser.add_argument("--keep", action="store_true", help="keep the generated folders")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    table = {}
    for n in args.n:
        before = os.getloadavg()[0]
        table[n] = bench(args.root, n)
        print(
            f"N={n}: load average {before:.1f} before, {os.getloadavg()[0]:.1f} after", flush=True
        )
    rows = list(next(iter(table.values())))
    print("\n| | " + " | ".join(f"N = {n:,}" for n in table) + " |")
    print("|---|" + "---:|" * len(table))
    for row in rows:
        cells = [_cell(table[n][row]) for n in table]
        print(f"| {row} | " + " | ".join(cells) + " |")
    if not args.keep:
        shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
