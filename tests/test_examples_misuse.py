"""The examples/ scripts hold the rule every surface a user touches does (issue 58 item 7): a
mistaken argument is refused before any work starts, with one line on stderr naming the argument,
the value and what to do, exit status 2, no traceback, and every file byte-identical afterwards.

claims_sections.py runs as a user runs it (``python examples/claims_sections.py ...``, a
subprocess), as does one case of evaluate_your_model.py. Where a script's imports alone take
seconds (torch, Lightning) the other cases call its ``main(argv)``, which exits as the script does
(``SystemExit(2)``, the line on stderr). The committed study folders under docs/results are only
read; the tests that need one skip where a checkout lacks it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.misuse import TINY_SUITE, no_traceback, tree_hashes

EXAMPLES = REPO / "examples"
RESULTS = REPO / "docs" / "results"
FAMILIES = REPO / "suites" / "claims_fmnist" / "families.yaml"


def _hashes(paths: list[Path]) -> dict[str, object]:
    """A checksum of each path: every file under a folder, a file's bytes, or None if absent."""
    return {
        str(p): tree_hashes(p) if p.is_dir() else
        hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None
        for p in paths
    }  # fmt: skip


def refused(script: Path, argv: list[str], needles: list[str], watched: list[Path]) -> str:
    """Run ``python script argv`` from the repository; assert exit 2, one stderr line holding
    every needle, nothing on stdout (no table, no progress: no work began), no traceback and
    every watched path unchanged. The line, for further checks."""
    before = _hashes(watched)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    both = proc.stdout + proc.stderr
    assert proc.returncode == 2, both
    assert "Traceback" not in both, both
    assert proc.stdout == "", both
    (line,) = proc.stderr.strip().splitlines()
    for needle in needles:
        assert needle in line, (needle, line)
    assert _hashes(watched) == before
    return line


def _study(name: str) -> Path:
    """A committed results folder of the claims study, or a skip naming it."""
    folder = RESULTS / name
    if not folder.is_dir():
        pytest.skip(f"{folder.relative_to(REPO)} is not in this checkout")
    return folder


# --- claims_sections.py -----------------------------------------------------------------------

CLAIMS = EXAMPLES / "claims_sections.py"


def test_claims_a_results_path_that_is_a_file_is_refused_not_pending(tmp_path):
    """It printed every section as "pending" and exited 0 for a file of a section's name."""
    path = tmp_path / "claims_fmnist_study"
    path.write_text("not a folder\n")
    refused(CLAIMS, [str(path)], [f"results {path}: is a file", "give a results folder"],
            [tmp_path])  # fmt: skip


def test_claims_a_missing_results_folder_is_refused_with_the_nearest_name():
    typo = "docs/results/claims_fmnist_studdy"
    refused(CLAIMS, [typo, "--describe"],
            [f"results {typo}: does not exist", "did you mean docs/results/claims_fmnist_study?"],
            [REPO / typo])  # fmt: skip
    assert not (REPO / typo).exists()


def test_claims_a_folder_no_section_names_is_refused_naming_the_known_sections(tmp_path):
    folder = tmp_path / "claims_fmnist_studyy"
    folder.mkdir()
    refused(CLAIMS, [str(folder)],
            ["has no section for a folder named 'claims_fmnist_studyy'",
             "did you mean claims_fmnist_study?", "claims_fmnist_study (S2, S3, S4, S6, S8, S9)",
             "claims_fmnist_conversion (C9)"], [tmp_path])  # fmt: skip


def test_claims_a_variant_no_cell_has_is_refused_naming_the_variants():
    folder = _study("claims_fmnist_endpoints")
    refused(CLAIMS, [str(folder), "--describe", "--variant", "recipe.epochs=41"],
            ["--variant recipe.epochs=41: no done cell", "recipe.epochs=24, recipe.epochs=40"],
            [folder])  # fmt: skip


def test_claims_severities_of_a_folder_without_corruption_metrics_is_refused():
    folder = _study("claims_fmnist_study")
    refused(CLAIMS, [str(folder), "--severities"],
            [f"results {folder}: no done record with corruption metrics",
             "claims_fmnist_study_corruption"], [folder])  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--select", "--k-eff-max", "0.5"], ["argument --k-eff-max", "got '0.5'", ">= 1"]),
        (["--variant", "recipe.epochs=12"], ["--variant recipe.epochs=12: only with --describe"]),
        (["--describe", "--select"], ["argument --select: not allowed with argument --describe"]),
    ],
    ids=["k-eff-max below 1", "variant without describe", "two tables"],
)
def test_claims_options_that_cannot_apply_are_refused(tmp_path, argv, needles):
    folder = tmp_path / "claims_fmnist_study"
    folder.mkdir()
    refused(CLAIMS, [str(folder), *argv], needles, [tmp_path])


def test_claims_a_csv_in_a_missing_folder_is_refused_before_any_section(tmp_path):
    folder = tmp_path / "claims_fmnist_study"
    folder.mkdir()
    csv = tmp_path / "nowhere" / "marks.csv"
    refused(CLAIMS, [str(folder), "--csv", str(csv)],
            [f"--csv {csv}: its folder {csv.parent} does not exist"], [tmp_path])  # fmt: skip
    assert not csv.parent.exists()


def _copy_with_families(tmp_path: Path, text: str) -> Path:
    """The script in a checkout of its own (``tmp_path``) whose families file is ``text``: the
    file a user edits, read from beside the script."""
    (tmp_path / "examples").mkdir()
    shutil.copy(CLAIMS, tmp_path / "examples" / CLAIMS.name)
    families = tmp_path / "suites" / "claims_fmnist" / "families.yaml"
    families.parent.mkdir(parents=True)
    families.write_text(text, encoding="utf-8")
    return families


def test_claims_a_families_file_that_is_not_yaml_names_its_line(tmp_path):
    lines = FAMILIES.read_text(encoding="utf-8").splitlines(keepends=True)
    number = lines.index("  - id: S6\n")
    lines[number] = "  - id: S6: [\n"  # a mapping value inside a plain scalar
    families = _copy_with_families(tmp_path, "".join(lines))
    refused(tmp_path / "examples" / CLAIMS.name, ["docs/results/claims_fmnist_study"],
            [f"{families}: line {number + 1}: not valid YAML", "fix that line"],
            [tmp_path, RESULTS / "claims_fmnist_study"])  # fmt: skip


def test_claims_a_families_file_of_the_wrong_structure_names_the_entry(tmp_path):
    text = FAMILIES.read_text(encoding="utf-8")
    wrong = text.replace("comparisons: [[film, sep], [batch, sep], [packed, sep]]",
                         "comparisons: [[film, sepp], [batch, sep], [packed, sep]]")  # fmt: skip
    assert wrong != text
    families = _copy_with_families(tmp_path, wrong)
    refused(tmp_path / "examples" / CLAIMS.name, ["docs/results/claims_fmnist_study"],
            [f"{families}: section S6: configurations has no 'sepp'", "it has: sep, share"],
            [tmp_path, RESULTS / "claims_fmnist_study"])  # fmt: skip


# --- the scripts whose imports take seconds, through main(argv) -------------------------------


def _example(name: str, monkeypatch):
    """An examples/ script imported as a module (its sibling imports resolve as when run)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main_refuses(module, argv: list[str], needles: list[str], watched: list[Path], capsys) -> str:
    """``module.main(argv)`` exits 2 with one stderr line holding every needle, prints nothing
    else (nothing was loaded, evaluated or trained) and leaves every watched path unchanged."""
    before = _hashes(watched)
    with pytest.raises(SystemExit, match=r"^2$"):
        module.main(argv)
    out, err = no_traceback(capsys)
    assert out == "", out
    (line,) = err.strip().splitlines()
    for needle in needles:
        assert needle in line, (needle, line)
    assert _hashes(watched) == before
    return line


# --- evaluate_your_model.py -------------------------------------------------------------------

EVALUATE = EXAMPLES / "evaluate_your_model.py"


@pytest.fixture
def tiny(tmp_path) -> Path:
    """The tiny suite's file (never run: every case here is refused before a cell is read)."""
    suite = tmp_path / "tiny.yaml"
    suite.write_text(textwrap.dedent(TINY_SUITE))
    return suite


@pytest.fixture
def evaluate_example(monkeypatch):
    return _example("evaluate_your_model", monkeypatch)


def test_evaluate_a_missing_suite_is_refused(tmp_path):
    """As a user runs it (the other cases call its main)."""
    suite = tmp_path / "no_such_suite.yaml"
    refused(EVALUATE, ["--suite", str(suite), "--results", str(tmp_path / "r")],
            ["--suite", f"{suite}: suite file not found"], [tmp_path])  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_evaluate_results_that_is_a_file_is_refused(evaluate_example, tiny, tmp_path, capsys):
    results = tmp_path / "results.txt"
    results.write_text("a file, not a results root\n")
    main_refuses(evaluate_example, ["--suite", str(tiny), "--results", str(results), "--scratch"],
                 [f"--results {results}: {results} is a file, not a folder"], [tmp_path],
                 capsys)  # fmt: skip


def test_evaluate_without_finished_cells_is_refused_before_loading(
    evaluate_example, tiny, tmp_path, capsys
):
    (tmp_path / "r" / "tiny").mkdir(parents=True)
    main_refuses(evaluate_example, ["--suite", str(tiny), "--results", str(tmp_path / "r")],
                 [f"--results: {tmp_path / 'r' / 'tiny'} holds no finished single cell",
                  "pass --scratch"], [tmp_path], capsys)  # fmt: skip


def test_evaluate_a_suite_of_two_datasets_is_refused(evaluate_example, tmp_path, capsys):
    suite = tmp_path / "two.yaml"
    suite.write_text(TINY_SUITE.replace("datasets: [digits]", "datasets: [digits, digits_hard]"))
    argv = ["--suite", str(suite), "--results", str(tmp_path / "r"), "--scratch"]
    main_refuses(evaluate_example, argv,
                 [f"--suite {suite}: its cells use 2 datasets (digits, digits_hard)"],
                 [tmp_path], capsys)  # fmt: skip
    assert not (tmp_path / "r").exists()


# --- own_training_loop.py and lightning_module.py ---------------------------------------------
# The script as a user runs it: tests/methods/test_sigma_public.py (it trains); here its main.


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--members", "0"], "argument --members: must be >= 1, got 0"),
        (["--epochs", "two"], "argument --epochs: expected a whole number >= 1, got 'two'"),
        (["--tau", "0"], "argument --tau: must be > 0, got 0"),
        (["--tau", "nan"], "argument --tau: expected a finite number, got 'nan'"),
        (["--lam", "-0.01"], "argument --lam: must be >= 0, got -0.01"),
    ],
    ids=["members 0", "epochs not a number", "tau 0", "tau nan", "lam negative"],
)
def test_own_loop_each_number_out_of_range_is_refused(monkeypatch, capsys, tmp_path, argv, needle):
    module = _example("own_training_loop", monkeypatch)
    monkeypatch.chdir(tmp_path)  # where a run would write: it must stay empty
    line = main_refuses(module, argv, [needle], [tmp_path], capsys)
    assert tree_hashes(tmp_path) == {}
    assert line.startswith("own_training_loop.py: error:")


@pytest.mark.slow  # imports Lightning
def test_lightning_module_refuses_the_same_numbers(monkeypatch, capsys, tmp_path):
    pytest.importorskip("lightning")
    module = _example("lightning_module", monkeypatch)
    monkeypatch.chdir(tmp_path)  # where a Trainer would write (lightning_logs/): it must not
    for argv, needle in [
        (["--members", "0"], "argument --members: must be >= 1, got 0"),
        (["--lam", "inf"], "argument --lam: expected a finite number"),
    ]:
        line = main_refuses(module, argv, [needle], [tmp_path], capsys)
        assert line.startswith("lightning_module.py: error:")
    assert tree_hashes(tmp_path) == {}
