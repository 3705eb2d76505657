"""What a user copies imports only public modules (issue 60, item 2): every ```python block of
docs/*.md and README.md and every examples/*.py is parsed, and an import of a module path with
a private component (``methods._base``, ``harness.data._machinery``, ``from x import _y``)
fails the test, naming the file and line. ``__future__`` and other dunder names are public."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

#: A fenced Python block of a Markdown file: its first line's number and its text.
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__"))
               for p in dotted.split("."))  # fmt: skip


def private_imports(source: str) -> list[tuple[int, str]]:
    """(line, module path) of every import of a private module or name in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            paths = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            paths = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"] or [base]
        else:
            continue
        found += [(node.lineno, p) for p in paths if _private(p.lstrip("."))]
    return found


def python_sources() -> list[tuple[str, int, str]]:
    """(file, first line, source) of every Python block of the docs and README, and of every
    example script."""
    out = []
    for path in [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            first = text.count("\n", 0, m.start(1)) + 1
            out.append((str(path.relative_to(REPO)), first, m.group(1)))
    for path in sorted((REPO / "examples").glob("*.py")):
        out.append((str(path.relative_to(REPO)), 1, path.read_text(encoding="utf-8")))
    return out


def test_the_checker_finds_private_modules_and_names():
    source = (
        "from __future__ import annotations\nimport harness.api as h\n"
        "from methods._base import MethodSpec\nimport harness.data._machinery.base\n"
        "from harness.backbones import _weights\nfrom harness.plugins import MethodSpec\n"
    )
    assert private_imports(source) == [
        (3, "methods._base.MethodSpec"),
        (4, "harness.data._machinery.base"),
        (5, "harness.backbones._weights"),
    ]


def test_docs_readme_and_examples_import_only_public_modules():
    sources = python_sources()
    assert any(name == "README.md" for name, _, _ in sources)
    assert any(name.startswith("examples/") for name, _, _ in sources)
    bad = []
    for name, first, source in sources:
        try:
            found = private_imports(source)
        except SyntaxError as exc:  # a ```python block must be Python
            bad.append(f"{name}:{first + (exc.lineno or 1) - 1}: not Python ({exc.msg})")
            continue
        bad += [f"{name}:{first + line - 1}: imports {path}" for line, path in found]
    assert bad == []


def test_every_file_example_of_the_architecture_doc_is_found():
    """The seven one-file examples (a method … a metric) are Python blocks of the doc."""
    files = [
        source.splitlines()[0]
        for name, _, source in python_sources()
        if name == str(Path("docs") / "architecture.md") and source.startswith("# my_")
    ]
    assert [f.split(" ")[1] for f in files] == [
        "my_method.py", "my_backbone.py", "my_dataset.py", "my_executor.py", "my_tracker.py",
        "my_figure.py", "my_metric.py",
    ]  # fmt: skip


#: The examples a user copies to bring the benchmark into a loop of their own (issue 60 item 3):
#: the harness only through ``harness.api``, besides torch, NumPy, scikit-learn and the standard
#: library.
API_ONLY = ("own_training_loop.py", "evaluate_your_model.py")
THIRD_PARTY = {"torch", "numpy", "sklearn"}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of ``source`` (``from x import y``: ``x``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_the_own_loop_and_evaluate_examples_use_only_harness_api():
    import sys

    bad = []
    for name in API_ONLY:
        source = (REPO / "examples" / name).read_text(encoding="utf-8")
        assert private_imports(source) == [], name
        for line, module in imported_modules(source):
            top = module.split(".")[0]
            allowed = (module == "harness.api" or top in THIRD_PARTY
                       or top in sys.stdlib_module_names)  # fmt: skip
            if not allowed:
                bad.append(f"examples/{name}:{line}: imports {module}")
    assert bad == []
    # and each uses the data face (the benchmark's splits, not a copy of its own)
    for name in API_ONLY:
        assert "h.data(" in (REPO / "examples" / name).read_text(encoding="utf-8"), name
