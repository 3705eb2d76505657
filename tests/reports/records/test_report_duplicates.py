"""One seed counts once: two records of the same configuration and seed under different cell ids
(a re-run after a new hyper-parameter's default changed the id) are not two seeds."""

from __future__ import annotations

import pytest

from reports.records.results import from_records
from tests.record_factory import make_record


def test_the_newer_duplicate_is_counted_and_the_older_is_listed():
    old = [make_record(seed=s, acc=0.80, cell_id=f"old{s}") for s in (0, 1)]
    new = [make_record(seed=s, acc=0.90 + 0.02 * s, cell_id=f"new{s}") for s in (0, 1)]
    for r in old:
        r["finished_at"] = "2026-11-30T20:00:00+00:00"
    for r in new:
        r["finished_at"] = "2026-11-30T21:00:00+00:00"
    res = from_records([*new, *old])  # order on disk must not matter
    row = res.summary.iloc[0]
    assert row["n"] == 2 and row["acc_mean"] == pytest.approx(0.91)
    dups = sorted((p.cell_id, p.status, p.reason) for p in res.problems)
    assert [d[:2] for d in dups] == [("old0", "duplicate"), ("old1", "duplicate")]
    assert "newer record new0" in dups[0][2] and "newer record new1" in dups[1][2]
    assert sorted(res.cells["cell_id"]) == ["new0", "new1"]


def test_records_spelling_a_default_recipe_field_are_not_a_variant():
    a = make_record(seed=0, cell_id="a")
    b = make_record(seed=1, cell_id="b")
    b["config"]["recipe"]["processes"] = 1  # a version that wrote the default out
    a["config"]["recipe"].pop("processes", None)
    res = from_records([a, b])
    assert len(res.summary) == 1 and res.summary.iloc[0]["n"] == 2
    assert res.summary.iloc[0]["variant"] == ""
