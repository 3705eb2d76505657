"""Adding a method, a backbone, a dataset or an executor is one file: each is written into a
temporary package here, named with ``--plugin``, and taken through ``harness ls``, ``validate``
and a one-epoch ``run`` in this process (registry state restored after the test).

Not covered: a dataset's download declared in its own file (``harness data download`` still
reads a name table in harness/data/download.py).
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from harness.cli import main
from harness.contract import read_record
from harness.registry import BACKBONES, DATASETS, METHODS

METHOD = '''
"""A plugin method: the single network, under its own name."""
from methods.base import MethodSpec, NoHparams, register_method
from methods.single import SingleModel

register_method(MethodSpec(name="plug_single", build=lambda ctx, hp: SingleModel(ctx),
                           hparams=NoHparams, max_members=1, reference="a plugin's method"))
'''

BACKBONE = '''
"""A plugin backbone: a linear model on flattened pixels, of a family of its own."""
from torch import nn

from harness.backbones import BackboneSpec, register_backbone


def build(in_shape, num_classes, dropout_rate=0.0):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Dropout(dropout_rate), nn.Linear(c * h * w, num_classes))


register_backbone(BackboneSpec(name="plug_linear", build=build, family="plug_flat",
                               description="a plugin's backbone"))
'''

DATASET = '''
"""A plugin dataset: 4-class noise images with a learnable mean shift, made in memory."""
import torch

from harness.data.base import DatasetSpec, ImageSet, register_dataset


def load(root):
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(160) % 4
    images = (torch.rand(160, 1, 6, 6, generator=g) * 100 + labels.view(-1, 1, 1, 1) * 40)
    x = images.clamp(0, 255).to(torch.uint8)
    return {"train": ImageSet(x[:128], labels[:128]), "test": ImageSet(x[128:], labels[128:])}


register_dataset(DatasetSpec(name="plug_noise", in_shape=(1, 6, 6), num_classes=4, mean=(0.5,),
                             std=(0.25,), load=load, location=lambda root: root,
                             description="a plugin's dataset"))
'''

EXECUTOR = '''
"""A plugin executor: the cells in this process, newest first, each record marked."""
from harness.engine.runner import run_cell
from harness.executors import register_executor
from harness.executors.base import RunOutcome


class Backwards:
    """every cell in this process, the last one first"""

    name = "backwards"
    reads = ("progress",)
    runs_here = True

    def __init__(self, options):
        self.options = options

    def describe(self, n_cells):
        return f"running {n_cells} cells backwards"

    def run(self, cells, results_dir, data_root, force):
        records = [run_cell(c, results_dir, data_root, force=force, progress=False)
                   for c in reversed(cells)]
        return RunOutcome(finished=True, records=records[::-1], messages=["ran backwards"])


register_executor("backwards", Backwards)
'''

SUITE = """
name: plugged
grid: {datasets: [plug_noise], backbones: [plug_linear], methods: [plug_single], M: [1],
       seeds: [0]}
recipe: {epochs: 1, batch_size: 32, lr: 0.05, warmup_epochs: 0}
evaluation: {cost: false}
"""


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """``plugpkg.method``, ``plugpkg.backbone``, ``plugpkg.dataset``: one file each; the
    registries they register into are copies, restored after the test."""
    for registry in (METHODS, BACKBONES, DATASETS):
        registry.names()  # scanned before copying, so the copy holds the built-in entries
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    monkeypatch.setattr("harness.registry.core._imported_plugins", set())
    monkeypatch.setattr("harness.executors._registered", {})
    pkg = tmp_path / "plugpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    files = (("method", METHOD), ("backbone", BACKBONE), ("dataset", DATASET))
    for name, text in (*files, ("executor", EXECUTOR)):
        (pkg / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield [f"--plugin=plugpkg.{n}" for n in ("method", "backbone", "dataset")]
    # Popped, not monkeypatch.delitem'd: the monkeypatch's undo would put them back, and the
    # next test's `--plugin plugpkg.x` would find the old module imported, registering nothing.
    for name in [m for m in sys.modules if m == "plugpkg" or m.startswith("plugpkg.")]:
        sys.modules.pop(name)


def test_a_method_a_backbone_and_a_dataset_each_one_file(
    plugin_package, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "ls-cache"))
    assert main(["ls", *plugin_package]) == 0
    out = capsys.readouterr().out
    for line in ("plug_single", "plug_linear", "a plugin's backbone", "plug_noise", "K=4"):
        assert line in out, line
    suite = tmp_path / "plugged.yaml"
    suite.write_text(SUITE)
    assert main(["validate", str(suite), *plugin_package]) == 0
    assert "1 cells" in capsys.readouterr().out
    results = tmp_path / "results"
    argv = ["run", str(suite), *plugin_package, "--executor", "inprocess", "-q"]
    assert main([*argv, "--results", str(results), "--data-root", str(tmp_path)]) == 0
    (cell_dir,) = [p.parent for p in (results / "plugged").glob("*/record.json")]
    rec = read_record(cell_dir)
    assert rec["status"] == "done", rec.get("error")
    assert rec["config"]["method"] == "plug_single"
    assert rec["config"]["backbone"] == "plug_linear"
    assert rec["config"]["dataset"] == "plug_noise"
    assert 0.0 <= rec["metrics"]["clean"]["acc"] <= 1.0


def test_an_executor_is_one_file(plugin_package, tmp_path, capsys, monkeypatch):
    """A ``--plugin`` module that registers an executor: listed by ``harness ls``, picked by
    ``harness run --executor NAME``, its records written; without the plugin the name is refused
    as argparse refuses a choice."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "ls-cache"))
    plugins = [*plugin_package, "--plugin=plugpkg.executor"]
    assert main(["ls", *plugins]) == 0
    out = capsys.readouterr().out
    assert (
        "  backwards        every cell in this process, the last one first (plugpkg.executor)"
        in (out.split("executors:\n")[1])
    )
    suite = tmp_path / "plugged.yaml"
    suite.write_text(SUITE.replace("seeds: [0]", "seeds: [0, 1]"))
    results = tmp_path / "results"
    argv = ["run", str(suite), "--executor", "backwards", "-q", "--results", str(results)]
    assert main([*argv, *plugins, "--data-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "running 2 cells backwards\nran backwards\n" in out
    records = [read_record(p.parent) for p in (results / "plugged").glob("*/record.json")]
    assert sorted(r["config"]["seed"] for r in records) == [0, 1]
    assert {r["status"] for r in records} == {"done"}
    assert {r["config"]["method"] for r in records} == {"plug_single"}

    monkeypatch.setattr("harness.executors._registered", {})
    assert main([*argv, *plugin_package, "--force"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "harness run: error: argument --executor: invalid choice: 'backwards' (choose from "
        "'auto', 'inprocess', 'local', 'slurm') (see harness run --help)\n"
    )
