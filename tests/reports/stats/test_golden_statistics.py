"""The report's statistics are those of the reporter before they were batched: every paired row
(its interval, p-value and mark) and every bold cell, on the smoke suite's records and on a
200-configuration synthetic folder (files written by commit 17b433c's code, tests/golden/)."""

from __future__ import annotations

import math

import pytest

from reports.records.results import from_records
from tests.golden.statistics import SMOKE, load_golden, smoke_records, snapshot
from tests.scale_records import golden_records


def _same(old: dict, new: dict) -> list[str]:
    """Differences between two snapshots, one line each (empty when equal)."""
    out = []
    for case in old:
        rows_old = {tuple(r["key"]): r for r in old[case]["paired"]}
        rows_new = {tuple(r["key"]): r for r in new[case]["paired"]}
        if rows_old.keys() != rows_new.keys():
            out.append(f"{case}: paired rows {len(rows_old)} → {len(rows_new)}")
        for key in rows_old.keys() & rows_new.keys():
            a, b = rows_old[key], rows_new[key]
            for f, v in a.items():
                w = b[f]
                if isinstance(v, float) and isinstance(w, float):
                    if not (math.isclose(v, w, rel_tol=1e-9, abs_tol=1e-12)):
                        out.append(f"{case} {key} {f}: {v} → {w}")
                elif v != w:
                    out.append(f"{case} {key} {f}: {v} → {w}")
        if old[case]["bold"] != new[case]["bold"]:
            out.append(f"{case}: bold cells differ")
    return out


@pytest.mark.slow  # 1,300 records, three tests each: about 30 s of CPU
def test_synthetic_200_configurations_keep_every_mark_interval_and_bold_cell():
    old = load_golden("synthetic200")
    new = snapshot(from_records(golden_records()))
    assert sum(len(v["paired"]) for v in old.values()) > 3000  # the file is the real one
    assert any(r["significant"] for r in old["signflip"]["paired"])
    assert _same(old, new) == []


@pytest.mark.skipif(not SMOKE.exists(), reason="smoke records not stored")
def test_smoke_results_keep_every_mark_interval_and_bold_cell():
    old = load_golden("smoke")
    new = snapshot(from_records(smoke_records()))
    assert _same(old, new) == []
