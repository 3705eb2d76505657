"""Plugins from outside the package: an installed distribution's entry points and ``--plugin``
modules register methods that run in local worker processes (and Slurm tasks, when a local
cluster answers).

The plugin distribution is built in a temporary folder and ``pip install``ed with ``--target``
into another (put on ``PYTHONPATH``, where ``importlib.metadata`` finds its entry points), so the
shared virtual environment is never modified. Each ``harness`` runs in a fresh interpreter: a
registry reads entry points once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.registry.core import PLUGINS_ENV, RegistryError, load_plugins
from tests.conftest import REPO

PLUGIN_MODULE = """
\"\"\"A method defined outside the harness: a single network under another name.\"\"\"
from methods._base import MethodSpec, NoHparams, register_method
from methods.single import SingleModel

register_method(
    MethodSpec(
        name="{name}",
        build=lambda ctx, hp: SingleModel(ctx),
        hparams=NoHparams,
        min_members=1,
        max_members=1,
        reference="a plugin's method",
    )
)
"""

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "harness-test-plugin"
version = "0.1"

[tool.setuptools]
py-modules = ["harness_test_plugin"]

[project.entry-points."harness.methods"]
test_plugin = "harness_test_plugin"
"""

SUITE = """
name: plug
grid:
  datasets: [digits]
  backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
  seeds: [0, 1]
  methods: [{method}]
recipe: {{epochs: 1, batch_size: 128}}
evaluation: {{cost: false}}
"""


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory) -> Path:
    """The plugin distribution, pip-installed into its own --target folder."""
    src = tmp_path_factory.mktemp("plugin_src")
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "harness_test_plugin.py").write_text(PLUGIN_MODULE.format(name="entry_point_single"))
    target = tmp_path_factory.mktemp("plugin_site")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--target", str(target), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert list(target.glob("harness_test_plugin-0.1.dist-info/entry_points.txt"))
    return target


def harness(*args: str, pythonpath: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(REPO)])
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def run_in_workers(suite: Path, results: Path, pythonpath: list[Path], *extra: str) -> list[dict]:
    argv = ["run", str(suite), "--executor", "local", "--workers", "2", "--threads", "1", "-q"]
    out = harness(*argv, "--results", str(results), *extra, pythonpath=pythonpath, cwd=results)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "in 2 worker processes" in out.stdout
    return [json.loads(p.read_text()) for p in sorted(results.glob("plug/*/record.json"))]


@pytest.mark.slow
def test_entry_point_plugin_is_listed_and_runs_in_local_workers(installed_plugin, tmp_path):
    ls = harness("ls", pythonpath=[installed_plugin], cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    assert "entry_point_single" in ls.stdout and "a plugin's method" in ls.stdout

    suite = tmp_path / "plug.yaml"
    suite.write_text(SUITE.format(method="entry_point_single"))
    records = run_in_workers(suite, tmp_path, [installed_plugin])
    assert [r["config"]["method"] for r in records] == ["entry_point_single"] * 2
    assert all(r["status"] == "done" for r in records), [r["error"] for r in records]
    assert all(0 < r["metrics"]["clean"]["acc"] <= 1 for r in records)


@pytest.mark.slow
def test_plugin_option_module_runs_in_local_workers(tmp_path):
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "my_methods.py").write_text(PLUGIN_MODULE.format(name="option_single"))
    suite = tmp_path / "plug.yaml"
    suite.write_text(SUITE.format(method="option_single"))

    missing = harness("validate", str(suite), "--skip-data", pythonpath=[plugin_dir], cwd=tmp_path)
    assert missing.returncode == 2 and "unknown method 'option_single'" in missing.stderr

    # the workers import it only because the parent passes it on ($HARNESS_PLUGINS)
    records = run_in_workers(suite, tmp_path, [plugin_dir], "--plugin", "my_methods")
    assert [r["config"]["method"] for r in records] == ["option_single"] * 2
    assert all(r["status"] == "done" for r in records), [r["error"] for r in records]


def test_load_plugins_sets_the_environment_and_names_a_bad_module(monkeypatch, tmp_path):
    # setenv (not delenv) so that teardown removes what load_plugins writes: a leaked
    # $HARNESS_PLUGINS would make every later subprocess import a module it cannot find.
    monkeypatch.setenv(PLUGINS_ENV, "")
    monkeypatch.setattr("harness.registry.core._imported_plugins", set())
    (tmp_path / "empty_plugin.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugins(["empty_plugin"])
    assert os.environ[PLUGINS_ENV] == "empty_plugin"
    assert sys.modules["empty_plugin"].LOADED is True
    with pytest.raises(RegistryError, match=r"^plugin module 'no_such_plugin' cannot be imported"):
        load_plugins(["no_such_plugin"])
    assert os.environ[PLUGINS_ENV] == "empty_plugin"  # a module that failed is not passed on


def test_slurm_profile_exports_the_plugins(monkeypatch):
    from harness.executors.slurm.executor import with_plugins
    from harness.executors.slurm.profile import load_profile

    monkeypatch.setenv(PLUGINS_ENV, "a_mod,b mod")
    profile = with_plugins(load_profile(None, []))
    assert profile.setup[-1] == f"export {PLUGINS_ENV}='a_mod,b mod'"
    assert profile.executor_parameters()["slurm_setup"][-1] == profile.setup[-1]
    monkeypatch.delenv(PLUGINS_ENV)
    assert with_plugins(load_profile(None, [])) == load_profile(None, [])


def test_cli_names_a_plugin_that_cannot_be_imported(tmp_path):
    out = harness("ls", "--plugin", "nope_plugin", pythonpath=[], cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: plugin module 'nope_plugin' cannot be imported: No module named 'nope_plugin'"
    ]
    assert out.stdout == ""


@pytest.mark.slurm
def test_plugins_run_in_a_slurm_task(slurm_env, installed_plugin, tmp_path):
    """Both kinds in one array on the local cluster: the entry-point method (found through the
    task's PYTHONPATH) and the --plugin module (imported because the job script exports it)."""
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "my_methods.py").write_text(PLUGIN_MODULE.format(name="option_single"))
    suite = tmp_path / "plug.yaml"
    suite.write_text(
        SUITE.format(method="entry_point_single, option_single").replace("[0, 1]", "[0]")
    )
    argv = ["run", str(suite), "--executor", "slurm", "--profile", "local", "--wait", "-q"]
    out = harness(
        *argv,
        "--plugin",
        "my_methods",
        "--results",
        str(tmp_path / "r"),
        pythonpath=[installed_plugin, plugin_dir],
        cwd=tmp_path,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("r/plug/*/record.json"))]
    assert sorted(r["config"]["method"] for r in records) == ["entry_point_single", "option_single"]
    assert all(r["status"] == "done" for r in records), [r["error"] for r in records]
    script = next((tmp_path / "r" / "plug" / "_slurm").rglob("*_submission.sh")).read_text()
    assert f"export {PLUGINS_ENV}=my_methods" in script
