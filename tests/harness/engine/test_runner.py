"""The cell runner end to end on the built-in digits: records, skip/resume, failures, kills."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from harness.config.parse import load_suite
from harness.contract import CONVENTIONS
from harness.contract.record import RecordError, read_record, validate_record
from harness.engine.runner import run_cell
from harness.executors.base import pending, write_manifest
from harness.executors.local import run_inprocess
from harness.storage.checkpoint import read_events
from harness.storage.records import write_record

TINY = """
name: tiny
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0]
  methods:
    - single
    - {name: deep_ensemble, M: [2]}
recipe: {epochs: 2, batch_size: 64, lr: 0.05}
evaluation:
  corruptions: [gaussian_noise]
  severities: [1, 5]
  ood: [sklearn_photos]
  cost_steps: 1
"""


@pytest.fixture
def tiny(write_suite):
    return load_suite(write_suite(textwrap.dedent(TINY)))


def test_record_contents(tiny, tmp_path):
    cell = tiny.cells()[1]
    rec = run_cell(cell, tmp_path, progress=False)
    validate_record(rec)
    assert rec["status"] == "done", rec["error"]
    assert rec == read_record(tmp_path / cell.cell_id)
    assert rec["cell_id"] == cell.cell_id and rec["config"]["M"] == 2
    clean = rec["metrics"]["clean"]
    assert 0.3 < clean["acc"] <= 1.0 and clean["nll"] > 0 and 0 <= clean["ece"] <= 1
    assert len(clean["members"]["acc"]) == 2
    corr = rec["metrics"]["corruption"]
    assert {(c["corruption"], c["severity"]) for c in corr["cells"]} == {
        ("gaussian_noise", 1),
        ("gaussian_noise", 5),
    }
    ood = rec["metrics"]["ood"]["sklearn_photos"]
    assert list(ood) == ["msp", "entropy", "mi", "energy", "max_logit"]
    assert 0 <= ood["msp"]["auroc"] <= 1 and 0 <= ood["energy"]["auroc"] <= 1
    assert rec["conventions"] == CONVENTIONS  # the one conventions text, written into each record
    assert "msp = max" in rec["conventions"]["ood"]
    assert "energy = mean_m logsumexp_k z_m,k" in rec["conventions"]["ood"]
    cost = rec["cost"]
    assert cost["params_total"] == 2 * cost["params_single"]
    assert cost["params_overhead"] == cost["params_single"]
    assert cost["flops_per_image"] > 0 and cost["train_images_per_s"] > 0
    assert [h["epoch"] for h in rec["history"]] == [1, 2]
    for h in rec["history"]:  # each epoch's cost by phase; training is time_s
        phases = h["phases_s"]
        assert set(phases) == {"train", "validation", "diagnostics", "checkpoint"}
        assert phases["train"] == h["time_s"] > 0 and min(phases.values()) >= 0
    assert sum(h["time_s"] for h in rec["history"]) == pytest.approx(rec["timings"]["train_s"])
    timings = rec["timings"]
    assert timings["total_s"] >= timings["train_s"] + timings["eval_s"]
    # CPU seconds of the process over the cell: it trained, so some; at most every thread busy
    assert 0 < timings["cpu_s"] <= timings["total_s"] * max(torch.get_num_threads(), 1) + 0.5
    assert rec["environment"]["torch"] == torch.__version__
    # what a seeded CPU cell's last digits depend on (docs/records.md)
    assert rec["environment"]["threads"] == torch.get_num_threads()
    assert rec["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    # and where it ran: the processor's kernel flags and the libraries (None where unknown)
    assert {"cpu", "cpu_flags", "blas", "mkl", "onednn", "numpy_blas"} <= set(rec["environment"])
    assert (tmp_path / cell.cell_id / "final.pt").exists()
    assert not (tmp_path / cell.cell_id / "checkpoint.pt").exists()


def test_same_seed_same_result(tiny, tmp_path):
    cell = tiny.cells()[0]
    a = run_cell(cell, tmp_path / "a", progress=False)
    b = run_cell(cell, tmp_path / "b", progress=False)
    assert a["metrics"]["clean"] == b["metrics"]["clean"]


def test_finished_cells_are_skipped_and_force_redoes(tiny, tmp_path):
    cell = tiny.cells()[0]
    first = run_cell(cell, tmp_path, progress=False)
    again = run_cell(cell, tmp_path, progress=False)
    assert again["finished_at"] == first["finished_at"]
    assert pending(tiny.cells(), tmp_path) == tiny.cells()[1:]
    assert [e["event"] for e in read_events(tmp_path / cell.cell_id)].count("train") == 1
    forced = run_cell(cell, tmp_path, force=True, progress=False)
    # Redone from epoch 0 (its events say so; no clock needed), and a new record written.
    starts = [
        e["from_epoch"] for e in read_events(tmp_path / cell.cell_id) if e["event"] == "train"
    ]
    assert starts == [0, 0]
    assert forced["started_at"] >= first["finished_at"]
    assert read_record(tmp_path / cell.cell_id) == forced
    # the earlier run's products are set aside, never deleted
    kept = sorted(
        p.name.split(".replaced-")[0] for p in (tmp_path / cell.cell_id).glob("*.replaced-*")
    )
    assert kept == ["final.pt", "outcomes.npz", "record.json", "trained.json"]
    aside = next((tmp_path / cell.cell_id).glob("record.json.replaced-*"))
    assert json.loads(aside.read_text())["finished_at"] == first["finished_at"]


def test_a_forced_redo_interrupted_before_its_record_puts_the_earlier_run_back(
    tiny, tmp_path, monkeypatch
):
    """Ctrl-C during a --force redo (here: in its evaluation, after it wrote final.pt and a
    checkpoint) must not lose the finished cell: its record, outcomes and weights come back
    together, and the redo's own files are set aside as NAME.interrupted-<time>."""
    from harness.engine import runner

    cell = tiny.cells()[0]
    first = run_cell(cell, tmp_path, progress=False)
    folder = tmp_path / cell.cell_id
    before = {n: (folder / n).read_bytes() for n in ("record.json", "outcomes.npz", "final.pt")}

    def interrupted(*args, **kwargs):
        (folder / "final.pt").write_bytes(b"the redo's weights")
        (folder / "checkpoint.pt").write_bytes(b"the redo's checkpoint")
        raise KeyboardInterrupt("the redo stopped")

    monkeypatch.setattr(runner, "_train_and_record", interrupted)
    with pytest.raises(KeyboardInterrupt, match="the redo stopped"):
        run_cell(cell, tmp_path, force=True, progress=False)
    assert {n: (folder / n).read_bytes() for n in before} == before
    assert not (folder / "checkpoint.pt").exists() and not list(folder.glob("*.replaced-*"))
    redo = sorted(p.name.split(".interrupted-")[0] for p in folder.glob("*.interrupted-*"))
    assert redo == ["checkpoint.pt", "final.pt"]
    assert read_record(folder)["finished_at"] == first["finished_at"]
    monkeypatch.undo()
    assert run_cell(cell, tmp_path, progress=False)["finished_at"] == first["finished_at"]


def test_resume_from_checkpoint_continues_training(tiny, tmp_path, monkeypatch):
    from harness.engine import runner

    cell = tiny.cells()[0]
    reference = run_cell(cell, tmp_path / "uninterrupted", progress=False)
    real, calls = runner.train_epoch, {"n": 0}

    def interrupt_second_epoch(*args, **kwargs):
        if calls["n"] == 1:
            raise KeyboardInterrupt("simulated Ctrl-C")  # like Ctrl-C or a preemption
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", interrupt_second_epoch)
    with pytest.raises(KeyboardInterrupt, match="simulated Ctrl-C"):
        run_cell(cell, tmp_path / "killed", progress=False)
    monkeypatch.setattr(runner, "train_epoch", real)
    part = tmp_path / "killed" / cell.cell_id
    assert (part / "checkpoint.pt").exists() and not (part / "record.json").exists()
    resumed = run_cell(cell, tmp_path / "killed", progress=False)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    # Resuming from the epoch-1 checkpoint gives the same model as an uninterrupted run.
    assert resumed["metrics"]["clean"]["acc"] == reference["metrics"]["clean"]["acc"]
    assert resumed["metrics"]["clean"]["nll"] == pytest.approx(
        reference["metrics"]["clean"]["nll"], rel=1e-5
    )


def test_diverging_cell_is_recorded_failed_and_grid_goes_on(write_suite, tmp_path):
    text = textwrap.dedent(TINY).replace("lr: 0.05", "lr: 1.0e+6, max_loss: 50.0")
    suite = load_suite(write_suite(text))
    records = run_inprocess(suite.cells(), tmp_path, None, progress=False)
    assert len(records) == 2
    for rec in records:
        validate_record(rec)
        assert rec["status"] == "failed"
        assert rec["error"]["type"] == "DivergenceError"
        assert re.search(r"training loss became \S+ at step \d+", rec["error"]["message"])


def test_raising_cell_is_recorded_with_reason(tiny, tmp_path, monkeypatch):
    from methods import deep_ensemble

    def boom(self, x):
        raise RuntimeError("simulated CUDA error in member forward")

    monkeypatch.setattr(deep_ensemble.DeepEnsemble, "forward", boom)
    records = run_inprocess(tiny.cells(), tmp_path, None, progress=False)
    status = {r["config"]["method"]: r for r in records}
    assert status["single"]["status"] == "done"
    failed = status["deep_ensemble"]
    assert failed["status"] == "failed"
    assert failed["error"] == {
        **failed["error"],
        "type": "RuntimeError",
        "message": "simulated CUDA error in member forward",
    }
    assert "boom" in failed["error"]["traceback"]
    # A failed cell counts as pending and is retried on the next run.
    assert [c.method for c in pending(tiny.cells(), tmp_path)] == ["deep_ensemble"]


def test_atomic_write_keeps_old_record_on_crash(tmp_path, monkeypatch):
    from tests.record_factory import make_record

    rec = make_record()
    write_record(tmp_path, rec)
    before = (tmp_path / "record.json").read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_record(tmp_path, {**rec, "finished_at": "later"})
    assert (tmp_path / "record.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temp file left


def test_invalid_record_is_rejected_before_writing(tmp_path):
    from tests.record_factory import make_record

    rec = make_record()
    with pytest.raises(RecordError, match=r"record has unknown keys \['extra'\]"):
        write_record(tmp_path, {**rec, "extra": 1})
    with pytest.raises(RecordError, match="a failed record must carry an error"):
        write_record(tmp_path, {**rec, "status": "failed", "error": None})
    assert not (tmp_path / "record.json").exists()


@pytest.mark.slow
def test_killed_run_resumes_without_redoing_finished_cells(tmp_path):
    """SIGKILL `harness run` mid-grid, re-run: finished cells are kept, the rest completes.

    Where the kill lands is made, not timed: inside the 6th checkpoint write of the run (the
    second cell's second epoch, 4 epochs a cell; the write is torn in half first), by the
    test-only write fault ``HARNESS_FAULT_KILL_WRITE`` (tests/fixtures/write_faults.py)."""
    from tests.fixtures.machine_faults import fault_env

    text = (
        textwrap.dedent(TINY)
        .replace("seeds: [0]", "seeds: [0, 1, 2]")
        .replace("epochs: 2", "epochs: 4")
    )
    suite_file = tmp_path / "kill.yaml"
    suite_file.write_text(text.replace("name: tiny", "name: kill"))
    cells = [c.cell_id for c in load_suite(suite_file).cells()]
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite_file), "--results", str(results),
           "-q", "--executor", "inprocess"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_FAULT")}
    torn = fault_env(env, HARNESS_FAULT_KILL_WRITE="checkpoint.pt:6")
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=torn)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    folder = results / "kill"
    done_before = {p.parent.name: p.read_text() for p in folder.glob("*/record.json")}
    assert list(done_before) == [cells[0]]  # the first cell finished, the second was mid-way
    for text_before in done_before.values():
        validate_record(json.loads(text_before))  # every record on disk is whole
    assert read_events(folder / cells[1])[-1]["event"] == "train"  # killed while training
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert f"{len(cells)} cells, 1 already done, {len(cells) - 1} to run" in out.stdout
    after = {p.parent.name: p.read_text() for p in folder.glob("*/record.json")}
    assert sorted(after) == sorted(cells)
    for cell_id, text_before in done_before.items():
        assert after[cell_id] == text_before  # not redone
    starts = [e["from_epoch"] for e in read_events(folder / cells[1]) if e["event"] == "train"]
    assert starts == [0, 1]  # resumed after its whole epoch-1 checkpoint, not from scratch
    assert not list(folder.glob("**/.*.tmp"))  # the torn write's temporary file is gone


def test_manifest_lists_expected_cells(tiny, tmp_path):
    write_manifest(tiny, tmp_path)
    data = json.loads((tmp_path / "suite.json").read_text())
    assert data["current"] == [c.cell_id for c in tiny.cells()]
