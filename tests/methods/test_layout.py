"""``ls methods`` is the list of methods: every top-level module registers exactly one method,
and the machinery lives in private modules (``_base``, ``_sigma``, ``_sigma_public``,
``_triton``, ``_tu``) that the registry's scan skips."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import methods
from harness.registry import METHODS

FOLDER = Path(methods.__file__).parent


def registrations(path: Path) -> int:
    """Module-level ``register_method(...)`` calls in ``path``."""
    tree = ast.parse(path.read_text())
    return sum(
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "register_method"
        for node in tree.body
    )


def test_every_top_level_module_registers_exactly_one_method():
    public = [m.name for m in pkgutil.iter_modules([str(FOLDER)]) if not m.name.startswith("_")]
    counts = {name: registrations(FOLDER / f"{name}.py") for name in public}
    assert counts == dict.fromkeys(public, 1), counts
    ours = [n for n in METHODS.names() if METHODS.get(n).build.__module__.startswith("methods.")]
    assert sorted(public) == sorted(ours)  # and each module is named by its method


def test_machinery_is_private_and_registers_nothing():
    private = [m for m in pkgutil.iter_modules([str(FOLDER)]) if m.name.startswith("_")]
    assert {m.name for m in private} == {"_base", "_sigma", "_sigma_public", "_triton", "_tu"}
    for path in [*FOLDER.glob("_*.py"), *FOLDER.glob("_*/**/*.py")]:
        assert registrations(path) == 0, path
