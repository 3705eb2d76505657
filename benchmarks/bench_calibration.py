"""What post-hoc calibration adds to a cell's evaluation: trained cells evaluated with and without.

For each done cell of a results folder (its ``final.pt``), runs the cell's whole evaluation
(clean, corruptions, OOD: :func:`harness.engine.evaluate.evaluate_all`) with ``calibrate`` off and
on, ``--repeats`` times each, alternating, and reports the smallest wall time of each (the least
disturbed by other processes) and the calibration's own ``time_s``. Writes JSON rows to ``-o``.

    harness run suites/smoke.yaml                 # the cells to evaluate (weights kept)
    python benchmarks/bench_calibration.py results/smoke --suite suites/smoke.yaml \
        --methods single deep_ensemble sigma_ens -o artifacts/bench-calibration.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from harness.config.parse import load_suite
from harness.contract import Cell
from harness.data._machinery.base import default_data_root
from harness.engine.build import build_model, load_data, load_trained, seed_everything
from harness.engine.environment import resolve_device
from harness.engine.evaluate import evaluate_all


def _cells(results: Path, methods: list[str]) -> list[tuple[Path, Cell]]:
    out = []
    for cell_json in sorted(results.glob("*/cell.json")):
        cell = Cell.from_json(json.loads(cell_json.read_text()))
        if cell.method in methods and cell.seed == 0 and (cell_json.parent / "final.pt").exists():
            out.append((cell_json.parent, cell))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--suite", required=True, help="its evaluation block, with calibrate: true")
    ap.add_argument("--methods", nargs="+", default=["single", "deep_ensemble", "sigma_ens"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    evaluation = load_suite(args.suite).evaluation
    if not evaluation.calibrate:
        raise SystemExit(f"{args.suite}: its evaluation does not calibrate")
    root = default_data_root()
    rows = []
    for cell_dir, cell in _cells(args.results, args.methods):
        device = resolve_device(cell.recipe.device)
        times: dict[bool, list[float]] = {False: [], True: []}
        cal_s: list[float] = []
        for _ in range(args.repeats):
            for on in (False, True):
                ev = dataclasses.replace(evaluation, calibrate=on)
                c = dataclasses.replace(cell, evaluation=ev)
                spec, splits = load_data(c, root)
                model, _ = build_model(c, spec, None, device)
                load_trained(c, cell_dir, model, device)
                seed_everything(c.seed)
                t0 = time.perf_counter()
                metrics = evaluate_all(model, splits, spec, ev, c.recipe, device, root)
                times[on].append(time.perf_counter() - t0)
                if on:
                    cal_s.append(metrics["calibration"]["time_s"])
        off, on = min(times[False]), min(times[True])
        row = {
            "method": cell.method,
            "M": cell.M,
            "eval_s": off,
            "eval_calibrated_s": on,
            "added_s": on - off,
            "added_fraction": (on - off) / off,
            "calibration_time_s": min(cal_s),
            "calibration_fraction": min(cal_s) / off,
        }
        rows.append(row)
        print(
            f"{cell.method:16s} M={cell.M}  eval {off:6.2f} s  with calibration {on:6.2f} s  "
            f"(+{100 * row['added_fraction']:.1f}%; calibration's own time_s "
            f"{min(cal_s):.2f} s = {100 * row['calibration_fraction']:.1f}%)"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
        }
        args.output.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
