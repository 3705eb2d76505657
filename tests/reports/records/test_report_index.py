"""The record index (reports/records/index.py): the one cache beside the results, which makes a
report over 10,000 records cheap and is never trusted over the records themselves."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from record_factory import make_record, write_records

import reports.records.index as record_index
from reports.records.index import load_results


def _folder(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    recs = [
        make_record(method=m, M=M, seed=s, acc=0.8 + 0.01 * M + 0.001 * s)
        for m, M in (("deep_ensemble", 4), ("single", 1), ("mimo", 2))
        for s in range(6)
    ]
    recs.append(make_record(method="batch_ensemble", status="failed"))
    write_records(results, recs)
    _age(results)
    return results


def _age(results: Path, seconds: float = 60) -> None:
    """Date every record back, as records written before the report (not within its 2 s)."""
    t = time.time() - seconds
    for p in results.glob("*/record.json"):
        os.utime(p, (t, t))


def _count_reads(monkeypatch) -> list[Path]:
    reads: list[Path] = []
    real = record_index.read_record
    monkeypatch.setattr(record_index, "read_record", lambda d: reads.append(d) or real(d))
    return reads


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(a.cells, b.cells)
    pd.testing.assert_frame_equal(a.summary, b.summary)
    assert [(p.cell_id, p.status, p.reason) for p in a.problems] == [
        (p.cell_id, p.status, p.reason) for p in b.problems
    ]


def test_warm_report_reads_only_changed_records_and_equals_a_cold_one(tmp_path, monkeypatch):
    results = _folder(tmp_path)
    reads = _count_reads(monkeypatch)
    first = load_results(results, index=True)
    assert len(reads) == 19 and (results / record_index.INDEX_FILE).is_file()
    changed = next(p for p in results.glob("*/record.json"))
    rec = json.loads(changed.read_text())
    rec["metrics"]["clean"]["acc"] = 0.5
    changed.write_text(json.dumps(rec))
    t = time.time() - 30  # a rewrite dated before the report (not within its 2 s)
    os.utime(changed, (t, t))
    reads.clear()
    warm = load_results(results, index=True)
    assert reads == [changed.parent]  # one JSON file read, not 19
    assert warm.cells.loc[warm.cells["cell_id"] == rec["cell_id"], "acc"].item() == 0.5
    _same(warm, load_results(results, index=False))
    reads.clear()
    load_results(results, index=True)
    assert reads == []  # nothing changed: nothing read
    assert first.cells.shape == warm.cells.shape


def _text_code_out_of_range(path: Path) -> None:
    """A text column whose codes point past its distinct values (a damaged or forged index)."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["s"] = arrays["s"].copy()  # the text columns' codes, one row each
    arrays["s"][0, 0] = 10_000
    with path.open("wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(b"not an npz at all"),
        _text_code_out_of_range,
        lambda p: np.savez(p.open("wb"), header=np.frombuffer(b'{"format": "x"}', np.uint8)),
        lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    ],
    ids=["garbage", "text-codes", "foreign", "truncated"],
)
def test_a_damaged_or_foreign_index_is_rebuilt(tmp_path, monkeypatch, damage):
    results = _folder(tmp_path)
    cold = load_results(results, index=True)
    damage(results / record_index.INDEX_FILE)
    reads = _count_reads(monkeypatch)
    again = load_results(results, index=True)
    assert len(reads) == 19  # every record read again, none taken from the damaged file
    _same(cold, again)


def test_deleted_and_damaged_records_leave_the_index(tmp_path):
    results = _folder(tmp_path)
    load_results(results, index=True)
    gone, bad = sorted(results.glob("*/record.json"))[:2]
    gone.unlink()
    bad.write_text('{"truncated": ')
    res = load_results(results, index=True)
    ids = set(res.cells["cell_id"])
    assert gone.parent.name not in ids and bad.parent.name not in ids
    status = {p.cell_id: p.status for p in res.problems}
    assert status[gone.parent.name] == "missing" and status[bad.parent.name] == "invalid"


def test_the_mlflow_file_store_beside_the_cells_is_not_a_missing_cell(tmp_path):
    """`--logger mlflow` without a server writes `<results>/mlruns`: not a cell, so neither a
    missing row nor a problem (it had been reported as one cell missing)."""
    results = _folder(tmp_path)
    before = load_results(results)
    (results / "mlruns" / "0").mkdir(parents=True)
    (results / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")
    after = load_results(results)
    assert "mlruns" not in {p.cell_id for p in after.problems}
    _same(before, after)
