"""Damaged results folders: a record, checkpoint or weights file that is truncated, foreign, from
a newer schema or otherwise unusable is named in one line (file and reason) by ``run``,
``status`` and ``evaluate``, which go on with the rest; ``run`` sets the damaged file aside
(never deletes it) and redoes the cell, so a grid always converges. Finished records are
hash-checked to be byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.contract import DamagedRecord, iter_records, read_record
from harness.storage.checkpoint import read_events

SUITE = """
name: tiny
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0]
  methods:
    - single
    - {name: deep_ensemble, M: [2]}
recipe: {epochs: 1, batch_size: 128, lr: 0.05}
evaluation: {cost: false}
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(suite file, results folder) of the 2-cell grid, run once for the module."""
    tmp = tmp_path_factory.mktemp("finished")
    suite = tmp / "tiny.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    argv = ["run", str(suite), "--executor", "inprocess", "--results", str(tmp / "r"), "-q"]
    assert main(argv) == 0
    return suite, tmp / "r" / "tiny"


@pytest.fixture
def results(finished, tmp_path) -> tuple[Path, Path, list[Path]]:
    """A copy of the finished folder: (suite, results, [cell folders in cell-id order])."""
    suite, folder = finished
    copy = tmp_path / "r" / "tiny"
    shutil.copytree(folder, copy)
    cells = sorted(p for p in copy.iterdir() if p.is_dir() and not p.name.startswith("_"))
    assert len(cells) == 2
    return suite, copy, cells


def hashes(folder: Path) -> dict[str, str]:
    return {
        p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.glob("*/record.json")
        if p.is_file()
    }


def no_traceback(capsys) -> tuple[str, str]:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return out, err


def _truncate(p: Path) -> str:
    p.write_bytes(p.read_bytes()[:300])
    return "truncated ("


def _set(p: Path, change) -> None:
    rec = json.loads(p.read_text())
    change(rec)
    p.write_text(json.dumps(rec))


DAMAGE = {
    "truncated": _truncate,
    "foreign": lambda p: p.write_text('{"hello": "world"}') and "not a harness record",
    "a list": lambda p: p.write_text("[1, 2]") and "not a harness record (a JSON list)",
    "binary": lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00") and "not UTF-8 text",
    "newer schema": lambda p: (
        _set(p, lambda r: r.update(schema_version=99))
        or "written by a newer harness (schema 99; this one reads 1, 2)"
    ),
    "string metric": lambda p: (
        _set(p, lambda r: r["metrics"]["clean"].update(acc="0.93"))
        or "metrics.clean.acc holds str '0.93', not a number"
    ),
    "unknown status": lambda p: (
        _set(p, lambda r: r.update(status="finished"))
        or "status 'finished' not in ('done', 'failed')"
    ),
    "a folder": lambda p: (p.unlink(), p.mkdir()) and "unreadable (Is a directory)",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_status_and_dry_run_name_a_damaged_record_and_go_on(results, capsys, kind):
    suite, folder, (bad, good) = results
    reason = DAMAGE[kind](bad / "record.json")
    before = hashes(folder)
    with pytest.raises(DamagedRecord, match="damaged record: " + re.escape(reason)):
        read_record(bad)
    assert [r["cell_id"] for r in iter_records(folder)] == [good.name]  # the rest still reads

    assert main(["status", str(folder)]) == 0
    out, _ = no_traceback(capsys)
    assert f"damaged  {bad.name}" in out and f"done     {good.name}" in out
    assert f"{bad / 'record.json'}: damaged record: {reason}" in out
    assert "1 damaged, 1 done" in out  # a string metric is damaged, not "diverged" or done

    assert main(["run", str(suite), "--results", str(folder.parent), "--dry-run"]) == 0
    out, _ = no_traceback(capsys)
    assert f"run   {bad.name}" in out and "(damaged record.json, set aside and redone:" in out
    assert f"skip  {good.name}" in out
    assert hashes(folder) == before  # reading changed nothing

    out_dir = folder.parent / "page"  # the report names it, reports the rest, and exits 1
    assert main(["report", str(folder), "--no-figures", "-o", str(out_dir)]) == 1
    out, err = no_traceback(capsys)
    warning, error = err.splitlines()
    assert warning.startswith(f"warning: {bad / 'record.json'}: damaged record: {reason}")
    assert warning.endswith("; left out of the report")
    assert error == (
        f"error: 1 record(s) could not be read and are left out of the report: {bad.name}"
    )
    assert (out_dir / "leaderboard.html").exists() and f"wrote {out_dir}" in out
    assert hashes(folder) == before


@pytest.mark.parametrize("kind", ["truncated", "newer schema", "string metric"])
def test_run_sets_a_damaged_record_aside_and_redoes_only_that_cell(results, capsys, caplog, kind):
    suite, folder, (bad, good) = results
    DAMAGE[kind](bad / "record.json")
    damaged_bytes = (bad / "record.json").read_bytes()
    good_hash = hashes(folder)[good.name]
    argv = ["run", str(suite), "--results", str(folder.parent), "-q", "--executor", "inprocess"]
    assert main(argv) == 0
    out, err = no_traceback(capsys)
    assert f"warning: {bad / 'record.json'}: damaged record:" in err
    assert "1 already done, 1 to run" in out
    assert "moved to record.json.damaged-" in caplog.text and "the cell is redone" in caplog.text
    (aside,) = bad.glob("record.json.damaged-*")  # kept, byte for byte, never deleted
    assert aside.read_bytes() == damaged_bytes
    assert read_record(bad)["status"] == "done"
    assert hashes(folder)[good.name] == good_hash  # the finished cell was not touched
    # Its trained weights were whole: only the evaluation was redone, nothing trained again.
    events = [e["event"] for e in read_events(bad)]
    assert events[-3:] == ["record_damaged", "evaluate_only", "done"]
    assert main(argv) == 0  # and the grid has converged: nothing left to do
    assert "2 already done, 0 to run" in capsys.readouterr().out


def test_a_damaged_checkpoint_is_set_aside_and_the_cell_restarts(results, capsys, caplog):
    """A truncated ``checkpoint.pt`` (the cell's last-epoch state) of an unfinished cell: named,
    moved aside, training restarts from epoch 0 (no other checkpoint), the cell finishes."""
    suite, folder, (bad, good) = results
    (bad / "record.json").unlink()  # unfinished: killed during training
    for name in ("final.pt", "trained.json"):
        (bad / name).unlink()
    torn = (good / "final.pt").read_bytes()[:1000]
    (bad / "checkpoint.pt").write_bytes(torn)
    before = hashes(folder)
    argv = ["run", str(suite), "--results", str(folder.parent), "-q", "--executor", "inprocess"]
    assert main(argv) == 0
    no_traceback(capsys)
    log = caplog.text  # the engine's warnings (stderr through logging outside pytest)
    assert f"{bad / 'checkpoint.pt'}: damaged checkpoint (is a truncated or damaged zip" in log
    assert "no other checkpoint, training restarts from epoch 0" in log
    (aside,) = bad.glob("checkpoint.pt.damaged-*")
    assert aside.read_bytes() == torn
    assert read_record(bad)["status"] == "done"
    assert hashes(folder)[good.name] == before[good.name]
    damaged = [e for e in read_events(bad) if e["event"] == "checkpoint_damaged"]
    assert damaged[0]["moved_to"] == aside.name and "truncated" in damaged[0]["reason"]
    assert [e["from_epoch"] for e in read_events(bad) if e["event"] == "train"][-1] == 0


def test_a_foreign_checkpoint_and_damaged_final_weights_are_set_aside(results, capsys, caplog):
    """A whole ``torch.save`` file that is no checkpoint, and a truncated ``final.pt`` after
    training (``trained.json`` present): both named and kept aside; the cell trains again."""
    import torch

    suite, folder, (bad, _good) = results
    (bad / "record.json").unlink()
    (bad / "final.pt").write_bytes(b"")
    torch.save({"weights": torch.zeros(3)}, bad / "checkpoint.pt")
    argv = ["run", str(suite), "--results", str(folder.parent), "-q", "--executor", "inprocess"]
    assert main(argv) == 0
    no_traceback(capsys)
    assert f"{bad}: damaged trained weights ({bad / 'final.pt'}: is empty (0 bytes))" in caplog.text
    assert "is not a training checkpoint (lacks model, optimizer, scheduler" in caplog.text
    assert len(list(bad.glob("final.pt.damaged-*"))) == 1
    assert len(list(bad.glob("trained.json.damaged-*"))) == 1
    assert len(list(bad.glob("checkpoint.pt.damaged-*"))) == 1
    assert read_record(bad)["status"] == "done"


def not_evaluated_line(err: str) -> str:
    """The one line ``harness evaluate`` ends with when a cell could not be evaluated."""
    (line,) = [x for x in err.splitlines() if "could not be evaluated" in x]
    return line


def test_evaluate_names_damaged_cells_and_re_evaluates_the_rest(results, capsys):
    _suite, folder, (bad, good) = results
    _truncate(bad / "record.json")
    metrics = read_record(good)["metrics"]
    assert main(["evaluate", str(folder)]) == 1  # one cell asked for was not evaluated
    out, err = no_traceback(capsys)
    assert f"warning: {bad / 'record.json'}: damaged record: truncated" in err
    assert "re-evaluated 1 cells" in out
    assert not_evaluated_line(err) == (
        "error: 1 of 2 cells asked for could not be evaluated (their records are unchanged): "
        f"{bad.name}"
    )
    assert read_record(good)["metrics"] == metrics  # same weights, same numbers

    assert main(["evaluate", str(folder), "--suite", str(folder / "nope.yaml")]) == 2
    assert (
        no_traceback(capsys)[1].strip() == f"--suite {folder / 'nope.yaml'}: suite file not found"
    )

    (good / "final.pt").write_bytes(b"PK\x03\x04 torn")
    before = hashes(folder)
    assert main(["evaluate", str(folder)]) == 1
    out, err = no_traceback(capsys)
    assert f"{good / 'final.pt'}: is a truncated or damaged zip archive" in err
    assert "re-evaluated 0 cells" in out
    assert not_evaluated_line(err).endswith(f"2 of 2 cells asked for could not be evaluated "
                                            f"(their records are unchanged): {bad.name} "
                                            f"{good.name}")  # fmt: skip
    assert hashes(folder) == before  # a cell that could not be re-evaluated keeps its record


def test_evaluate_add_only_without_weights_exits_1_naming_the_cells(results, capsys):
    """Issue 48: every final.pt deleted, ``evaluate --add-only`` added nothing and said
    "completed 0 cells" with exit 0. Now: exit 1 and one line naming each cell; no record
    changes by a byte. A folder where every cell was evaluated, or none was asked for (no done
    record), still exits 0."""
    _suite, folder, cells = results
    for cell in cells:
        (cell / "final.pt").unlink()
    before = {c.name: (c / "record.json").read_bytes() for c in cells}
    assert main(["evaluate", str(folder), "--add-only"]) == 1
    out, err = no_traceback(capsys)
    assert out.strip().splitlines()[-1] == f"completed 0 cells in {folder}"
    assert [x for x in err.splitlines() if x.endswith("no final.pt, skipped")] == [
        f"{c.name}: no final.pt, skipped" for c in cells
    ]
    assert not_evaluated_line(err) == (
        "error: 2 of 2 cells asked for could not be evaluated (their records are unchanged): "
        + " ".join(c.name for c in cells)
    )
    assert {c.name: (c / "record.json").read_bytes() for c in cells} == before

    # None asked for: every record failed (run redoes those, evaluate does not ask for them).
    for cell in cells:
        rec = json.loads((cell / "record.json").read_text())
        error = {"type": "RuntimeError", "message": "boom", "phase": "train"}
        (cell / "record.json").write_text(json.dumps({**rec, "status": "failed", "error": error}))
    assert main(["evaluate", str(folder), "--add-only"]) == 0
    out, err = no_traceback(capsys)
    assert "completed 0 cells" in out and "could not be evaluated" not in err


def test_a_symlink_in_results_is_not_a_cell(results, capsys, tmp_path):
    _suite, folder, (first, second) = results
    (folder / "alias").symlink_to(second, target_is_directory=True)
    assert [r["cell_id"] for r in iter_records(folder)] == [first.name, second.name]
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(first / "record.json", elsewhere)
    (first / "record.json").symlink_to(elsewhere)
    with pytest.raises(DamagedRecord, match="is a symbolic link, not a record the harness wrote"):
        read_record(first)
    assert main(["evaluate", str(folder)]) == 1  # the linked record is not evaluated
    out, err = no_traceback(capsys)
    assert "re-evaluated 1 cells" in out and "symbolic link" in err
    assert not_evaluated_line(err).endswith(f": {first.name}")


def test_a_damaged_manifest_and_an_unwritable_results_folder(
    results, capsys, tmp_path, monkeypatch
):
    suite, folder, _ = results
    manifest = folder / "suite.json"
    manifest.write_text("{")
    assert main(["status", str(folder)]) == 2
    _, err = no_traceback(capsys)
    assert err.strip() == f"error: {manifest}: unreadable suite manifest (Expecting property " \
        "name enclosed in double quotes: line 1 column 2 (char 1))"  # fmt: skip
    argv = ["run", str(suite), "--results", str(folder.parent), "-q", "--executor", "inprocess"]
    before = hashes(folder)
    assert main(argv) == 0
    _, err = no_traceback(capsys)
    assert (
        f"warning: {manifest}: unreadable suite manifest" in err and "moved to suite.json." in err
    )
    assert len(list(folder.glob("suite.json.damaged-*"))) == 1
    assert hashes(folder) == before and json.loads(manifest.read_text())["current"]

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["run", str(suite), "--results", str(blocker), "-q"]) == 2
    _, err = no_traceback(capsys)
    assert err.strip() == (  # the preflight's line, before anything is written
        f"{blocker / 'tiny'}: the results folder cannot be created: {blocker} is not a directory"
    )

    def refuse(self, *args, **kwargs):  # what a read-only folder does (root ignores modes)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(["run", str(suite), "--results", str(tmp_path / "ro"), "-q"]) == 2
    _, err = no_traceback(capsys)
    assert err.strip() == f"{tmp_path / 'ro' / 'tiny'}: cannot write the results folder: " \
        "Permission denied"  # fmt: skip


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_results_folder_is_one_line(results, capsys):
    suite, folder, _ = results
    before = hashes(folder)
    folder.chmod(0o555)
    try:
        argv = ["run", str(suite), "--results", str(folder.parent), "-q", "--force"]
        assert main(argv) == 2
        _, err = no_traceback(capsys)
        assert err.strip() == f"{folder}: cannot write the results folder: Permission denied"
    finally:
        folder.chmod(0o755)
    assert hashes(folder) == before
