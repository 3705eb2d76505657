"""The one-way architecture, checked on the import graph read with ``ast``.

A module's layer is the folder it lives in (:data:`LAYERS`: ``harness/engine/…`` is the engine,
``methods/…`` a component); every import of harness/, methods/ and reports/ counts, at module
level, inside functions (a function-level import is still a dependency; it only runs later),
under ``if TYPE_CHECKING:`` (a type a layer names is a type it depends on) and as a string
handed to the import machinery (``importlib.import_module("harness.x")`` and the
``"harness.x:name"`` strings the executor and command tables resolve). The graph must have no
cycle, and each layer imports only the layers :data:`MAY_IMPORT` gives it (docs/architecture.md
says why).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("harness", "methods", "reports")
#: parse_name_values reads YAML scalars (lazily imported); fastjson parses with orjson where it
#: is installed (the standard library otherwise).
CONTRACT_THIRD_PARTY = {"yaml", "orjson"}

#: Folder (as a module prefix) → layer. Every module of harness/ but its __init__ lives in one.
LAYERS = {
    "harness.contract": "contract",
    "harness.registry": "registry",
    "harness.storage": "storage",
    "harness.backbones": "components",
    "harness.data": "components",
    "harness.metrics": "components",
    "methods": "components",
    "harness.config": "config",
    "harness.engine": "engine",
    "harness.executors": "executors",
    "harness.session": "session",
    "harness.plugins": "plugins",
    "reports": "reporter",
    "harness.cli": "cli",
    "harness.api": "api",
}

#: Layer → the other layers it may import (a layer may always import itself).
MAY_IMPORT = {
    "contract": set(),
    "registry": {"contract"},
    "storage": {"contract", "registry"},
    "components": {"contract", "registry", "storage"},
    "config": {"contract", "registry", "storage", "components"},
    "engine": {"contract", "registry", "storage", "components"},
    "executors": {"contract", "registry", "storage", "config", "engine"},
    # The run layer below both faces: check, run, plan; it prints nothing and renders nothing.
    "session": {"contract", "registry", "storage", "components", "config", "engine", "executors"},
    "reporter": {"contract", "registry"},
    "cli": {
        "contract",
        "registry",
        "storage",
        "components",
        "config",
        "engine",
        "executors",
        "session",
        "reporter",
    },
    # The Python face: the run layer and the reporter's readers, as functions (harness/api/);
    # never the command line, which is a rendering of the same results.
    "api": {
        "contract",
        "registry",
        "storage",
        "components",
        "config",
        "engine",
        "executors",
        "session",
        "reporter",
    },
    # The extension face (harness.plugins): re-exports what a plugin registers and the types it
    # builds, from the layers that define them; nothing imports it.
    "plugins": {"contract", "registry", "storage", "components", "executors", "reporter"},
}

#: The command line is a top: no module outside harness/cli imports it (the faces share the run
#: layer, harness.session, and the command line renders its results).
CLI = "harness.cli"

#: Layer → third-party packages it never imports: the engine runs one cell in this process, so
#: the scheduler's library (submitit) is the executors' alone, like starting processes.
NEVER_IMPORTS = {"engine": {"submitit"}}

#: ``"package.module:attribute"``: a name resolved with importlib by a table of the project.
_TARGET = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)*):\w+$")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The layer of a project module, from its folder (the longest matching prefix)."""
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, layer)
    return best[1] if best else None


def _string_imports(node: ast.AST, known: set[str]) -> set[str]:
    """Modules named by strings: ``import_module("m")`` and ``"m:attr"`` constants."""
    out: set[str] = set()
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        arg = node.args[0] if node.args else None
        if name == "import_module" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        m = _TARGET.match(node.value)
        if m and m.group(1) in known:
            out.add(m.group(1))
    return out


def imports_of(path: Path, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module ``path`` imports (project modules fully qualified, others by top name)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        out |= _string_imports(node, known)
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return out


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Module → imported modules, for every ``.py`` file of ``packages`` under ``root``."""
    files = {
        module_name(p, root): p
        for pkg in packages
        if (root / pkg).is_dir()
        for p in sorted((root / pkg).rglob("*.py"))
    }
    known = set(files)
    return {
        mod: imports_of(path, mod, path.name == "__init__.py", known) for mod, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a self-import): Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses a layer the wrong way, as ``importer -> imported: rule``."""
    stdlib = set(sys.stdlib_module_names)
    out = []
    for mod, deps in sorted(graph.items()):
        layer = layer_of(mod)
        if layer is None:
            if mod not in PACKAGES:  # a package's own __init__ belongs to no layer
                out.append(f"{mod}: in no layer's folder (see LAYERS)")
            continue
        for dep in sorted(deps):
            top = dep.split(".")[0]
            if (dep == CLI or dep.startswith(CLI + ".")) and layer != "cli":
                out.append(f"{mod} -> {dep}: only harness/cli imports the command line")
            elif top in PACKAGES:
                target = layer_of(dep)
                if target is not None and target != layer and target not in MAY_IMPORT[layer]:
                    out.append(
                        f"{mod} -> {dep}: the {layer} layer never imports the {target} layer"
                    )
            elif layer == "contract" and top not in stdlib and top != "__future__":
                if top not in CONTRACT_THIRD_PARTY:
                    out.append(f"{mod} -> {dep}: the contract layer imports only the stdlib")
            elif layer == "reporter" and top == "torch":
                out.append(f"{mod} -> {dep}: the reporter never imports torch")
            elif top in NEVER_IMPORTS.get(layer, ()):
                out.append(f"{mod} -> {dep}: the {layer} layer never imports {top}")
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(REPO)


def test_graph_reads_function_level_type_checking_and_string_imports(graph):
    # Function-level imports count: the run command imports the run layer's runner only inside
    # cmd_run, the run layer the executors only inside run_suite.
    assert "harness.session.run" in graph["harness.cli.run"]
    assert "harness.executors" in graph["harness.session.run"]
    assert "harness.contract.build" in graph["harness.contract.config"]
    assert {"torch", "methods._base"} <= graph["harness.engine.runner"]
    # TYPE_CHECKING imports count: the backbones name torch's nn only for a type.
    assert "torch" in graph["harness.backbones"]
    # Strings resolved by importlib count: the executor table and the command table.
    assert "harness.executors.slurm.executor" in graph["harness.executors"]
    assert "harness.cli.run" in graph["harness.cli.parser"]


def test_every_module_of_harness_is_in_a_layer_folder():
    top = sorted(p.name for p in (REPO / "harness").glob("*.py"))
    assert top == ["__init__.py"]
    folders = {p.name for p in (REPO / "harness").iterdir() if (p / "__init__.py").is_file()}
    assert {f"harness.{f}" for f in folders} <= set(LAYERS)


def test_checker_finds_a_planted_cycle_and_each_forbidden_import(tmp_path):
    files = {
        "harness/__init__.py": "",
        "harness/contract/__init__.py": "import torch\nfrom harness.engine import runner\n",
        "harness/engine/__init__.py": "",
        "harness/engine/runner.py": "def f():\n    from reports import page\n    import submitit\n",
        "harness/cli/__init__.py": "TABLE = {'x': 'harness.executors.sub:Thing'}\n",
        "harness/executors/__init__.py": "",
        "harness/api/__init__.py": "def run():\n    from harness.cli.run import run_suite\n",
        "harness/cli/run.py": "",
        "harness/executors/sub.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness import cli\n"
        ),
        "harness/storage/__init__.py": "import importlib\nimportlib.import_module('methods.m')\n",
        "harness/loose.py": "",
        "reports/__init__.py": "",
        "reports/page.py": "import torch\nfrom harness.engine.train import x\n",
        "methods/__init__.py": "",
        "methods/m.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph(tmp_path)
    assert cycles(g) == [["harness.cli", "harness.executors.sub"]]
    assert violations(g) == [
        "harness.api -> harness.cli.run: only harness/cli imports the command line",
        "harness.contract -> harness.engine.runner: the contract layer never imports the engine "
        "layer",
        "harness.contract -> torch: the contract layer imports only the stdlib",
        "harness.engine.runner -> reports.page: the engine layer never imports the reporter layer",
        "harness.engine.runner -> submitit: the engine layer never imports submitit",
        "harness.executors.sub -> harness.cli: only harness/cli imports the command line",
        "harness.loose: in no layer's folder (see LAYERS)",
        "harness.storage -> methods.m: the storage layer never imports the components layer",
        "reports.page -> harness.engine.train: the reporter layer never imports the engine layer",
        "reports.page -> torch: the reporter never imports torch",
    ]


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def folder_of(module: str) -> str:
    """The folder a module lives in, two levels deep (``harness.data._machinery.loader`` →
    ``harness.data``, ``methods._triton.sigma_bn`` → ``methods._triton``); a module at a
    package's top level is a node of its own (``reports.columns``, ``methods.sigma_ens``)."""
    return ".".join(module.split(".")[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder → folders it imports (a module importing its own folder is not an edge)."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        here = folder_of(mod)
        out.setdefault(here, set())
        out[here] |= {folder_of(d) for d in deps if d in graph and folder_of(d) != here}
    return out


def test_folder_checker_finds_two_folders_importing_each_other(tmp_path):
    files = {
        "harness/__init__.py": "",
        "harness/data/__init__.py": "",
        "harness/data/a.py": "def f():\n    from harness.backbones import b\n",
        "harness/backbones/__init__.py": "",
        "harness/backbones/b.py": "from harness.data import c\n",
        "harness/data/c.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph(tmp_path)
    assert cycles(g) == []  # no module-level cycle ...
    assert cycles(folder_graph(g)) == [["harness.backbones", "harness.data"]]  # ... a folder one


def test_no_folder_imports_a_folder_that_imports_it_back(graph):
    """Folders are layers within layers (docs/architecture.md): harness/data must not import
    harness/backbones while backbones imports data, reports/records not reports/stats while
    stats imports records; shared constants live a level down (reports/columns.py)."""
    assert cycles(folder_graph(graph)) == []


def test_every_import_goes_one_way(graph):
    assert violations(graph) == []


def test_reading_results_never_imports_torch_or_methods():
    code = (
        "import sys, reports, reports.render.leaderboard, reports.render.terminal\n"
        "import reports.records.index, reports.figures.draw, reports.render.latex\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'methods')"
        " or (m.startswith('harness.')"
        " and not m.startswith(('harness.contract', 'harness.registry'))))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_engine_runs_one_cell_and_takes_no_runner_as_a_callback():
    """No function of harness/engine takes ``run_cell`` (or a ``run`` callable standing for it)
    as a parameter, and none passes it on: the runner trains a conversion's `single`
    cell by calling itself, and starting the ranks of a multi-process cell is the executors'."""
    found = []
    for path in sorted((REPO / "harness" / "engine").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
                if names & {"run_cell", "run"}:
                    found.append(f"{path.name}:{node.lineno} parameter {sorted(names)}")
            if isinstance(node, ast.Call):
                args = [*node.args, *(k.value for k in node.keywords)]
                if any(isinstance(x, ast.Name) and x.id == "run_cell" for x in args):
                    found.append(f"{path.name}:{node.lineno} passes run_cell on")
                if any(
                    isinstance(x, ast.Lambda)
                    and any(isinstance(n, ast.Name) and n.id == "run_cell" for n in ast.walk(x))
                    for x in args
                ):
                    found.append(f"{path.name}:{node.lineno} passes run_cell in a lambda")
    assert found == []
