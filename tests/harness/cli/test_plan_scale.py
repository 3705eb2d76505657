"""Planning at scale: a large ``--dry-run`` plan is summarised (``--list``: every cell), and the
summary after a run reads the records through the record index."""

from __future__ import annotations

import json
import os
import socket
import time
from types import SimpleNamespace

import pytest
from record_factory import make_record, write_records

import reports.records.index as record_index
from harness.cli import main
from harness.cli.run import PLAN_LINES, print_plan
from reports.render.terminal import print_summary


def _cells(n: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(cell_id=f"c{i:03d}", label=f"toy/single(M=1)/seed{i}") for i in range(n)
    ]


@pytest.fixture
def folder(tmp_path):
    """60 cells: 55 done, c055 failed, c056 leased by this (live) process, c057–c059 pending."""
    results = tmp_path / "toy"
    error = {"type": "DivergenceError", "message": "nan", "phase": "train"}
    recs = [make_record(cell_id=f"c{i:03d}", seed=i) for i in range(55)]
    recs.append(make_record(cell_id="c055", seed=55, status="failed", error=error))
    for path in write_records(results, recs):  # older than the index's racy window
        os.utime(path, (time.time() - 60, time.time() - 60))
    (results / "c056").mkdir()
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    (results / "c056" / "lease.json").write_text(json.dumps(owner))
    return results


def test_a_large_plan_lists_what_would_run_and_counts_the_rest(folder, capsys):
    cells = _cells(60)
    assert print_plan(cells, cells, folder, force=False) == 0
    lines = capsys.readouterr().out.splitlines()
    host = f"{socket.gethostname()}:{os.getpid()}"
    assert lines == [
        "run   c055  toy/single(M=1)/seed55  (failed in train (DivergenceError), retried)",
        f"skip  c056  toy/single(M=1)/seed56  (leased by {host})",
        "run   c057  toy/single(M=1)/seed57  (pending)",
        "run   c058  toy/single(M=1)/seed58  (pending)",
        "run   c059  toy/single(M=1)/seed59  (pending)",
        "run   1 cells: failed, retried",
        "run   3 cells: pending",
        "skip  55 cells: done",
        "skip  1 cells: leased by another live process",
        f"dry run: 4 of 60 cells would run → {folder}",
    ]
    # --list: one line per cell, as a small plan always has.
    print_plan(cells, cells[:30], folder, force=False, every=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 61 and lines[0] == "skip  c000  toy/single(M=1)/seed0  (done)"
    assert lines[40] == "skip  c040  toy/single(M=1)/seed40  (not selected by --only)"
    assert lines[-1] == f"dry run: 0 of 60 cells would run → {folder}"


def test_the_plan_reads_the_records_and_writes_nothing_beside_them(folder, capsys):
    """No cache of the plan's own: a record truncated or from a newer harness after a first plan
    is seen at once (the cell is redone), and planning adds no file to the results folder."""
    cells = _cells(60)
    before = sorted(p.name for p in folder.iterdir())
    print_plan(cells, cells, folder, force=False)
    capsys.readouterr()
    path = folder / "c000" / "record.json"
    path.write_bytes(path.read_bytes()[:300])  # truncated after it was done
    rec = make_record(cell_id="c001", seed=1)
    rec["schema_version"] = 99
    (folder / "c001" / "record.json").write_text(json.dumps(rec))
    print_plan(cells, cells[:2], folder, force=False, every=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run   c000  toy/single(M=1)/seed0  (damaged record.json")
    assert "truncated" in lines[0]
    assert lines[1].startswith("run   c001  toy/single(M=1)/seed1  (damaged record.json")
    assert "newer harness" in lines[1]
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_plan_with_many_cells_to_run_lists_the_first_and_says_how_to_see_all(tmp_path, capsys):
    cells = _cells(200)
    print_plan(cells, cells, tmp_path / "absent", force=False)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == PLAN_LINES + 3
    assert (
        lines[PLAN_LINES - 1] == f"run   c{PLAN_LINES - 1:03d}  toy/single(M=1)/seed49  (pending)"
    )
    assert lines[PLAN_LINES] == "run   200 cells: pending"
    assert "--list lists every cell" in lines[PLAN_LINES + 1]


def test_dry_run_checks_no_data_and_list_prints_every_cell(write_suite, tmp_path, capsys):
    suite = write_suite(
        "name: fm\ngrid:\n  datasets: [digits]\n  backbones: [digits_cnn]\n  M: [2]\n"
        "  seeds: [0, 1]\n  methods: [single]\nrecipe: {epochs: 1, batch_size: 16}\n"
        "evaluation: {ood: [svhn]}\n"
    )
    empty = tmp_path / "no-data"
    empty.mkdir()
    args = ["run", str(suite), "--results", str(tmp_path / "res"), "--data-root", str(empty)]
    assert main([*args, "--dry-run", "--list"]) == 0  # the data is validate's and run's
    out = capsys.readouterr().out
    assert out.count("(pending)") == 2 and "dry run: 2 of 2 cells would run" in out
    assert main(["validate", str(suite), "--data-root", str(empty)]) == 2


def test_summary_after_a_run_reads_only_changed_records(folder, capsys, monkeypatch):
    assert print_summary(folder) == 1  # a failed cell
    out = capsys.readouterr().out
    assert "FAILED c055 deep_ensemble seed 55: DivergenceError: nan" in out
    assert (folder / record_index.INDEX_FILE).is_file()
    reads = []
    real = record_index.read_record
    monkeypatch.setattr(record_index, "read_record", lambda d: reads.append(d.name) or real(d))
    write_records(folder, [make_record(cell_id="c057", seed=57)])  # a cell finished since
    assert print_summary(folder) == 1
    assert reads == ["c056", "c057"]  # c056: no record.json to parse, looked for every time
    assert "FAILED c055 deep_ensemble seed 55" in capsys.readouterr().out
