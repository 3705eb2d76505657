"""h.run / h.validate arguments the command line's parser would refuse, the readers on a folder
with no records or on a file, and the command line's --list and --debug placement. Each
mistake is one line before anything is read or trained."""

from __future__ import annotations

import pytest

import harness.api as h
from harness.cli import main

SUITE = "suites/smoke.yaml"


@pytest.fixture(autouse=True)
def _nothing_runs(monkeypatch):
    """A mistake must be found before the run layer is reached."""

    def reached(*args, **kwargs):
        raise AssertionError("the run layer was reached")

    monkeypatch.setattr("harness.session.run.run_suite", reached)
    monkeypatch.setattr("harness.session.validate_suite", reached)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"suite": None}, "suite: None: pass a path (str or pathlib.Path)"),
        ({"overrides": "recipe.epochs=2"},
         "overrides: 'recipe.epochs=2': pass a list of strings, e.g. "
         "overrides=['recipe.epochs=2']"),
        ({"only": "method=single"},
         "only: 'method=single': pass a list of strings, e.g. only=['method=single']"),
        ({"overrides": ["recipe.epochs=2", 3]}, "overrides: 3 is not a string"),
        ({"workers": "2"}, "workers: '2': pass a whole number >= 1, or None for the default"),
        ({"workers": 0}, "workers: 0: pass a whole number >= 1, or None for the default"),
        ({"threads": -3}, "threads: -3: pass a whole number >= 1, or None for the default"),
        ({"threads": True}, "threads: True: pass a whole number >= 1, or None for the default"),
        ({"cells_per_gpu": 1.5}, "cells_per_gpu: 1.5: pass a whole number >= 1, or None"),
        ({"gpus": "0,2"}, "gpus: '0,2': pass a list of strings, e.g. gpus=['0,2']"),
        ({"results": 7}, "results: 7: pass a path (str or pathlib.Path)"),
        ({"loggers": "mlflow"}, "loggers: 'mlflow': pass a list of strings"),
    ],
)  # fmt: skip
def test_run_refuses_what_the_command_line_parser_refuses(kwargs, problem):
    args = {"suite": SUITE, **kwargs}
    with pytest.raises(h.HarnessError) as info:
        h.run(**args)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem)


def test_run_reports_every_argument_problem_at_once():
    with pytest.raises(h.HarnessError) as info:
        h.run(SUITE, "recipe.epochs=2", workers=0, threads="1")
    assert [p.split(":")[0] for p in info.value.problems] == ["overrides", "workers", "threads"]


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ((None,), {}, "suite: None: pass a path"),
        ((SUITE, "recipe.epochs=2"), {}, "overrides: 'recipe.epochs=2': pass a list of strings"),
        ((SUITE,), {"data_root": 3}, "data_root: 3: pass a path"),
    ],
)
def test_validate_refuses_them_too(args, kwargs, problem):
    with pytest.raises(h.HarnessError, match="^" + problem.replace("(", r"\(").replace(")", r"\)")):
        h.validate(*args, **kwargs)


def test_gpu_numbers_are_taken_as_their_names(monkeypatch):
    seen = {}

    def run_suite(suite, options, on_start=None):
        seen["gpus"] = options.executor_options.gpus
        raise h.HarnessError(["stop here"])

    monkeypatch.setattr("harness.session.run.run_suite", run_suite)
    with pytest.raises(h.HarnessError, match="stop here"):
        h.run(SUITE, gpus=[0, 2])
    assert seen["gpus"] == ("0", "2")


def test_the_readers_say_what_the_folder_is(tmp_path):
    with pytest.raises(h.HarnessError, match=r"no records yet \(harness run writes one per cell\)"):
        h.leaderboard(tmp_path)
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(FileNotFoundError, match=r"a_file is a file, not a results folder"):
        h.load_results(tmp_path / "a_file")
    with pytest.raises(FileNotFoundError, match=r"absent does not exist"):
        h.load_records(tmp_path / "absent")


def test_list_without_dry_run_is_refused_before_anything_runs(capsys):
    assert main(["run", SUITE, "--list"]) == 2
    assert capsys.readouterr().err == (
        "error: --list lists a dry run's plan: add --dry-run (nothing is trained)\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "validate", "x.yaml"],
        ["validate", "x.yaml", "--debug"],
        ["data", "download", "svhn", "--debug"],
    ],
)
def test_debug_is_taken_before_or_after_the_command(argv):
    from harness.cli.parser import build_parser

    assert build_parser().parse_args(argv).debug is True
    assert getattr(build_parser().parse_args(["validate", "x.yaml"]), "debug", False) is False


def test_load_results_warns_about_records_it_leaves_out(tiny_finished, tmp_path):
    """`harness report` names an unreadable record and exits 1; the DataFrame was silently a row
    short."""
    from tests.misuse import copy_results

    results = copy_results(tiny_finished[1], tmp_path / "r")
    first = sorted(results.glob("*/record.json"))[0]
    first.write_text(first.read_text()[:100])  # cut mid-way
    with pytest.warns(UserWarning, match=r"1 record\(s\) could not be read and are left out"):
        df = h.load_results(results)
    assert first.parent.name not in set(df["cell_id"]) and len(df) == 1  # of the 2 cells


def test_compare_of_folders_that_share_no_configuration_says_so(tiny_finished, tmp_path):
    """It returned an empty frame without columns, which reads as "no difference"."""
    from tests.misuse import copy_results

    other = copy_results(tiny_finished[1], tmp_path / "r")
    for path in other.glob("*/record.json"):
        path.write_text(path.read_text().replace('"seed": 0', '"seed": 7'))
    assert sorted(h.load_results(other)["seed"]) == [7, 7]  # readable, another seed
    with pytest.raises(h.HarnessError, match=r"share no configuration and seed"):
        h.compare(tiny_finished[1], other)
