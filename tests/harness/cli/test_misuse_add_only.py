"""Mistakes made with ``harness evaluate`` (``--add-only`` and a full re-evaluation): a suite that
does not describe the records is refused before the first cell with one line (exit 2) and every
file byte-identical; a setting add-only did not recompute is never changed in a record; a
damaged ``outcomes.npz`` is named as damaged and written again."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from tests.misuse import TINY_SUITE, copy_results, no_traceback, tree_hashes


@pytest.fixture(scope="module")
def finished(tiny_finished) -> tuple[Path, Path]:
    return tiny_finished


@pytest.fixture
def results(finished, tmp_path) -> Path:
    return copy_results(finished[1], tmp_path / "r" / "tiny")


def variant(tmp_path: Path, old: str, new: str, name: str = "variant.yaml") -> Path:
    """The tiny suite with one piece of its text replaced, written to ``tmp_path/name``."""
    text = textwrap.dedent(TINY_SUITE)
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def records(folder: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/record.json")}


def refused(argv: list[str], folder: Path, capsys, *needles: str) -> str:
    before = tree_hashes(folder)
    assert main(argv) == 2
    _, err = no_traceback(capsys)
    line = err.strip().splitlines()[-1]
    for needle in needles:
        assert needle in line, line
    assert tree_hashes(folder) == before
    return line


@pytest.mark.parametrize("add_only", [True, False])
@pytest.mark.parametrize(
    ("old", "new", "needles"),
    [
        ("datasets: [digits]", "datasets: [digits_hard]", ('dataset "digits"', "digits_hard")),
        ("name: tiny", "name: other", ("a cell of suite 'tiny', not of 'other'",)),
        ("epochs: 1,", "epochs: 2,", ("another recipe", "epochs")),
        ("width: 4", "width: 8", ("backbone_kwargs",)),
        ("seeds: [0]", "seeds: [1]", ("seed 0 is not one of",)),
    ],
)
def test_a_suite_that_does_not_describe_the_records_is_refused(
    results, tmp_path, capsys, add_only, old, new, needles
):
    """Regression: at 7a576e5 `--add-only --suite <another suite>` exited 0, added that suite's
    OOD set to every record and rewrote cell.json."""
    other = variant(tmp_path, old, new)
    argv = ["evaluate", str(results), "--suite", str(other), *(["--add-only"] * add_only)]
    refused(argv, results, capsys, "does not describe these records", "nothing was evaluated",
            *needles)  # fmt: skip


def test_the_suite_the_folder_was_run_from_is_checked_too(results, finished, capsys):
    suite = finished[0]
    original = suite.read_text()
    try:
        suite.write_text(original.replace("seeds: [0]", "seeds: [3]"))
        refused(["evaluate", str(results), "--add-only"], results, capsys,
                "the suite it was run from", "seed 0")  # fmt: skip
    finally:
        suite.write_text(original)


def test_a_new_alpha_does_not_relabel_the_sets_a_record_holds(results, tmp_path, capsys):
    """Regression: at 7a576e5 the evaluation block named the new α's beside sets fitted at the
    old one; and `calibrate: false` was written into records that keep their calibration."""
    before = records(results)
    other = variant(tmp_path, "calibrate: true,", "calibrate: true, conformal_alpha: [0.2, 0.3],")
    assert main(["evaluate", str(results), "--suite", str(other), "--add-only"]) == 0
    _, err = no_traceback(capsys)
    assert "the calibration group was fitted with other settings" in err
    assert "conformal_alpha 0.1 → [0.2, 0.3]" in err
    for cell_id, rec in records(results).items():
        assert rec["evaluation"]["conformal_alpha"] == 0.1 == rec["metrics"]["calibration"]["alpha"]
        assert rec["metrics"]["calibration"] == before[cell_id]["metrics"]["calibration"]
    off = variant(tmp_path, "calibrate: true,", "calibrate: false,", "off.yaml")
    assert main(["evaluate", str(results), "--suite", str(off), "--add-only"]) == 0
    for cell_id, rec in records(results).items():
        assert rec["evaluation"]["calibrate"] is True
        assert rec["metrics"]["calibration"] == before[cell_id]["metrics"]["calibration"]
        assert rec["metrics"]["clean"] == before[cell_id]["metrics"]["clean"]


def test_a_full_re_evaluation_recomputes_at_the_new_alpha(results, tmp_path, capsys):
    other = variant(tmp_path, "calibrate: true,", "calibrate: true, conformal_alpha: [0.2, 0.3],")
    assert main(["evaluate", str(results), "--suite", str(other)]) == 0
    for rec in records(results).values():
        assert rec["evaluation"]["conformal_alpha"] == [0.2, 0.3]
        assert rec["metrics"]["calibration"]["alpha"] == [0.2, 0.3]
    cell = json.loads(next(results.glob("*/cell.json")).read_text())
    assert cell["evaluation"]["conformal_alpha"] == [0.2, 0.3]  # the cell's evaluation now


#: Well-formed files whose values are untrue (hostile review, 2026-12-06): each is damaged.
UNTRUE = {
    "nan": lambda a: a["nll"].__setitem__(3, np.nan),
    "all_correct": lambda a: a["correct"].__setitem__(slice(None), True),
    "negative_nll": lambda a: a["nll"].__setitem__(0, -5.0),
    "confidence_7": lambda a: a["confidence"].__setitem__(0, 7.0),
}


@pytest.mark.parametrize("damage", ["truncate", "length", *UNTRUE])
def test_add_only_names_a_damaged_outcomes_file_and_writes_it_again(
    results, capsys, caplog, damage
):
    cell = sorted(p.parent for p in results.glob("*/outcomes.npz"))[0]
    path = cell / "outcomes.npz"
    good = {k: v.copy() for k, v in np.load(path).items()}
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "length":  # a well-formed file of 50 images where the record has more
        np.savez_compressed(path, **{k: v[:50] for k, v in good.items()})
    else:  # the right form, untrue values
        edited = {k: v.copy() for k, v in good.items()}
        UNTRUE[damage](edited)
        np.savez_compressed(path, **edited)
    bad = path.read_bytes()
    record_before = (cell / "record.json").read_text()
    assert main(["evaluate", str(results), "--add-only"]) == 0
    assert str(path) in caplog.text  # named: the file and what is wrong with it
    assert ("holds 50 images" in caplog.text) == (damage == "length")
    aside = list(cell.glob("outcomes.npz.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bad  # kept, never deleted
    with np.load(path) as now:
        for key, value in good.items():
            np.testing.assert_array_equal(now[key], value)
    rec = json.loads((cell / "record.json").read_text())
    assert rec["metrics"] == json.loads(record_before)["metrics"]


def test_a_results_path_that_is_a_file_or_missing(tmp_path, capsys):
    file = tmp_path / "results.txt"
    file.write_text("x\n")
    assert main(["evaluate", str(file), "--add-only"]) == 2
    _, err = no_traceback(capsys)
    assert "results.txt" in err
    assert main(["evaluate", str(tmp_path / "nope")]) == 2
    _, err = no_traceback(capsys)
    assert "nope" in err


@pytest.mark.parametrize("damage", list(UNTRUE))
def test_paired_on_images_refuses_outcomes_that_contradict_their_record(results, damage):
    import harness.api as h

    cell = sorted(p.parent for p in results.glob("*/outcomes.npz"))[0]
    path = cell / "outcomes.npz"
    edited = dict(np.load(path).items())
    UNTRUE[damage](edited)
    np.savez_compressed(path, **edited)
    before = tree_hashes(results)
    with pytest.raises(h.HarnessError, match=r"outcomes\.npz: field '(nll|correct|confidence)'"):
        h.paired(results, "single", ["acc", "nll"], images=True)
    assert tree_hashes(results) == before
