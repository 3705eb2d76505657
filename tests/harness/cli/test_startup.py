"""Start-up cost: what the quick commands import, and the ``harness ls`` listing cache.

Times are measured in docs/benchmarks.md, not asserted (a loaded machine would fail them); the
tests check what makes them small: ``--help`` imports neither torch nor any engine module, a
worker's runner imports no torchmetrics before it evaluates, and ``ls`` is read from its cache
until a file it was computed from changes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.cli import main
from harness.cli.ls import executors_text, listing_key
from harness.registry import METHODS
from harness.registry.core import Registry
from tests.conftest import REPO


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.mark.slow  # starts interpreters
def test_help_and_the_runner_import_only_what_they_need():
    helped = _modules_after(
        "from harness.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert not {m for m in helped if m.split(".")[0] in ("torch", "yaml", "numpy", "pandas")}
    assert not {m for m in helped if m.startswith(("harness.engine", "harness.config"))}
    runner = _modules_after("import harness.engine.runner")
    assert "torch" in runner
    assert not {m for m in runner if m.split(".")[0] in ("torchmetrics", "transformers", "scipy")}


@pytest.mark.slow  # starts interpreters
def test_validate_and_a_cells_lookups_import_only_what_they_need(tmp_path, monkeypatch):
    """A warm ``validate`` of the smoke suite imports no torch-uncertainty (nor lightning or
    torchmetrics, which it pulls in); looking up one method imports that method's module only."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    validate = (
        "from harness.cli import main\n"
        "assert main(['validate', 'suites/smoke.yaml', '--skip-data']) == 0"
    )
    cold = _modules_after(validate)  # fills the cache of which transforms build here
    assert "torch_uncertainty" in cold
    warm = _modules_after(validate)
    heavy = ("torch_uncertainty", "lightning", "torchmetrics", "scipy", "transformers")
    assert not {m for m in warm if m.split(".")[0] in heavy}
    looked_up = _modules_after(
        "from harness.registry import METHODS\nassert METHODS.get('sigma_ens').name == 'sigma_ens'"
    )
    methods = {m for m in looked_up if m.startswith("methods.")}
    assert "methods.sigma_ens" in methods
    assert not methods & {"methods.single", "methods.mimo", "methods.batch_ensemble"}
    assert not {m for m in looked_up if m.split(".")[0] in heavy}


def test_ls_is_listed_from_its_cache_until_a_source_changes(tmp_path, monkeypatch, capsys):
    """As in a fresh process: registries not loaded yet (then restored as they were)."""
    from harness.registry import BACKBONES, DATASETS, METRICS

    for registry in (METHODS, BACKBONES, DATASETS, METRICS):
        monkeypatch.setattr(registry, "loaded", lambda: False)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["ls"]) == 0
    first = capsys.readouterr().out
    assert "methods:" in first and "sigma_ens" in first and "\nmetrics:\n  acc " in first
    (cached,) = (tmp_path / "cache" / "ls").glob("*.txt")
    assert first == cached.read_text() + executors_text()  # executors: listed, not cached
    assert executors_text().startswith("executors:\n  auto ")

    def no_import():
        raise AssertionError("the registries were scanned")

    monkeypatch.setattr(METHODS, "_load", no_import)
    assert main(["ls"]) == 0
    assert capsys.readouterr().out == first
    # Once this process holds registrations of its own, they are listed, not the cache.
    monkeypatch.undo()
    METHODS.names()
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        METHODS, "_items", {**METHODS._items, "in_process_only": METHODS.get("single")}
    )
    assert main(["ls"]) == 0
    assert "in_process_only" in capsys.readouterr().out
    # A plugin module is one more source: a new key, so the cache is not used.
    (tmp_path / "ls_plugin.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    key = listing_key()
    monkeypatch.setenv("HARNESS_PLUGINS", "ls_plugin")
    assert listing_key() != key


def test_the_listing_key_follows_the_private_corruption_set_table(monkeypatch):
    """The corruption-set block comes from ``harness/data/_machinery/``, which no registry scans:
    the key names that module itself, so editing it is a new key too."""
    import harness.registry.core as core
    from harness.cli.ls import CORRUPTION_SETS

    real = core.module_file_state
    assert real(CORRUPTION_SETS)[1:] != (-1, -1)  # the name still points at a file
    key = listing_key()
    edited = lambda m: (m, 1, 2) if m == CORRUPTION_SETS else real(m)  # noqa: E731
    monkeypatch.setattr(core, "module_file_state", edited)
    assert listing_key() != key


def test_a_registry_s_sources_change_when_a_module_of_its_package_does(tmp_path, monkeypatch):
    pkg = tmp_path / "src_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("X = 1\n")
    (pkg / "_private.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[object] = Registry("thing", packages=("src_pkg",))
    before = registry.sources()
    assert [p.rsplit("/", 1)[-1] for p, _, _ in before] == ["one.py", "__init__.py"]
    (pkg / "one.py").write_text("X = 22\n")  # a different size, whatever the clock's resolution
    (pkg / "two.py").write_text("")
    after = registry.sources()
    assert [p.rsplit("/", 1)[-1] for p, _, _ in after] == ["one.py", "two.py", "__init__.py"]
    assert after[0] != before[0]
    assert "src_pkg" not in sys.modules or not hasattr(sys.modules["src_pkg"], "one")
