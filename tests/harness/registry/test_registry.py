import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.registry import BACKBONES, DATASETS, METHODS
from harness.registry.core import DuplicateNameError, Registry, RegistryError, UnknownNameError
from tests.conftest import REPO


def test_duplicate_name_raises():
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)
    with pytest.raises(DuplicateNameError, match=r"widget 'a' is already registered"):
        reg.register("a", 2)
    assert reg.get("a") == 1


def test_unknown_name_lists_choices_and_closest_match():
    reg: Registry[int] = Registry("widget")
    for i, name in enumerate(["deep_ensemble", "batch_ensemble", "single"]):
        reg.register(name, i)
    with pytest.raises(
        UnknownNameError,
        match=r"unknown widget 'deep_ensembel'\. Did you mean "
        r"'deep_ensemble'\? Valid choices: batch_ensemble, deep_ensemble, single",
    ):
        reg.get("deep_ensembel")
    with pytest.raises(UnknownNameError, match=r"unknown widget 'zzz'\. Valid choices") as info:
        reg.get("zzz")
    assert info.value.suggestion is None
    assert info.value.choices == ["batch_ensemble", "deep_ensemble", "single"]


def test_decorator_registration_returns_the_object():
    reg: Registry[type] = Registry("thing")

    @reg.register("k")
    class K:
        pass

    assert reg.get("k") is K
    assert "k" in reg and len(reg) == 1


def test_builtin_registries_are_populated():
    assert {
        "single",
        "deep_ensemble",
        "sigma_ens",
        "film_ensemble",
        "batch_ensemble",
        "packed_ensemble",
        "mc_dropout",
        "mimo",
        "masksembles",
    } <= set(METHODS.names())
    assert {"digits_cnn", "resnet18", "resnet50", "wrn28_10", "vit_small_32"} <= set(
        BACKBONES.names()
    )
    assert {"digits", "digits_heldout", "sklearn_photos", "cifar10", "cifar100", "svhn"} <= set(
        DATASETS.names()
    )


# --- discovery: a method is one new module -------------------------------------------------------

TOY_METHOD = '''"""toy_plugin: a deep-ensemble-like test method, one module and nothing else."""

from dataclasses import dataclass

import torch
from torch import nn

from methods._base import EnsembleModel, MethodSpec, register_method


@dataclass(frozen=True)
class ToyHparams:
    scale: float = 1.0


class Toy(EnsembleModel):
    def __init__(self, ctx, hp):
        super().__init__()
        self.num_members = ctx.num_members
        self.scale = hp.scale
        self.nets = nn.ModuleList(ctx.build_backbone() for _ in range(ctx.num_members))

    def forward(self, x):
        return torch.stack([net(x) for net in self.nets]) * self.scale  # (M, B, K)


register_method(
    MethodSpec(name="toy_plugin", build=Toy, hparams=ToyHparams, reference="test plugin")
)
'''

SUITE = """
name: plugin
grid:
  datasets: [digits]
  backbones: [digits_cnn]
  methods: [all]
  M: [2]
recipe: {epochs: 1}
"""


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """A package outside the repository holding one new method module, announced to the method
    registry through $HARNESS_METHOD_PACKAGES (which subprocesses inherit)."""
    pkg = tmp_path / "plugins" / "toy_methods_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "toy_plugin.py").write_text(TOY_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    monkeypatch.setenv("HARNESS_METHOD_PACKAGES", "toy_methods_pkg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "plugins"), str(REPO)]))
    (tmp_path / "plugin.yaml").write_text(SUITE)
    return tmp_path


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_registry_scans_its_packages_and_added_ones(tmp_path, monkeypatch):
    (tmp_path / "widget_registry.py").write_text(
        "from harness.registry.core import Registry\n"
        "WIDGETS = Registry('widget', packages=('w_pkg',))"
    )
    pkg = tmp_path / "w_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_private.py").write_text("raise RuntimeError('underscore modules are not scanned')")
    (pkg / "one.py").write_text("from widget_registry import WIDGETS\nWIDGETS.register('w1', 1)")
    (pkg / "two.py").write_text("from widget_registry import WIDGETS\nWIDGETS.register('w2', 2)")
    monkeypatch.syspath_prepend(str(tmp_path))
    import widget_registry

    assert widget_registry.WIDGETS._items == {}  # nothing imported before the first lookup
    assert widget_registry.WIDGETS.names() == ["w1", "w2"]
    broken: Registry[int] = Registry("gadget", packages=("no_such_pkg_xyz",))
    with pytest.raises(RegistryError, match=r"gadget package 'no_such_pkg_xyz' cannot be imported"):
        broken.names()


def test_a_lookup_imports_only_the_module_named_like_the_entry(tmp_path, monkeypatch):
    """``get("alpha")`` imports ``g_pkg.alpha`` (and the $HARNESS_PLUGINS modules), not the
    package's other modules; a name no module is called like (``b2`` in ``beta``) takes the
    full scan, as does ``names()``."""
    (tmp_path / "gizmo_registry.py").write_text(
        "from harness.registry.core import Registry\n"
        "GIZMOS = Registry('gizmo', packages=('g_pkg',))"
    )
    pkg = tmp_path / "g_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "alpha.py").write_text("from gizmo_registry import GIZMOS\nGIZMOS.register('alpha', 1)")
    (pkg / "beta.py").write_text(
        "from gizmo_registry import GIZMOS\nGIZMOS.register('beta', 2)\nGIZMOS.register('b2', 3)"
    )
    (tmp_path / "gizmo_plugin.py").write_text(
        "from gizmo_registry import GIZMOS\nGIZMOS.register('plugged', 4)"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HARNESS_PLUGINS", "gizmo_plugin")
    monkeypatch.setattr("harness.registry.core._imported_plugins", set())
    import gizmo_registry

    gizmos = gizmo_registry.GIZMOS
    assert gizmos.get("alpha") == 1
    assert "g_pkg.alpha" in sys.modules and "g_pkg.beta" not in sys.modules
    assert gizmos.get("plugged") == 4 and "g_pkg.beta" not in sys.modules  # a plugin's name
    assert sorted(gizmos._items) == ["alpha", "plugged"]
    assert gizmos.get("b2") == 3  # registered by beta.py: found by the full scan
    assert gizmos.names() == ["alpha", "b2", "beta", "plugged"]
    with pytest.raises(UnknownNameError, match="Did you mean 'alpha'"):
        gizmos.get("alpah")
    for name in ("gizmo_registry", "gizmo_plugin", "g_pkg", "g_pkg.alpha", "g_pkg.beta"):
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_new_method_module_shows_in_ls_all_and_contract_tests(plugin_package):
    # harness ls: discovered without any list being edited
    out = _run("-m", "harness.cli", "ls")
    assert out.returncode == 0, out.stderr
    assert "toy_plugin" in out.stdout and "scale=1.0" in out.stdout
    # methods: [all] expands to every registered method that runs on the grid, the new one too
    out = _run(
        "-m", "harness.cli", "validate", "--skip-data", "-v", str(plugin_package / "plugin.yaml")
    )
    assert out.returncode == 0, out.stderr
    assert "digits/digits_cnn/toy_plugin(M=2)/seed0" in out.stdout
    assert "digits/digits_cnn/deep_ensemble(M=2)/seed0" in out.stdout
    assert "digits/digits_cnn/single(M=1)/seed0" in out.stdout  # fixed-size methods use theirs
    # the registry-parametrized method contract tests pick it up and pass
    for tests in ("tests/methods/test_methods.py", "tests/methods/test_method_contract.py"):
        out = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", tests, "-k", "toy_plugin")
        assert out.returncode == 0, out.stdout[-3000:]
        assert re.search(r"\b[1-9]\d* passed", out.stdout), out.stdout[-2000:]


def test_all_expands_in_process(plugin_package):
    from harness.config.parse import load_suite

    METHODS.add_package("toy_methods_pkg")
    try:
        suite = load_suite(plugin_package / "plugin.yaml")
        names = {m.name for m in suite.grid.methods}
        assert "toy_plugin" in names and {"single", "deep_ensemble"} <= names
        assert all(n in METHODS for n in names)
    finally:
        METHODS._packages.remove("toy_methods_pkg")
