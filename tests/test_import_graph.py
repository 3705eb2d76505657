"""The one-way architecture, checked on the import graph read with ``ast``.

Every ``import`` and ``from ... import`` of harness/, methods/, reports/ and slurm/ counts, at
module level and inside functions (a function-level import is still a dependency; it only runs
later). Imports under ``if TYPE_CHECKING:`` are left out: they never run. The layers:

    contract (harness.contract)  ←  parser, engine, executors, reporter
    engine below the runner (train, evaluate, cost, data, metrics, methods, runner)
    executors (harness.executors, harness.dispatch, slurm)  →  runner
    CLI (harness.cli)  →  executors, reporter
    reporter (reports)  →  contract only
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("harness", "methods", "reports", "slurm")
CONTRACT_THIRD_PARTY = {"yaml"}  # parse_name_values reads YAML scalars (lazily imported)
BELOW_RUNNER = (
    "harness.train",
    "harness.evaluate",
    "harness.cost",
    "harness.data",
    "harness.metrics",
    "harness.runner",
    "methods",
)
ABOVE_RUNNER = ("harness.executors", "harness.dispatch", "harness.cli", "reports")
ENGINE = ("harness", "methods")  # reports may use harness.contract only


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the statements inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(path: Path, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module ``path`` imports (project modules fully qualified, others by top name)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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
        module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
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


def _in(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses a layer the wrong way, as ``importer -> imported: rule``."""
    stdlib = set(sys.stdlib_module_names)
    out = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            top = dep.split(".")[0]
            if _in(mod, ["harness.contract"]):
                project = (
                    top in PACKAGES and not _in(dep, ["harness.contract"]) and dep != "harness"
                )
                foreign = top not in PACKAGES and top not in stdlib and top != "__future__"
                if project or (foreign and top not in CONTRACT_THIRD_PARTY):
                    out.append(f"{mod} -> {dep}: the contract layer imports only the stdlib")
            if _in(mod, ["reports"]):
                engine = (
                    _in(dep, ENGINE) and not _in(dep, ["harness.contract"]) and dep != "harness"
                )
                if engine or top == "torch":
                    out.append(f"{mod} -> {dep}: the reporter imports only the contract layer")
            if _in(mod, ["slurm", "harness.executors", "harness.dispatch"]) and _in(
                dep, ["harness.cli"]
            ):
                out.append(f"{mod} -> {dep}: executors never import the CLI")
            if _in(mod, BELOW_RUNNER) and _in(dep, ABOVE_RUNNER):
                out.append(f"{mod} -> {dep}: the engine never imports executors, CLI or reports")
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(REPO)


def test_graph_reads_function_level_and_relative_imports(graph):
    # Function-level imports count: the CLI imports the executors only inside cmd_run.
    assert "harness.executors" in graph["harness.cli"]
    assert "harness.contract.build" in graph["harness.contract.config"]
    assert "torch" in graph["harness.runner"] and "methods.base" in graph["harness.runner"]
    # TYPE_CHECKING imports never run: the registries do not depend on methods.base.
    assert "methods.base" not in graph["harness.registries"]


def test_checker_finds_a_planted_cycle_and_each_forbidden_import(tmp_path):
    files = {
        "harness/__init__.py": "",
        "harness/contract/__init__.py": "import torch\nfrom harness import runner\n",
        "harness/runner.py": "def f():\n    from reports import page\n",
        "harness/cli.py": "from slurm import sub\n",
        "reports/__init__.py": "",
        "reports/page.py": "import torch\nfrom harness.train import x\n",
        "slurm/__init__.py": "",
        "slurm/sub.py": "def g():\n    from harness.cli import main\n",
        "methods/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph(tmp_path)
    assert cycles(g) == [["harness.cli", "slurm.sub"]]
    assert violations(g) == [
        "harness.contract -> harness.runner: the contract layer imports only the stdlib",
        "harness.contract -> torch: the contract layer imports only the stdlib",
        "harness.runner -> reports.page: the engine never imports executors, CLI or reports",
        "reports.page -> harness.train: the reporter imports only the contract layer",
        "reports.page -> torch: the reporter imports only the contract layer",
        "slurm.sub -> harness.cli: executors never import the CLI",
    ]


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_every_import_goes_one_way(graph):
    assert violations(graph) == []


def test_reading_results_never_imports_torch_or_methods():
    code = (
        "import sys, reports, reports.leaderboard, reports.terminal, reports.aggregate\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'methods')"
        " or (m.startswith('harness.') and not m.startswith('harness.contract')))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
