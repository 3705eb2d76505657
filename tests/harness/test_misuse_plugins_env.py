"""Misuse of the plugin routes and of the ``HARNESS_*`` environment variables (issue 58, item 6).

The rule (tests/misuse.py): a mistake is refused before any work starts, in one line naming the
thing, the value and what to do; exit status 2; no traceback; every file byte-identical. Here:

- an installed entry point whose module fails to import (a fabricated ``*.dist-info`` folder on
  ``sys.path``), for a registry scanned at start-up and for an executor imported when picked;
- a ``--plugin`` module that does not exist, a ``$HARNESS_PLUGINS`` module that raises, a
  ``$HARNESS_METHOD_PACKAGES`` package whose module raises;
- a plugin metric that raises (its cells fail with that line in their records, the others go
  on) or returns no number (a string ``"nan"``, None, a bool, several values);
- a plugin figure that raises during ``harness report`` (one line, the rest of the report made);
- every ``HARNESS_*`` variable with a bad value (exit 2 naming it and its allowed values), and
  ``HARNESS_SIGMA_KERNELS=triton`` where the kernels cannot run (one warning, the reference
  path runs).
"""

from __future__ import annotations

import ast
import logging
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.contract.env import VARIABLES, EnvError, check_environment
from harness.contract.metric_spec import MetricError, MetricSpec
from tests.conftest import REPO
from tests.misuse import TINY_SUITE, copy_results, no_traceback, tree_hashes


@pytest.fixture(scope="module")
def finished(tiny_finished) -> tuple[Path, Path]:
    """(suite, results folder) of the 2-cell digits grid, run once for the module."""
    return tiny_finished


@pytest.fixture
def results(finished, tmp_path) -> Path:
    """A copy of the finished results folder (misused; the module's run stays as it was)."""
    return copy_results(finished[1], tmp_path / "r" / "tiny")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """``harness ls`` writes its listing to the user cache: a folder of this test instead."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Write plugin modules into a folder on ``sys.path``: ``plugins("name", "source")``. On
    teardown, what they registered is taken out of the registries again (a metric left
    registered would be computed in every later cell of the session, a figure drawn in every
    later report) and the modules are forgotten."""
    from harness.registry import METHODS, METRICS
    from harness.registry import core as registry_core
    from reports.figures.base import FIGURES

    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    registries = (METRICS, FIGURES, METHODS)
    before = [dict(r._items) for r in registries]
    names: list[str] = []

    def write(name: str, source: str) -> str:
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for registry, items in zip(registries, before, strict=True):
        registry._items.clear()
        registry._items.update(items)
    for name in names:
        registry_core._imported_plugins.discard(name)
        sys.modules.pop(name, None)


def one_line(capsys, *needles: str) -> str:
    """stderr: one line, no traceback, naming every needle."""
    _, err = no_traceback(capsys)
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# --------------------------------------------------------------------------- entry points


def installed(site: Path, dist: str, group: str, entry: str, module: str, code: str) -> None:
    """A distribution as pip would leave it: ``<dist>-0.1.dist-info`` declaring the entry point
    ``entry`` in ``group``, beside the module it names."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    (site / f"{module}.py").write_text(code)


def test_an_entry_point_that_fails_to_import_is_named_with_its_group_and_module(
    tmp_path, monkeypatch, capsys
):
    from harness.registry import METHODS

    site = tmp_path / "site"
    installed(site, "broken_methods", "harness.methods", "broken = broken_ep_module",
              "broken_ep_module", "raise RuntimeError('the plugin cannot start')\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    # The registry reads entry points once per process: as a fresh `harness` would.
    monkeypatch.setattr(METHODS, "_entry_points_loaded", False)
    monkeypatch.setattr(METHODS, "_scanned", set(METHODS._scanned))
    assert main(["ls"]) == 2
    one_line(
        capsys,
        "error: entry point 'broken' (group harness.methods, module broken_ep_module) raised "
        "RuntimeError at ",
        "broken_ep_module.py:1 while importing: the plugin cannot start",
        "fix or uninstall its distribution (broken_methods)",
    )


def test_an_executor_entry_point_that_fails_to_import_is_refused_before_any_cell(
    finished, tmp_path, monkeypatch, capsys
):
    from harness.executors import EXECUTORS

    site = tmp_path / "site"
    installed(site, "broken_exec", "harness.executors", "brokenexec = broken_exec_mod:Executor",
              "broken_exec_mod", "import no_such_dependency_xyz\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(EXECUTORS, "_entry_points_loaded", False)
    monkeypatch.setattr(EXECUTORS, "_scanned", set(EXECUTORS._scanned))
    monkeypatch.setattr(EXECUTORS, "_items", dict(EXECUTORS._items))
    out = tmp_path / "out"
    argv = ["run", str(finished[0]), "--executor", "brokenexec", "--results", str(out), "-q"]
    assert main(argv) == 2
    one_line(
        capsys,
        "entry point 'brokenexec' (group harness.executors, module broken_exec_mod) raised "
        "ModuleNotFoundError",
        "No module named 'no_such_dependency_xyz'",
    )
    assert tree_hashes(out) == {}  # nothing was written


# ------------------------------------------------------------------------ plugin modules


def test_a_plugin_module_that_does_not_exist_is_one_line(results, capsys):
    before = tree_hashes(results)
    assert main(["report", str(results), "--plugin", "no_such_plugin_xyz"]) == 2
    one_line(capsys, "error: plugin module 'no_such_plugin_xyz' cannot be imported")
    assert tree_hashes(results) == before


def test_a_harness_plugins_module_that_raises_is_one_line(results, plugins, monkeypatch, capsys):
    plugins("raising_env_plugin", "VALUE = {}['missing']\n")
    monkeypatch.setenv("HARNESS_PLUGINS", "raising_env_plugin")
    before = tree_hashes(results)
    assert main(["report", str(results)]) == 2
    one_line(
        capsys,
        "error: plugin module 'raising_env_plugin' raised KeyError at ",
        "raising_env_plugin.py:1 while importing: 'missing'",
    )
    assert tree_hashes(results) == before


def test_a_method_package_whose_module_raises_names_the_variable(tmp_path, monkeypatch, capsys):
    from harness.registry import METHODS

    pkg = tmp_path / "site" / "broken_methods_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("raise ValueError('no such layer')\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setenv("HARNESS_METHOD_PACKAGES", "broken_methods_pkg")
    monkeypatch.setattr(METHODS, "_scanned", set(METHODS._scanned))
    monkeypatch.delitem(sys.modules, "broken_methods_pkg", raising=False)
    assert main(["ls"]) == 2
    one_line(
        capsys,
        "error: method package 'broken_methods_pkg' (from $HARNESS_METHOD_PACKAGES): module "
        "'broken_methods_pkg.bad' raised ValueError at ",
        "bad.py:1 while importing: no such layer",
    )


# ------------------------------------------------------------------------- plugin metrics

RAISING_METRIC = """
from harness.contract.metric_spec import MetricSpec
from harness.registry import register_metric


def exploding(probs, targets):
    raise ZeroDivisionError("no images of class 3")


register_metric(MetricSpec("exploding", "Exploding", compute=exploding))
"""


def test_a_metric_that_raises_fails_each_cell_with_one_line_and_the_grid_goes_on(
    tmp_path, plugins, capsys, caplog
):
    plugins("raising_metric_plugin", RAISING_METRIC)
    suite = tmp_path / "tiny.yaml"
    suite.write_text(textwrap.dedent(TINY_SUITE))
    argv = ["run", str(suite), "--executor", "inprocess", "--results", str(tmp_path / "r"), "-q"]
    assert main([*argv, "--plugin", "raising_metric_plugin"]) == 2  # the user's to fix
    no_traceback(capsys)
    from harness.contract import iter_records

    records = list(iter_records(tmp_path / "r" / "tiny"))
    assert len(records) == 2  # the second cell ran after the first failed
    for rec in records:
        assert rec["status"] == "failed" and rec["error"]["type"] == "MetricError"
        assert rec["error"]["phase"] == "evaluate"
        message = rec["error"]["message"]
        assert message.startswith(
            "metric 'exploding' (raising_metric_plugin.exploding) raised ZeroDivisionError at "
        ), message
        assert f"on the clean test set of cell {rec['label']}: no images of class 3" in message
        assert "\n" not in message
        # what the run said while it went on: the cell, then the record's line
        said = f"cell {rec['label']} failed: MetricError: {message}"
        assert said in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("nan", r"returned 'nan' \(str\)"),  # float() would have turned it into NaN silently
        (None, r"returned None \(NoneType\)"),
        (True, r"returned True \(bool\)"),
        (torch.tensor([0.5, 0.7]), r"returned tensor\(\[0\.5000, 0\.7000\]\) \(Tensor\)"),
    ],
)
def test_a_metric_that_returns_no_number_is_named(value, shown):
    from harness.engine.evaluate import plugin_metric

    spec = MetricSpec("odd", "Odd", compute=lambda probs, targets: value)
    probs, labels = torch.full((2, 3, 4), 0.25), torch.zeros(3, dtype=torch.long)
    with pytest.raises(MetricError, match=rf"^metric 'odd' \(.*<lambda>\) {shown} on the clean "
                       r"test set of cell c/1, not a number; compute\(probs, targets\) must "
                       r"return a float"):  # fmt: skip
        plugin_metric(spec, probs, labels, "c/1")


@pytest.mark.parametrize("value", [0.25, float("nan"), torch.tensor(0.25), 1])
def test_a_metric_may_return_any_real_number_nan_included(value):
    from harness.engine.evaluate import plugin_metric

    spec = MetricSpec("ok", "Ok", compute=lambda probs, targets: value)
    got = plugin_metric(spec, torch.zeros(1, 2, 2), torch.zeros(2, dtype=torch.long))
    assert isinstance(got, float)
    assert math.isnan(got) if isinstance(value, float) and math.isnan(value) else got == value


def test_evaluate_with_a_metric_returning_a_string_exits_2_with_records_unchanged(
    results, plugins, capsys
):
    plugins("string_metric_plugin", RAISING_METRIC.replace(
        'raise ZeroDivisionError("no images of class 3")', 'return "nan"'
    ).replace('"exploding"', '"stringy"'))  # fmt: skip
    before = tree_hashes(results)
    assert main(["evaluate", str(results), "--plugin", "string_metric_plugin"]) == 2
    _, err = no_traceback(capsys)
    assert "error: metric 'stringy' (string_metric_plugin.exploding) returned 'nan' (str)" in err
    assert tree_hashes(results) == before


# ------------------------------------------------------------------------- plugin figures


def test_a_figure_that_raises_is_one_line_and_the_report_is_made(results, plugins, tmp_path,
                                                                  capsys, caplog):  # fmt: skip
    plugins("raising_figure_plugin", """
        from reports.figures.base import FigureSpec, register_figure

        def broken(cells):
            raise ValueError("no column named 'gain'")

        register_figure(FigureSpec("fig-broken", "Broken", "c", "n", broken))
    """)  # fmt: skip
    out = tmp_path / "page"
    argv = ["report", str(results), "--plugin", "raising_figure_plugin", "--output", str(out)]
    assert main(argv) == 0
    no_traceback(capsys)
    # One warning line (main's logging prints it as "WARNING <message>"), no traceback with it.
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "figure fig-broken (raising_figure_plugin.broken) failed: ValueError: no column "
        "named 'gain'; the rest of the report is made without it"
    ]
    assert all(r.exc_info is None for r in said)
    page = (out / "leaderboard.html").read_text()
    # listed with what went wrong, among the figures not drawn; the built-in ones are drawn
    assert (
        '<li data-figure="fig-broken">Broken: failed: ValueError: no column named &#39;gain&#39;'
        "</li>" in page
    )
    assert page.count("data:image/png;base64,") >= 1


# ---------------------------------------------------------------- environment variables

#: (variable, bad value, what the line says about it). ``{file}``: an existing file.
BAD_VALUES = [
    ("HARNESS_SIGMA_KERNELS", "cuda", "not a known value; allowed: auto, triton, reference"),
    ("HARNESS_PROGRESS", "loud", "not a known value; allowed: auto, live, epochs, off"),
    ("HARNESS_LOADER_WORKERS", "two", "not a whole number; allowed: a whole number >= 0"),
    ("HARNESS_LOADER_WORKERS", "-1", "below 0; allowed: a whole number >= 0"),
    ("HARNESS_CONCURRENT_CELLS", "0", "below 1; allowed: a whole number >= 1"),
    ("HARNESS_LEASE_TIMEOUT_S", "10", "allowed: a number of seconds above 30"),
    ("HARNESS_DIST_TIMEOUT_S", "nan", "not a finite number above 0"),
    ("HARNESS_DEBUG", "maybe", "not a yes/no value; allowed: 1, true, yes, on or 0, false"),
    ("HARNESS_DATA_ROOT", "{file}", "a file, not a folder"),
    ("HARNESS_CACHE_DIR", "{file}/sub", "it cannot be created: '{file}' is a file"),
    ("HARNESS_FASHION_MNIST_DIR", "{file}", "a file, not a folder"),
    ("HARNESS_FONT_DIR", "{file}.missing", "no such folder; allowed: an existing folder"),
    ("HARNESS_TRUST_PICKLE", "{folder}", "is a folder, not a file"),
    ("HARNESS_DOWNLOAD_MIRROR", "mirror.example.org/data", "not a base URL"),
    ("HARNESS_PLUGINS", "my plugin", "'my plugin' is not a module name"),
    ("HARNESS_METHOD_PACKAGES", "ok_pkg,bad-pkg", "'bad-pkg' is not a module name"),
    ("HARNESS_BACKBONE_PACKAGES", "a..b", "'a..b' is not a module name"),
    ("HARNESS_DATASET_PACKAGES", "1st", "'1st' is not a module name"),
]


@pytest.mark.parametrize(
    ("name", "value", "says"), BAD_VALUES, ids=[f"{n}={v}" for n, v, _ in BAD_VALUES]
)
def test_a_bad_environment_variable_exits_2_before_any_work(
    name, value, says, results, tmp_path, monkeypatch, capsys
):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    value = value.format(file=a_file, folder=tmp_path)
    monkeypatch.setenv(name, value)
    before = tree_hashes(results)
    assert main(["report", str(results)]) == 2  # a report would write its pages
    one_line(
        capsys,
        f"error: environment variable {name}={value!r}: ",
        says.format(file=a_file),
        f"give an allowed value or unset {name}",
    )
    assert tree_hashes(results) == before


def test_every_harness_variable_the_code_reads_is_checked():
    """Each ``"HARNESS_…"`` string of harness/, methods/ and reports/ names a variable of the
    table :func:`check_environment` walks (one forgotten would be read unchecked)."""
    named = set()
    for pkg in ("harness", "methods", "reports"):
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    named |= set(re.findall(r"^HARNESS_[A-Z0-9_]+$", node.value))
    assert named - set(VARIABLES) == set()
    assert check_environment({}) == []


def test_a_read_site_raises_the_same_line_where_main_did_not_check(monkeypatch):
    """Workers, Slurm tasks and the Python API do not start through ``main``."""
    from harness.data._machinery.file_loader import default_workers
    from harness.storage.lease import lease_timeout_s

    monkeypatch.setenv("HARNESS_LOADER_WORKERS", "4 ")
    assert default_workers(10_000) == 4  # blanks around a number are fine
    monkeypatch.setenv("HARNESS_LOADER_WORKERS", "four")
    with pytest.raises(EnvError, match=r"^environment variable HARNESS_LOADER_WORKERS='four'"):
        default_workers(10_000)
    monkeypatch.setenv("HARNESS_LEASE_TIMEOUT_S", "")  # empty: unset, the default
    assert lease_timeout_s() == 600.0
    monkeypatch.setenv("HARNESS_LEASE_TIMEOUT_S", "ten minutes")
    with pytest.raises(EnvError, match=r"HARNESS_LEASE_TIMEOUT_S='ten minutes': not a number"):
        lease_timeout_s()


def test_debug_false_no_longer_means_debug_on(monkeypatch):
    from harness.cli.checks import debug_wanted

    for text, wanted in [("false", False), ("0", False), ("off", False), ("1", True),
                         ("yes", True), ("", False)]:  # fmt: skip
        monkeypatch.setenv("HARNESS_DEBUG", text)
        assert debug_wanted() is wanted, text


def test_triton_kernels_without_cuda_say_once_what_runs_instead(monkeypatch, caplog):
    import methods._triton as kernels

    monkeypatch.setenv("HARNESS_SIGMA_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(kernels, "_mode", "triton")
    monkeypatch.setattr(kernels, "_fallback_said", False)
    with caplog.at_level(logging.WARNING, logger="harness"):
        assert kernels.use_kernels(torch.zeros(2, 3)) is False
        assert kernels.use_kernels(torch.zeros(2, 3)) is False
    said = [r.getMessage() for r in caplog.records if "σNorm" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("HARNESS_SIGMA_KERNELS=triton asks for the σNorm Triton kernels")
    assert said[0].endswith("the σNorm layers run the PyTorch reference path instead")


def test_a_misspelled_variable_is_named_with_the_one_meant(results, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_LOADER_WORKER", "abc")
    before = tree_hashes(results)
    assert main(["status", str(results)]) == 0  # a warning, not a refusal: the command runs
    _, err = no_traceback(capsys)
    assert ("warning: environment variable HARNESS_LOADER_WORKER is not one the harness reads "
            "(did you mean HARNESS_LOADER_WORKERS?)") in err  # fmt: skip
    assert tree_hashes(results) == before


def test_a_plugin_given_as_a_file_path_says_how_to_name_it(results, capsys, tmp_path):
    plugin = tmp_path / "sideplug.py"
    plugin.write_text("X = 1\n")
    before = tree_hashes(results)
    assert main(["report", str(results), "--plugin", str(plugin)]) == 2
    _, err = no_traceback(capsys)
    (line,) = err.strip().splitlines()
    assert "a file path, not a module name" in line and "--plugin sideplug" in line
    assert tree_hashes(results) == before
