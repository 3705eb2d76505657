"""Methods declare the backbone families they build on, and ``methods: [all]`` says what it
leaves out: a backbone of a new family must not drop BatchEnsemble, Packed-Ensembles, MIMO and
Masksembles from a suite without a word."""

from __future__ import annotations

import sys

from harness.cli import main
from harness.registry import BACKBONES, METHODS

PLUGIN = """
from torch import nn

from harness.backbones import BackboneSpec, register_backbone


def build(in_shape, num_classes, dropout_rate=0.0):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Dropout(dropout_rate), nn.Linear(c * h * w, num_classes))


register_backbone(BackboneSpec(name="flat_linear", build=build, family="flat",
                               description="a linear model on flattened pixels (tests)"))
"""

SUITE = """
name: families
grid: {datasets: [digits], backbones: [flat_linear], methods: [all], M: [4], seeds: [0]}
recipe: {epochs: 1, batch_size: 64, lr: 0.05, warmup_epochs: 0}
evaluation: {cost: false}
"""


def test_validate_lists_the_methods_all_leaves_out_for_a_new_family(tmp_path, monkeypatch, capsys):
    # The plugin registers into a copy of the scanned registry, restored after the test.
    BACKBONES.names()
    monkeypatch.setattr(BACKBONES, "_items", dict(BACKBONES._items))
    monkeypatch.setattr("harness.registry.core._imported_plugins", set())
    (tmp_path / "flat_backbone.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    suite = tmp_path / "families.yaml"
    suite.write_text(SUITE)
    argv = ["validate", str(suite), "--plugin", "flat_backbone", "--skip-data"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    left_out = sorted(
        line.split("leaves out ")[1].split(":")[0]
        for line in out.splitlines()
        if "methods: [all] leaves out" in line
    )
    declared = sorted(n for n, s in METHODS.items() if s.families and "flat" not in s.families)
    assert left_out == declared == ["batch_ensemble", "masksembles", "mimo", "packed_ensemble"]
    assert (
        "methods: [all] leaves out mimo: backbone 'flat_linear' is of family 'flat'; the method "
        "builds on the families cnn, resnet, wideresnet only"
    ) in out
    # The others stay in: single, the deep ensemble, σN-Ens, ...
    assert f"{len(METHODS) - len(declared)} methods" in out.splitlines()[0]
    monkeypatch.delitem(sys.modules, "flat_backbone")


def test_all_leaves_out_methods_whose_m_range_misses_the_grid(tmp_path, capsys):
    suite = tmp_path / "m.yaml"
    suite.write_text(SUITE.replace("flat_linear", "digits_cnn").replace("M: [4]", "M: [1]"))
    assert main(["validate", str(suite), "--skip-data"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "leaves out" in line]
    assert lines, "M=1 is below every ensemble's minimum"
    assert all("grid.M has [1]; the method allows M in [" in line for line in lines), lines
