"""The one table of benchmarks/gpu_check.sh, from the JSON files it wrote into ``$OUT``.

    python benchmarks/gpu_table.py artifacts/gpu           # prints Markdown, ready to paste

Rows: each backbone × step mode the check measured (eager, graphed, compiled). Columns: σN-Ens's
and FiLM-Ensemble's training throughput ÷ the bound's through the real loop (``harness bench
--loop real``: ``train_epoch`` with the mode's step; the synthetic bare step is never graphed,
so graphed figures can only come from the real loop), evaluation ÷ bound (the bench's eval
forward), peak training memory ÷ the bound's (real loop), and the kernels a σN-Ens and a bound
step launch (benchmarks/kernels_per_step.py, eager). Below it: each epoch's step mode in a real
2-epoch σN-Ens cell (benchmarks/gpu_cell.py: "graphed" in epoch 2 is the recapture check) and
the graphed-vs-eager check of every method (benchmarks/gpu_graphs.py). A part that did not
finish in its time budget shows as "-" (its JSON keeps the rows it measured).

Targets (issue: σN-Ens at the bound): σN-Ens ≥ 0.90× of the bound eager and graphed, ≥ 0.95×
compiled, peak memory ≤ 1.10×.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MODES = ("eager", "graphed", "compiled")
BACKBONES = ("resnet18", "wrn28_10")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ratios(bench: dict[str, Any] | None, method: str) -> dict[str, float | None]:
    """``method``'s real-loop train, eval and memory ratios to the bound's, from one bench JSON."""
    out: dict[str, float | None] = {"train": None, "eval": None, "mem": None}
    if not bench:
        return out
    rows = bench.get("rows", [])
    bound = next((r for r in rows if "bound_train_images_per_s" in r), None)
    row = next((r for r in rows if r.get("method") == method and "error" not in r), None)
    if bound is None or row is None:
        return out
    if row.get("real_train_images_per_s") and bound.get("real_train_images_per_s"):
        out["train"] = row["real_train_images_per_s"] / bound["real_train_images_per_s"]
    out["eval"] = row.get("eval_ratio_to_bound")
    if row.get("real_peak_train_mem_mib") and bound.get("real_peak_train_mem_mib"):
        out["mem"] = row["real_peak_train_mem_mib"] / bound["real_peak_train_mem_mib"]
    return out


def _error(error: Any) -> str:
    """A record's error as one line: type and message, without the traceback."""
    if isinstance(error, dict):
        return f"{error.get('type')}: {str(error.get('message', ''))[:200]}"
    return str(error)[:200]


def ran_as(bench: dict[str, Any], method: str) -> str | None:
    """The step mode ``method``'s real loop actually ran in ("graphed", or "eager" when the
    capture failed or no CUDA device was there), None when the row is missing."""
    row = next((r for r in bench.get("rows", []) if r.get("method") == method), None)
    return None if row is None else row.get("real_step_mode")


def _fmt(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(out: Path) -> str:
    """The Markdown table and the lines below it (module docstring)."""
    kernels = _read(out / "kernels.json") or {}
    per_step = {r["method"]: r["per_step"] for r in kernels.get("rows", [])}
    lines = [
        "| backbone | mode | σN-Ens train ÷ bound | eval ÷ bound | peak mem ÷ bound "
        "| FiLM train ÷ bound | kernels/step σN-Ens (bound) |",
        "|---|---|---|---|---|---|---|",
    ]
    for stem in BACKBONES:
        for mode in MODES:
            bench = _read(out / f"{stem}_{mode}.json")
            if bench is None:
                continue
            backbone = bench.get("config", {}).get("backbone", stem)  # SMALL=1: the digits CNN
            sigma, film = ratios(bench, "sigma_ens"), ratios(bench, "film_ensemble")
            ran = ran_as(bench, "sigma_ens")
            label = mode if ran in (None, mode) or mode == "compiled" else f"{mode} (ran {ran})"
            k = "-"
            if mode == "eager" and kernels.get("backbone") == backbone and per_step:
                sigma_k, bound_k = per_step.get("sigma_ens"), per_step.get("single")
                k = f"{_fmt(sigma_k, '{:.0f}')} ({_fmt(bound_k, '{:.0f}')})"
            lines.append(
                f"| {backbone} | {label} | {_fmt(sigma['train'])} | {_fmt(sigma['eval'])} "
                f"| {_fmt(sigma['mem'])} | {_fmt(film['train'])} | {k} |"
            )
    cell = _read(out / "cell" / "cell.json")
    if cell:
        modes = cell.get("step_modes") or []
        if cell.get("device") == "cpu":
            verdict = "eager: CUDA graphs need a CUDA device"
        else:
            verdict = (
                "graphed in epoch 2" if modes[1:2] == ["graphed"] else "NOT graphed in epoch 2"
            )
        failed = f"; failed: {_error(cell['error'])}" if cell.get("error") else ""
        where = cell.get("device")
        lines += ["", f"Real 2-epoch σN-Ens cell ({where}): step modes {modes} — {verdict}{failed}"]
    graphs = out / "graphs.jsonl"
    if graphs.exists():
        rows = []
        for line in graphs.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by the part's budget
                continue
        checked = [r for r in rows if "method" in r]
        bad = [r["method"] for r in checked if not r.get("ok")]
        lines.append(f"Graphed = eager for {len(checked) - len(bad)} of {len(checked)} methods"
                     + (f"; failed: {', '.join(bad)}" if bad else ""))  # fmt: skip
    if kernels.get("rows"):
        lines.append(f"Kernels per step: {kernels['rows'][0]['counts']}, {kernels.get('device')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/gpu_table.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    if not out.is_dir():
        print(f"gpu_table: {out} is not a folder", file=sys.stderr)
        return 2
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
