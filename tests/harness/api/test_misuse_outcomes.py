"""Misuse of the per-image outcomes (``outcomes.npz``) and of the comparison that reads them
(``harness.api.paired(images=True)``, ``harness report --images``), issue 58 item 3: a damaged,
truncated or wrong-shaped file is named as damaged (file and reason), distinct from an absent
one; an image count that disagrees with the record or with another cell of the comparison, and a
``level``, ``replicates`` or ``reference`` that cannot be used, stop the call before any work
with one line naming the file or the argument, and every file is byte-identical afterwards."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import harness.api as h
from harness.cli import main
from harness.contract.errors import DamagedFile
from harness.contract.outcomes import (
    OUTCOMES_FILE,
    DamagedOutcomes,
    check_outcomes,
    record_image_count,
)
from reports.records.outcomes import read_outcomes
from tests.misuse import copy_results, no_traceback, tree_hashes


@pytest.fixture(scope="module")
def finished(tiny_finished) -> Path:
    """The tiny grid (single and deep_ensemble M=2 on digits, one seed, calibrated), run once."""
    return tiny_finished[1]


@pytest.fixture
def results(finished, tmp_path) -> Path:
    return copy_results(finished, tmp_path / "results")


def cell_of(results: Path, method: str) -> Path:
    """The folder of the tiny grid's ``method`` cell."""
    for record in sorted(results.glob("*/record.json")):
        if json.loads(record.read_text())["config"]["method"] == method:
            return record.parent
    raise AssertionError(f"no {method} cell in {results}")


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def rewrite(cell: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Write the cell's outcomes again after ``change`` edited its arrays in place."""
    with np.load(cell / OUTCOMES_FILE) as data:
        arrays = {k: data[k] for k in data.files}
    change(arrays)
    (cell / OUTCOMES_FILE).write_bytes(npz(arrays))


def _truncate(cell: Path) -> None:
    path = cell / OUTCOMES_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _pop(key: str) -> Callable[[Path], None]:
    return lambda cell: rewrite(cell, lambda a: a.pop(key))


def _as(key: str, f: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    return lambda cell: rewrite(cell, lambda a: a.update({key: f(a[key])}))


#: A mistaken ``outcomes.npz`` → what the line says about it.
DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "truncated or corrupt .npz archive"),
    "not_a_zip": (lambda c: (c / OUTCOMES_FILE).write_text("hello"), "not a NumPy .npz archive"),
    "empty": (lambda c: (c / OUTCOMES_FILE).write_bytes(b""), "empty file (0 bytes)"),
    "missing_field": (_pop("nll"), "lacks the field(s) nll"),
    "wrong_dtype": (_as("nll", lambda v: v.astype(np.float64)),
                    "field 'nll' has the dtype '<f8', not float32"),
    "object_array": (_as("confidence", lambda v: v.astype(object)),
                     "field 'confidence' has the dtype '|O', not float32"),
    "two_d": (_as("brier", lambda v: v[:, None]),
              "field 'brier' has the shape (289, 1), not one value per image"),
    "unequal_lengths": (_as("correct", lambda v: v[:-1]), "fields of unequal length"),
    "ts_inconsistent": (_pop("ts/brier"), "lacks the field(s) ts/brier"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_a_damaged_file_is_named_by_the_reader_and_by_paired(results, name, capsys):
    damage, reason = DAMAGE[name]
    cell = cell_of(results, "single")
    damage(cell)
    before = tree_hashes(results)
    with pytest.raises(DamagedOutcomes, match=re.escape(reason)):
        read_outcomes(cell)
    with pytest.raises(h.HarnessError, match=r"outcomes\.npz: ") as caught:
        h.paired(results, "single", images=True, replicates=10)
    (line,) = caught.value.problems  # one line: the file, what is wrong, how to write it again
    assert line.startswith(f"{cell / OUTCOMES_FILE}: {reason}")
    assert f"harness evaluate {results} --add-only" in line
    no_traceback(capsys)
    assert tree_hashes(results) == before


def test_damaged_is_not_absent(results, capsys):
    cell = cell_of(results, "single")
    (cell / OUTCOMES_FILE).unlink()
    assert read_outcomes(cell) is None and check_outcomes(cell) is None
    (cell / OUTCOMES_FILE).mkdir()  # there, but no file
    before = tree_hashes(results)
    with pytest.raises(DamagedOutcomes, match="not a file") as caught:
        check_outcomes(cell)
    assert isinstance(caught.value, DamagedFile) and caught.value.path == cell / OUTCOMES_FILE
    no_traceback(capsys)
    assert tree_hashes(results) == before


def test_count_other_than_the_records_is_named_with_both(results, capsys):
    cell = cell_of(results, "deep_ensemble")
    record = json.loads((cell / "record.json").read_text())
    assert record_image_count(record) == 289
    assert record_image_count({"metrics": {"clean": {}}}) is None  # an older record: unknown
    rewrite(cell, lambda a: a.update({k: v[:288] for k, v in a.items()}))
    before = tree_hashes(results)
    assert len(read_outcomes(cell)["nll"]) == 288  # sound on its own
    with pytest.raises(DamagedOutcomes, match=r"holds 288 images, but .* scored on 289"):
        read_outcomes(cell, record_image_count(record))
    with pytest.raises(h.HarnessError, match=r"holds 288 images, but .* scored on 289") as caught:
        h.paired(results, "single", images=True, replicates=10)
    assert caught.value.problems[0].startswith(str(cell / OUTCOMES_FILE))
    no_traceback(capsys)
    assert tree_hashes(results) == before


def _other_test_set(results: Path) -> tuple[Path, Path]:
    """The single cell as if scored on 288 images (its record agreeing): (it, the other)."""
    cell = cell_of(results, "single")
    rewrite(cell, lambda a: a.update({k: v[:288] for k, v in a.items()}))
    path = cell / "record.json"
    record = json.loads(path.read_text())
    counts = record["metrics"]["clean"]["reliability"]["count"]
    counts[next(i for i, c in enumerate(counts) if c)] -= 1
    with np.load(cell / "outcomes.npz") as kept:  # the record's means follow its 288 images
        clean = record["metrics"]["clean"]
        clean.update(acc=float(kept["correct"].mean()), nll=float(kept["nll"].mean()),
                     brier=float(kept["brier"].mean()))  # fmt: skip
        ts = record["metrics"].get("calibration", {}).get("ts", {}).get("clean")
        if ts is not None and "ts/nll" in kept:
            ts.update(nll=float(kept["ts/nll"].mean()), brier=float(kept["ts/brier"].mean()))
    path.write_text(json.dumps(record))
    return cell, cell_of(results, "deep_ensemble")


def test_count_other_than_another_cells_stops_paired(results, capsys):
    cell, other = _other_test_set(results)
    before = tree_hashes(results)
    with pytest.raises(h.HarnessError, match=r"holds 28[89] images, but .* holds 28[89]") as c:
        h.paired(results, "single", images=True, replicates=10)
    (line,) = c.value.problems
    for needle in (str(cell), str(other), "288", "289", "one test set"):
        assert needle in line, (needle, line)
    no_traceback(capsys)
    assert tree_hashes(results) == before


def test_count_other_than_another_cells_stops_report_images(results, capsys):
    cell, other = _other_test_set(results)
    before = tree_hashes(results)
    assert main(["report", str(results), "--images", "--no-figures"]) == 2
    _, err = no_traceback(capsys)
    (line,) = err.strip().splitlines()
    for needle in (str(cell), str(other), "288", "289", "one test set"):
        assert needle in line, (needle, line)
    assert tree_hashes(results) == before  # no leaderboard.html, no index written


@pytest.mark.parametrize("name", ["truncated", "wrong_dtype"])
def test_report_images_names_a_damaged_file_and_writes_nothing(results, name, capsys):
    cell = cell_of(results, "deep_ensemble")
    DAMAGE[name][0](cell)
    before = tree_hashes(results)
    assert main(["report", str(results), "--images", "--no-figures"]) == 2
    _, err = no_traceback(capsys)
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {cell / OUTCOMES_FILE}: ")
    assert DAMAGE[name][1] in line
    assert tree_hashes(results) == before


def test_report_images_refuses_an_unknown_reference(results, capsys):
    before = tree_hashes(results)
    assert main(["report", str(results), "--images", "--reference", "bogus", "--no-figures"]) == 2
    _, err = no_traceback(capsys)
    (line,) = err.strip().splitlines()
    assert "--reference bogus" in line and "methods: deep_ensemble, single" in line
    assert tree_hashes(results) == before


ARGUMENTS = {
    "level_95": ({"level": 95}, r"level=95: .* \(did you mean level=0\.95\?\)"),
    "level_0": ({"level": 0}, r"level=0: .*strictly between 0 and 1"),
    "level_1": ({"level": 1.0}, r"level=1\.0: .*strictly between 0 and 1"),
    "level_text": ({"level": "95%"}, r"level='95%': "),
    "replicates_0": ({"replicates": 0}, r"replicates=0: .*whole number, at least 2"),
    "replicates_negative": ({"replicates": -5}, r"replicates=-5: .*whole number"),
    "replicates_float": ({"replicates": 2.5}, r"replicates=2\.5: .*whole number"),
    "replicates_bool": ({"replicates": True}, r"replicates=True: .*whole number"),
    "test": ({"test": "wilcoxon"}, r"test='wilcoxon': unknown test"),
    "reference": ({"reference": "bogus"}, r"reference bogus: no done cells .*\(methods: "
                  r"deep_ensemble, single"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_paired_refuses_an_argument_before_any_work(results, name, capsys):
    kwargs, pattern = ARGUMENTS[name]
    before = tree_hashes(results)
    with pytest.raises(h.HarnessError, match=pattern) as caught:
        h.paired(results, **{"reference": "single", "images": True, **kwargs})
    assert len(caught.value.problems) == 1
    no_traceback(capsys)
    assert tree_hashes(results) == before


def test_paired_names_every_bad_argument_at_once(results, capsys):
    with pytest.raises(h.HarnessError, match=r"level=95") as caught:
        h.paired(results, "single", level=95, replicates=0, images=True)
    assert [p.split(":")[0] for p in caught.value.problems] == ["level=95", "replicates=0"]
    no_traceback(capsys)


def test_arguments_are_checked_before_the_folder_is_read(tmp_path, capsys):
    # No folder at all: the argument is still the first thing named (no work was needed).
    with pytest.raises(h.HarnessError, match=r"replicates=0"):
        h.paired(tmp_path / "nowhere", "single", replicates=0)
    no_traceback(capsys)
    assert tree_hashes(tmp_path) == {}
