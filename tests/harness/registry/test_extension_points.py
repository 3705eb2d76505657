"""Adding a method, a backbone, a dataset or an executor is one file: each is written into a
temporary package here, named with ``--plugin``, and taken through ``harness ls``, ``validate``
and a one-epoch ``run`` in this process (registry state restored after the test). A dataset with
its download is one file too: ``harness data download`` fetches it from a local HTTP server
(127.0.0.1) as a published-like archive, md5-checked, and a run trains on it.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import tarfile
import textwrap

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.contract import read_record
from harness.registry import BACKBONES, DATASETS, METHODS
from tests.harness.cli.test_download import server  # noqa: F401  (the 127.0.0.1 HTTP server fixture)

METHOD = '''
"""A plugin method: the single network, under its own name."""
from harness.plugins import MethodSpec, NoHparams, register_method
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

from harness.data import DatasetSpec, ImageSet, register_dataset


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
from harness.plugins import RunOutcome, register_executor


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


def _fresh_executors(monkeypatch) -> None:
    """The executor registry as built in: a plugin's executor registered in the test is
    forgotten after it (and, called mid-test, from then on)."""
    from harness import executors

    executors.EXECUTORS.names()
    built_in = {k: v for k, v in executors.EXECUTORS._items.items() if k in executors.BUILT_IN}
    monkeypatch.setattr(executors.EXECUTORS, "_items", built_in)


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """``plugpkg.method``, ``.backbone``, ``.dataset``, ``.executor``: one file each; the
    registries they register into are copies, restored after the test."""
    for registry in (METHODS, BACKBONES, DATASETS):
        registry.names()  # scanned before copying, so the copy holds the built-in entries
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    monkeypatch.setattr("harness.registry.core._imported_plugins", set())
    _fresh_executors(monkeypatch)
    pkg = tmp_path / "plugpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    files = (("method", METHOD), ("backbone", BACKBONE), ("dataset", DATASET))
    for name, text in (*files, ("executor", EXECUTOR)):
        (pkg / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield [f"--plugin=plugpkg.{n}" for n in ("method", "backbone", "dataset")]
    for name in [m for m in sys.modules if m == "plugpkg" or m.startswith("plugpkg.")]:
        del sys.modules[name]  # not monkeypatch.delitem: its undo would bring them back


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

    _fresh_executors(monkeypatch)
    assert main([*argv, *plugin_package, "--force"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "harness run: error: argument --executor: invalid choice: 'backwards' (choose from "
        "'auto', 'inprocess', 'local', 'slurm') (see harness run --help)\n"
    )


FETCHED = '''
"""A plugin dataset and its download: 4-class images published as one tar.gz (a top folder
plug-noise/ of .npy arrays, as CIFAR-10-C's tar holds CIFAR-10-C/)."""
from pathlib import Path

import numpy as np
import torch

from harness.plugins import Archive, Archives, DatasetSpec, ImageSet, register_dataset


def load(root):
    folder = Path(root) / "plug-noise"
    return {
        split: ImageSet(torch.from_numpy(np.load(folder / f"{split}_x.npy")),
                        torch.from_numpy(np.load(folder / f"{split}_y.npy")).long())
        for split in ("train", "test")
    }


register_dataset(DatasetSpec(
    name="plug_fetched", in_shape=(1, 6, 6), num_classes=4, mean=(0.5,), std=(0.25,), load=load,
    location=lambda root: Path(root) / "plug-noise",
    is_available=lambda root: (Path(root) / "plug-noise" / "test_y.npy").is_file(),
    download=Archives((Archive("https://data.example.org/plug-noise.tar.gz", "{md5}"),)),
    description="a plugin's downloaded dataset"))
'''


def _publish(served, staging) -> str:
    """plug-noise.tar.gz in the served folder; returns its md5."""
    folder = staging / "plug-noise"
    folder.mkdir(parents=True)
    g = np.random.default_rng(0)
    for split, n in (("train", 128), ("test", 32)):
        y = np.arange(n) % 4
        x = g.uniform(0, 100, (n, 1, 6, 6)) + y.reshape(-1, 1, 1, 1) * 40
        np.save(folder / f"{split}_x.npy", x.clip(0, 255).astype(np.uint8))
        np.save(folder / f"{split}_y.npy", y)
    with tarfile.open(served / "plug-noise.tar.gz", "w:gz") as tar:
        tar.add(folder, arcname="plug-noise")
    return hashlib.md5((served / "plug-noise.tar.gz").read_bytes()).hexdigest()


def test_a_dataset_with_its_download_is_one_file(
    plugin_package,
    server,  # noqa: F811  (the fixture imported above)
    tmp_path,
    capsys,
    monkeypatch,
):
    served, base = server
    md5 = _publish(served, tmp_path / "staging")
    (tmp_path / "plugpkg" / "fetched.py").write_text(textwrap.dedent(FETCHED).replace("{md5}", md5))
    importlib.invalidate_caches()  # the package folder was listed before this file existed
    plugins = [*plugin_package, "--plugin=plugpkg.fetched"]
    monkeypatch.setenv("HARNESS_DOWNLOAD_MIRROR", base)  # the published URL, served locally
    root = tmp_path / "data"
    suite = tmp_path / "fetched.yaml"
    suite.write_text(SUITE.replace("plug_noise", "plug_fetched").replace("plugged", "fetched"))
    assert main(["validate", str(suite), *plugins, "--data-root", str(root)]) != 0
    assert "harness data download plug_fetched" in capsys.readouterr().err  # not fetched yet

    assert main(["data", "download", "plug_fetched", *plugins, "--data-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"downloading {base}/plug-noise.tar.gz" in out and "plug_fetched: ready in" in out
    assert sorted(p.name for p in root.iterdir()) == ["plug-noise"]  # extracted, archive gone
    assert DATASETS.get("plug_fetched").is_available(root)

    results = tmp_path / "results"
    argv = ["run", str(suite), *plugins, "--executor", "inprocess", "-q"]
    assert main([*argv, "--results", str(results), "--data-root", str(root)]) == 0
    (cell_dir,) = [p.parent for p in (results / "fetched").glob("*/record.json")]
    rec = read_record(cell_dir)
    assert rec["status"] == "done", rec.get("error")
    assert rec["config"]["dataset"] == "plug_fetched"
    assert 0.0 <= rec["metrics"]["clean"]["acc"] <= 1.0


def test_a_plugin_download_with_a_wrong_md5_is_refused(
    plugin_package,
    server,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    served, base = server
    _publish(served, tmp_path / "staging")
    (tmp_path / "plugpkg" / "fetched.py").write_text(
        textwrap.dedent(FETCHED).replace("{md5}", "0" * 32)
    )
    importlib.invalidate_caches()
    monkeypatch.setenv("HARNESS_DOWNLOAD_MIRROR", base)
    root = tmp_path / "data"
    argv = [
        "data",
        "download",
        "plug_fetched",
        "--plugin=plugpkg.fetched",
        "--data-root",
        str(root),
    ]
    assert main(argv) == 2
    assert f"expected md5 {'0' * 32}" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == ["plug-noise.tar.gz.corrupt"]  # not extracted


DIAG_METHOD = '''
"""A plugin method declaring one diagnostic and its figure: the single network, recording the
norm of its weights times a hyper-parameter ``scale`` every epoch."""
from dataclasses import dataclass

import torch

from harness.contract import Diagnostic, DiagnosticFigure
from methods._base import MethodSpec, register_method
from methods.single import SingleModel


@dataclass(frozen=True)
class Hp:
    scale: float = 1.0


class Model(SingleModel):
    def __init__(self, ctx, hp):
        super().__init__(ctx)
        self.scale = hp.scale

    def diagnostics(self):
        with torch.no_grad():
            norm = sum(float(p.norm()) for p in self.parameters())
        return {"plug_norm": self.scale * norm, "not_declared": 7.0}


register_method(MethodSpec(
    name="plug_diag", build=Model, hparams=Hp, max_members=1,
    diagnostics=(Diagnostic("plug_norm", "Scaled ‖w‖", "Plug group", "f2", hidden=False,
                            figure=DiagnosticFigure(x="scale", id="fig-plug-norm",
                                                    title="Scaled norm vs scale",
                                                    reference_lines=(1.0, "M"))),)))
'''

DIAG_SUITE = """
name: diag
grid: {datasets: [plug_noise], backbones: [plug_linear], M: [1], seeds: [0],
       methods: [{name: plug_diag, hparams: {scale: [0.5, 2.0]}}]}
recipe: {epochs: 2, batch_size: 32, lr: 0.05, warmup_epochs: 0}
evaluation: {cost: false}
"""


def test_a_method_declares_a_diagnostic_the_report_shows(plugin_package, tmp_path, capsys):
    (tmp_path / "plugpkg" / "diag.py").write_text(textwrap.dedent(DIAG_METHOD))
    importlib.invalidate_caches()
    plugins = [*plugin_package, "--plugin=plugpkg.diag"]
    suite = tmp_path / "diag.yaml"
    suite.write_text(DIAG_SUITE)
    results = tmp_path / "results"
    argv = ["run", str(suite), *plugins, "--executor", "inprocess", "-q", "--results"]
    assert main([*argv, str(results), "--data-root", str(tmp_path)]) == 0
    records = [read_record(p.parent) for p in (results / "diag").glob("*/record.json")]
    assert len(records) == 2 and {r["status"] for r in records} == {"done"}
    declared = records[0]["diagnostics"]["declared"]  # written by the engine, for the reporter
    assert [d["key"] for d in declared] == ["plug_norm"] and declared[0]["figure"]["x"] == "scale"

    out = tmp_path / "report"
    assert main(["report", str(results / "diag"), "-o", str(out)]) == 0  # no --plugin needed
    capsys.readouterr()
    page = (out / "leaderboard.html").read_text()
    assert "Scaled ‖w‖" in page and "Plug group" in page  # the declared label and group
    assert "Scaled norm vs scale" in page and "fig-plug-norm" in page  # the declared figure
    assert (out / "fig-plug-norm.png").is_file()  # drawn: two values of scale
    cells = pd.read_csv(out / "cells.csv")
    by_scale = dict(zip(cells["hp_scale"], cells["plug_norm"], strict=True))
    for rec in records:  # the last epoch's value, as declared
        scale = rec["config"]["hparams"]["scale"]
        assert by_scale[scale] == pytest.approx(rec["diagnostics"]["per_epoch"][-1]["plug_norm"])
    assert "not_declared" not in cells  # a declaring method shows only what it declares
