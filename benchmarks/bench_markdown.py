"""Markdown tables from ``harness bench`` JSON files, ready to paste into docs/benchmarks.md.

    python benchmarks/bench_markdown.py artifacts/gpu/*.json > artifacts/gpu/benchmarks.md

One section per file (backbone, M, B, eager or compiled, with its provenance line: device, date,
torch version, commit), the columns of the printed table (the real-loop ones and the ratio
real/synthetic when measured with ``--loop real``), then one M-scaling table per backbone and
mode when the files hold several M: train and eval images/s with their ratio to that M's bound.
Plain pandas-free string formatting: the tables are small and this keeps the script importable
without the reporting stack.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.cli.bench import cell, columns


def mode(result: dict[str, Any]) -> str:
    """compiled, graphed (the real loop's CUDA graph) or eager, and the σNorm path when it is
    not the default (``reference``: the PyTorch path the Triton kernels replace)."""
    p = result["provenance"]
    steps = "compiled" if p.get("compile") else p.get("step_mode", "eager")
    kernels = p.get("sigma_kernels", "auto")
    return steps if kernels == "auto" else f"{steps}, σNorm {kernels}"


def title(result: dict[str, Any]) -> str:
    c = result["config"]
    return (
        f"{c['backbone']}, B={c['batch']}, M={c['M']}, {mode(result)}, "
        f"{c['image_size']}×{c['image_size']}, K={c['classes']}, loop={c.get('loop', 'synthetic')}"
    )


def provenance(result: dict[str, Any]) -> str:
    p, c = result["provenance"], result["config"]
    amp = "bf16 autocast, channels_last" if p.get("bf16_autocast") else "float32"
    commit = p.get("git_commit", "?")
    commit = commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")
    # A run killed at its time limit leaves the rows it measured (``complete`` False).
    cut = "; cut short: the rows measured before the limit" if not result.get("complete", 1) else ""
    return (
        f"{p.get('device', '?')}; {p.get('date', '?')}; torch {p.get('torch', '?')}; "
        f"commit {commit}; {amp}; "
        f"{c['steps']} timed steps after {c['warmup']} warm-up{cut}"
    )


def table(result: dict[str, Any]) -> str:
    """The rows of one bench result as a Markdown table."""
    cols = columns(result)
    lines = [
        "| " + " | ".join(["row"] + [h for h, _, _ in cols]) + " |",
        "|" + "---|" * (len(cols) + 1),
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error']} |" + " |" * (len(cols) - 1))
            continue
        lines.append("| " + " | ".join([r["label"]] + [cell(r, k, f) for _, k, f in cols]) + " |")
    return "\n".join(lines)


def scaling(results: list[dict[str, Any]]) -> str:
    """Method × M: "train / eval img/s (train/bound)" for results differing only in M."""
    ms = sorted({r["config"]["M"] for r in results})
    by_label: dict[str, dict[int, str]] = defaultdict(dict)
    for res in results:
        for r in res["rows"]:
            if r.get("M", 1) == 1 and r["method"] == "single":
                continue  # the bound rows are per M already, in the ratios
            by_label[r["label"]][res["config"]["M"]] = (
                "failed"
                if "error" in r
                else f"{cell(r, 'train_images_per_s', 'rate')} / "
                f"{cell(r, 'eval_images_per_s', 'rate')} "
                f"({cell(r, 'train_ratio_to_bound', '{:.2f}')})"
            )
    lines = [
        "| method | " + " | ".join(f"M={m}" for m in ms) + " |",
        "|" + "---|" * (len(ms) + 1),
    ]
    for label, per_m in by_label.items():
        lines.append(f"| {label} | " + " | ".join(per_m.get(m, "-") for m in ms) + " |")
    return "\n".join(lines)


def fragment(paths: list[Path]) -> str:
    """The whole Markdown fragment for the given JSON files, in the order given."""
    results = [(p, json.loads(p.read_text())) for p in paths]
    out: list[str] = []
    for path, res in results:
        out += [f"### {title(res)}", "", f"`{path.name}` — {provenance(res)}", "", table(res), ""]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for _, res in results:
        groups[(res["config"]["backbone"], mode(res))].append(res)
    for (backbone, how), group in groups.items():
        if len({r["config"]["M"] for r in group}) > 1:
            out += [
                f"### M scaling: {backbone}, {how} — train / eval img/s (train ÷ bound)",
                "",
                scaling(sorted(group, key=lambda r: r["config"]["M"])),
                "",
            ]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: bench_markdown.py BENCH.json [...]", file=sys.stderr)
        return 2
    print(fragment([Path(a) for a in argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
