"""Size flags that keep a module readable in one sitting: no module over ~600 lines, no function
over 80 lines unless a ``# Length:`` comment in it says why its length is earned. Length is a smell
to look at, not a cap to split against: a module is never cut mid-responsibility to fit it."""

from __future__ import annotations

import ast

from tests.conftest import REPO

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sizes() -> tuple[list[str], list[str]]:
    modules, functions = [], []
    for pkg in ("harness", "methods", "reports"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            text = path.read_text()
            lines = text.splitlines()
            if len(lines) > MAX_MODULE_LINES:
                modules.append(f"{rel}: {len(lines)} lines")
            for node in ast.walk(ast.parse(text)):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                body = lines[node.lineno - 1 : node.end_lineno]
                long = len(body) > MAX_FUNCTION_LINES
                if long and not any(line.strip().startswith("# Length:") for line in body):
                    functions.append(f"{rel}::{node.name}")
    return modules, functions


def test_no_module_over_600_lines_and_no_unexplained_long_function():
    modules, functions = _sizes()
    assert modules == []
    assert functions == []
