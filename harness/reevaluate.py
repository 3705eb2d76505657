"""``harness evaluate``: re-evaluate finished cells from their saved final weights.

When a suite gains an OOD set or a corruption, its cells keep their ids (the evaluation block is
not part of the id), so their records can be brought up to date without retraining: the model is
rebuilt, ``final.pt`` loaded, the new evaluation run, and the record rewritten atomically.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from harness.contract import Cell, read_manifest
from harness.data.base import default_data_root
from harness.evaluate import evaluate_all
from harness.records import atomic_write_text, read_record, write_record
from harness.runner import build_model, load_data, now, pick_device


def reevaluate(
    results_dir: Path, suite_path: str | None = None, data_root: str | None = None
) -> int:
    """Re-evaluate every done cell of a results folder; returns a process exit status."""
    from tqdm.auto import tqdm

    manifest = read_manifest(results_dir)
    evaluation = None
    if suite_path or manifest.get("source"):
        from harness.suite import load_suite

        path = suite_path or manifest["source"]
        if Path(path).exists():
            evaluation = load_suite(path).evaluation
    root = default_data_root(data_root)
    done = 0
    cell_dirs = sorted(p.parent for p in Path(results_dir).glob("*/record.json"))
    for cell_dir in tqdm(cell_dirs, desc="re-evaluating", unit="cell"):
        rec = read_record(cell_dir)
        if rec is None or rec["status"] != "done":
            continue
        weights = cell_dir / "final.pt"
        if not weights.exists():
            print(f"{cell_dir.name}: no final.pt, skipped", file=sys.stderr)
            continue
        cell = Cell.from_json(json.loads((cell_dir / "cell.json").read_text()))
        if evaluation is not None:
            cell = dataclasses.replace(cell, evaluation=evaluation)
            text = json.dumps(cell.to_json(), indent=1) + "\n"
            atomic_write_text(cell_dir / "cell.json", text)
        device = pick_device(cell.recipe.device)
        spec, splits = load_data(cell, root)
        model, _ = build_model(cell, spec)
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        model.to(device)
        rec["metrics"] = evaluate_all(
            model, splits, spec, cell.evaluation, cell.recipe, device, root
        )
        rec["evaluation"] = cell.to_json()["evaluation"]
        rec["finished_at"] = now()
        write_record(cell_dir, rec)
        done += 1
    print(f"re-evaluated {done} cells in {results_dir}")
    return 0
