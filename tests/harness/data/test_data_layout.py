"""``ls harness/data`` is the list of dataset modules: every top-level module registers at least
one dataset, and the machinery they share (specs, loaders, corruptions, downloads) lives in the
private package ``_machinery``, which the registry's scan skips and which registers nothing."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import harness.data
from harness.registry import DATASETS

FOLDER = Path(harness.data.__file__).parent


def registrations(path: Path) -> int:
    """Calls of ``register_dataset(...)`` anywhere in ``path`` (a module may register in a loop
    or through a function it calls at import)."""
    tree = ast.parse(path.read_text())
    return sum(
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_dataset"
        for node in ast.walk(tree)
    )


def test_every_top_level_module_registers_a_dataset():
    public = [m.name for m in pkgutil.iter_modules([str(FOLDER)]) if not m.name.startswith("_")]
    assert public, FOLDER
    counts = {name: registrations(FOLDER / f"{name}.py") for name in public}
    assert all(counts.values()), counts
    # ... and at import: the registered datasets' loaders come from exactly these modules.
    ours = {
        DATASETS.get(n).load.__module__
        for n in DATASETS.names()
        if DATASETS.get(n).load.__module__.startswith("harness.data.")
    }
    assert ours == {f"harness.data.{name}" for name in public}


def test_machinery_is_private_and_registers_nothing():
    private = [m for m in pkgutil.iter_modules([str(FOLDER)]) if m.name.startswith("_")]
    assert [(m.name, m.ispkg) for m in private] == [("_machinery", True)]
    modules = sorted((FOLDER / "_machinery").rglob("*.py"))
    assert modules, "no machinery found"
    for path in modules:
        assert registrations(path) == 0, path
    defined_in = {DATASETS.get(n).load.__module__ for n in DATASETS.names()}
    assert not any(m.startswith("harness.data._") for m in defined_in), defined_in
