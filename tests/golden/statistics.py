"""What the golden statistics test compares: the paired table's marks and intervals and the bold
cells of a report, as plain JSON.

``python -m tests.golden.statistics [smoke|synthetic200]`` rewrites
``tests/golden/<name>.json.gz`` from the code checked out; the files in the repository were
written by the reporter before its statistics were batched (commit 17b433c), so the test holds
the new code to the old numbers.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from reports.columns import leaderboard_columns
from reports.records.results import Results, from_records
from reports.render.paired import paired_stats
from reports.stats.bolding import bold_rows, config_key

HERE = Path(__file__).parent
SMOKE = HERE / "smoke_records.json.gz"  # 41 cells of the smoke suite at 6 seeds, run on CPU
CASES = (("signflip", False), ("t", False), ("signflip", True))
FIELDS = ("n_pairs", "seeds", "mean_diff", "ci_lo", "ci_hi", "p_value", "p_adjusted")
FLAGS = ("reachable", "significant", "better")


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def snapshot(results: Results) -> dict[str, Any]:
    """Per test case: every paired row (its key, numbers and flags) and the bold cells."""
    out: dict[str, Any] = {}
    columns = leaderboard_columns(results.summary)
    for test, holm in CASES:
        paired = paired_stats(results, test=test, holm=holm)
        rows = []
        for _, r in paired.frame.iterrows():
            key = [*config_key(r), str(r["reference"]), str(r["metric"])]
            nums = {f: _num(r[f].item() if hasattr(r[f], "item") else r[f]) for f in FIELDS}
            flags = {f: None if r[f] is None or r[f] != r[f] else bool(r[f]) for f in FLAGS}
            rows.append({"key": key, **nums, **flags})
        best = bold_rows(results.summary, results.cells, columns, test=test, alpha=paired.alpha)
        keys = {idx: " | ".join(config_key(r)) for idx, r in results.summary.iterrows()}
        bold = {col: sorted(keys[i] for i in idx) for col, idx in sorted(best.items())}
        out[f"{test}{'+holm' if holm else ''}"] = {"paired": rows, "bold": bold}
    return out


def smoke_records() -> list[dict[str, Any]]:
    with gzip.open(SMOKE, "rt", encoding="utf-8") as f:
        return json.load(f)


def main(names: list[str]) -> None:
    from tests.scale_records import golden_records

    sources = {"smoke": smoke_records, "synthetic200": golden_records}
    for name in names or sources:
        records = sources[name]()
        data = snapshot(from_records(records))
        path = HERE / f"{name}.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=0, sort_keys=True) + "\n")
        print(f"wrote {path}: {sum(len(v['paired']) for v in data.values())} paired rows")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])


def load_golden(name: str) -> dict[str, Any]:
    with gzip.open(HERE / f"{name}.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)
