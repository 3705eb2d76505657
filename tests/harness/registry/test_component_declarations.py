"""Components declare what they support (issue 40): a method names the backbone families it
builds on, a backbone spec says what the backbone is and knows no method, a dataset spec declares
what its corruption copies are keyed by."""

from __future__ import annotations

import ast
import dataclasses

from harness.backbones import BackboneSpec
from harness.data._machinery.base import DatasetSpec
from harness.registry import BACKBONES, DATASETS, METHODS
from tests.conftest import REPO


def test_backbone_spec_knows_no_method():
    fields = {f.name for f in dataclasses.fields(BackboneSpec)}
    assert fields == {
        "name", "build", "family", "description", "depth", "stem", "layered_class"
    }  # fmt: skip
    assert not {n for n in fields if n.startswith("tu_")}
    for name in BACKBONES.names():
        assert BACKBONES.get(name).stem in ("cifar", "imagenet"), name
    assert BACKBONES.get("resnet50_imagenet").stem == "imagenet"
    assert BACKBONES.get("resnet18").depth == 18


def test_every_torch_uncertainty_method_declares_its_families():
    """The methods built from torch-uncertainty's dedicated models (methods/_tu/common.py) each
    declare the families they build on, and tu_common imports no backbone module: what it needs
    of a backbone comes from the spec's declarations."""
    tu_methods = []
    for path in sorted((REPO / "methods").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if "methods._tu.common" in imported:
            tu_methods.append(path.stem)
        if path.stem == "tu_common":
            assert not {m for m in imported if m.startswith("harness.backbones")}, imported
    assert tu_methods
    for name in tu_methods:
        spec = METHODS.get(name)
        assert spec.families, f"{name} declares no backbone family"
    # "cnn" backbones are rebuilt from the library's layers: each declares its layered class.
    cnn = [b for b in BACKBONES.names() if BACKBONES.get(b).family == "cnn"]
    assert cnn and all(BACKBONES.get(b).layered_class is not None for b in cnn), cnn


def test_corruption_key_is_a_declared_dataset_field():
    assert "corruption_key" in {f.name for f in dataclasses.fields(DatasetSpec)}
    assert DATASETS.get("fashion_mnist").corruption_key == "fashion_mnist"
    assert DATASETS.get("digits").corruption_key is None
