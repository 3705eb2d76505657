"""The extension face (issue 60, item 2): ``harness.plugins`` exports every ``register_*``
function and the types a plugin builds — the objects their layers define — and the seven
one-file examples of docs/architecture.md ("Adding things"), which import nothing of the
harness but it, are written into a package here and used: a suite of the example method on the
example backbone and dataset runs on the example executor, logs to the example tracker and
records the example metric; its report draws the example figure."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import textwrap

import pytest

import harness.plugins as plugins
from harness.cli import main
from harness.contract import read_record
from harness.registry.core import PLUGINS_ENV
from tests.conftest import REPO

DOC = REPO / "docs" / "architecture.md"

#: ``register_*`` functions that are no extension point: a dataset module's helper that
#: registers its own variants (SST-2 for a tokenizer; docs/text.md).
NOT_EXTENSION_POINTS = {"register_text_datasets"}

SUITE = """
name: faced
grid:
  datasets: [my_noise]
  backbones: [{name: my_mlp, kwargs: {width: 16}}]
  M: [2]
  seeds: [0, 1]
  methods:
    - {name: my_copies, hparams: {temperature: 2.0}}
recipe: {epochs: 1, batch_size: 32, lr: 0.05, warmup_epochs: 0}
evaluation: {cost: false}
"""


def doc_examples() -> dict[str, str]:
    """``{module name: source}`` of the doc's one-file examples (blocks opening ``# my_….py``)."""
    blocks = re.findall(r"^```python\n(# (my_\w+)\.py.*?)^```", DOC.read_text(), re.S | re.M)
    return {name: source for source, name in blocks}


def test_every_register_function_and_the_types_are_the_defining_objects():
    defined = set()
    for package in ("harness", "methods", "reports"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("register_"):
                    defined.add(node.name)
    assert defined - NOT_EXTENSION_POINTS <= set(plugins.__all__)
    assert len(defined - NOT_EXTENSION_POINTS) == 7
    assert plugins.__all__ == sorted(plugins._WHERE)
    for name, where in plugins._WHERE.items():
        module, _, attribute = where.partition(":")
        assert getattr(plugins, name) is getattr(importlib.import_module(module), attribute), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        plugins.nothing  # noqa: B018


@pytest.mark.slow  # starts an interpreter
def test_a_figure_metric_or_tracker_plugin_imports_no_torch():
    code = (
        "import sys\nfrom harness.plugins import FigureSpec, MetricSpec, TrackerRun, "
        "register_figure, register_metric, register_tracker\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=300)  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr


@pytest.fixture
def face_package(tmp_path, monkeypatch):
    """The doc's examples as ``facepkg.my_method`` … ``facepkg.my_metric``; every registry they
    register into is a copy, restored after the test."""
    from harness import executors
    from harness.registry import BACKBONES, DATASETS, METHODS, METRICS
    from harness.storage.loggers import TRACKERS
    from reports.figures.base import FIGURES

    for registry in (METHODS, BACKBONES, DATASETS, METRICS, TRACKERS, FIGURES):
        registry.names()  # scanned first, so the copy holds the built-in entries
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    executors.EXECUTORS.names()
    built_in = {k: v for k, v in executors.EXECUTORS._items.items() if k in executors.BUILT_IN}
    monkeypatch.setattr(executors.EXECUTORS, "_items", built_in)
    monkeypatch.setattr("harness.registry.core._imported_plugins", set())
    monkeypatch.setenv(PLUGINS_ENV, "")
    pkg = tmp_path / "facepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    examples = doc_examples()
    for name, source in examples.items():
        (pkg / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield {name: f"--plugin=facepkg.{name}" for name in examples}
    for name in [m for m in sys.modules if m == "facepkg" or m.startswith("facepkg.")]:
        del sys.modules[name]  # not monkeypatch.delitem: its undo would bring them back


def test_the_doc_examples_import_only_the_extension_face():
    examples = doc_examples()
    assert sorted(examples) == ["my_backbone", "my_dataset", "my_executor", "my_figure",
                                "my_method", "my_metric", "my_tracker"]  # fmt: skip
    for name, source in examples.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom | ast.Import):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else [
                    a.name for a in node.names]  # fmt: skip
                for module in modules:
                    if module.split(".")[0] in ("harness", "methods", "reports"):
                        assert module == "harness.plugins", (name, module)


def test_one_extension_of_each_kind_from_the_public_module_only(face_package, tmp_path, capsys):
    suite = tmp_path / "faced.yaml"
    suite.write_text(SUITE)
    results = tmp_path / "results"
    argv = ["run", str(suite), "--executor", "my_backwards", "--logger", "my_jsonl", "-q",
            "--results", str(results), "--data-root", str(tmp_path)]  # fmt: skip
    argv += face_package.values()
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "running 2 cells backwards\nran backwards\n" in out
    folder = results / "faced"
    records = [read_record(p.parent) for p in sorted(folder.glob("*/record.json"))]
    assert len(records) == 2 and {r["status"] for r in records} == {"done"}
    for rec in records:
        config = rec["config"]
        assert (config["method"], config["backbone"], config["dataset"], config["M"]) == (
            "my_copies", "my_mlp", "my_noise", 2)  # fmt: skip
        assert config["hparams"] == {"temperature": 2.0}
        assert 0.0 <= rec["metrics"]["clean"]["my_top2"] <= 1.0
        assert rec["metrics"]["clean"]["my_top2"] >= rec["metrics"]["clean"]["acc"]
        log = (folder / rec["cell_id"] / "my_jsonl.log").read_text().splitlines()
        assert json.loads(log[0])["step"] == 1
        assert json.loads(log[-1]) == {"final_acc": rec["metrics"]["clean"]["acc"]}

    report = ["report", str(folder), face_package["my_figure"], face_package["my_metric"]]
    assert main(report) == 0, capsys.readouterr().err
    page = (folder / "leaderboard.html").read_text()
    assert 'id="fig-my-acc-by-seed"' in page and "Accuracy by seed (plugin)" in page
    assert 'data-col="my_top2"' in page
