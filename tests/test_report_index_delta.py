"""The record index's delta (reports/record_index.py): a warm report writes the rows it read, not
the whole index, and a delta that is damaged, foreign or for another index is never trusted."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from test_report_index import _count_reads, _folder, _same

import reports.record_index as record_index
from reports.aggregate import load_results


def _change(path: Path, acc: float) -> None:
    """Rewrite one record with another accuracy, dated before the report (not within its 2 s)."""
    rec = json.loads(path.read_text())
    rec["metrics"]["clean"]["acc"] = acc
    path.write_text(json.dumps(rec))
    t = time.time() - 30
    os.utime(path, (t, t))


def _warm_with_delta(tmp_path: Path, monkeypatch) -> tuple[Path, list[Path]]:
    """A folder whose index holds every record and whose delta holds one changed since."""
    monkeypatch.setattr(record_index, "DELTA_MAX", 5)
    results = _folder(tmp_path)
    load_results(results, index=True)
    index = (results / record_index.INDEX_FILE).read_bytes()
    _change(sorted(results.glob("*/record.json"))[0], 0.5)
    load_results(results, index=True)
    assert (results / record_index.INDEX_FILE).read_bytes() == index  # not rewritten
    assert (results / record_index.DELTA_FILE).is_file()
    return results, sorted(results.glob("*/record.json"))


def test_a_warm_report_writes_only_a_delta_and_reads_back_what_a_cold_one_reads(
    tmp_path, monkeypatch
):
    results, paths = _warm_with_delta(tmp_path, monkeypatch)
    reads = _count_reads(monkeypatch)
    warm = load_results(results, index=True)
    assert reads == []  # the changed record comes from the delta
    assert warm.cells.loc[warm.cells["cell_id"] == paths[0].parent.name, "acc"].item() == 0.5
    _same(warm, load_results(results, index=False))
    # A second change joins the first in the delta; a change back is the record's, not the
    # delta's older row.
    _change(paths[1], 0.25)
    _change(paths[0], 0.75)
    reads.clear()
    warm = load_results(results, index=True)
    assert sorted(reads) == sorted(p.parent for p in paths[:2])
    reads.clear()
    again = load_results(results, index=True)
    assert reads == []
    _same(again, load_results(results, index=False))
    assert again.cells.loc[again.cells["cell_id"] == paths[0].parent.name, "acc"].item() == 0.75


def test_a_delta_past_its_limit_is_folded_into_a_rewritten_index(tmp_path, monkeypatch):
    results, paths = _warm_with_delta(tmp_path, monkeypatch)
    monkeypatch.setattr(record_index, "DELTA_MAX", 1)  # the next change makes it two rows
    _change(paths[1], 0.25)
    before = (results / record_index.INDEX_FILE).read_bytes()
    load_results(results, index=True)
    assert not (results / record_index.DELTA_FILE).exists()
    assert (results / record_index.INDEX_FILE).read_bytes() != before
    reads = _count_reads(monkeypatch)
    _same(load_results(results, index=True), load_results(results, index=False))
    assert len(reads) == 19  # only the cold load read them


@pytest.mark.parametrize(
    "damage",
    [
        lambda p, other: p.write_bytes(b"not an npz"),
        lambda p, other: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
        # A delta of another index: this index's own delta, moved beside another folder's.
        lambda p, other: p.write_bytes((other / record_index.DELTA_FILE).read_bytes()),
    ],
    ids=["garbage", "truncated", "another-index"],
)
def test_a_damaged_or_foreign_delta_is_not_trusted(tmp_path, monkeypatch, damage):
    results, paths = _warm_with_delta(tmp_path / "a", monkeypatch)
    other, _ = _warm_with_delta(tmp_path / "b", monkeypatch)  # another index, its own delta
    damage(results / record_index.DELTA_FILE, other)
    reads = _count_reads(monkeypatch)
    warm = load_results(results, index=True)
    assert reads == [paths[0].parent]  # the changed record is read again, not taken from it
    _same(warm, load_results(results, index=False))
