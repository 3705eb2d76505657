"""Command-line ``key=value`` overrides of a suite, and the ``--only`` cell filter.

An override is applied to the suite's raw YAML mapping (after ``include:`` composition, before
validation), so it goes through exactly the checks a YAML edit would, and every problem it causes
is reported as ``override KEY=VALUE: <problem>``.

Addressing (``KEY`` is a dotted path; ``VALUE`` is read with ``yaml.safe_load``):

=============================================== ===============================================
``recipe.epochs=1``                             a mapping entry (missing mappings are created)
``grid.seeds=[0,1]``, ``evaluation.ood=[]``     a whole list
``grid.methods.sigma_ens.hparams.tau=0.5``      the entry of a list whose name is ``sigma_ens``
                                                (a bare name ``- sigma_ens`` becomes a mapping)
``grid.backbones[0].kwargs.widen=2``            a list entry by position
``recipe={epochs: 3, lr: 0.1}``                 a mapping merges into the mapping there, as
                                                ``include:`` does (keys it does not name stay)
=============================================== ===============================================

``--only`` keeps the cells matching every ``KEY=VALUE`` condition (comma-separated, repeatable;
several values of one key are alternatives): keys ``method``, ``M``, ``seed``, ``dataset``,
``backbone`` or a hyper-parameter name, e.g. ``--only method=sigma_ens,seed=0``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from harness.config.includes import SuiteError, merge_mappings
from harness.contract import Cell, closest

__all__ = ["CellFilter", "apply_overrides", "parse_assignment", "split_conditions"]

_INDEX = re.compile(r"^(?P<key>[^\[\]]*)\[(?P<index>-?\d+)\]$")


def parse_assignment(text: str, what: str = "override") -> tuple[str, Any]:
    """``'a.b=[1, 2]'`` → ``('a.b', [1, 2])``; the value is read as YAML.

    Raises:
        SuiteError: no ``=``, an empty key, or a value that is not valid YAML.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        example = {"--slurm": "partition=gpu", "--only": "method=single"}.get(
            what, "recipe.epochs=1"
        )
        raise SuiteError([f"{what} {text}: expected KEY=VALUE, e.g. {example}"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        raise SuiteError([f"{what} {text}: invalid YAML value: {problem}"]) from None
    return key, value


def _entry_name(item: Any) -> Any:
    return item if isinstance(item, str) else item.get("name") if isinstance(item, dict) else None


def _step(node: Any, segment: str, text: str, done: str) -> tuple[Any, Any, str]:
    """Resolve one path segment inside ``node``: (container, key or index, canonical path)."""
    m = _INDEX.match(segment)
    if m:
        key, index = m["key"], int(m["index"])
        if key:  # "backbones[0]": the mapping entry, then the position in it
            container, k, done = _step(node, key, text, done)
            node = container.setdefault(k, []) if isinstance(container, dict) else container[k]
        if not isinstance(node, list):
            raise SuiteError([f"override {text}: {done} is not a list"])
        if not -len(node) <= index < len(node):
            raise SuiteError([f"override {text}: {done} has {len(node)} entries, no index {index}"])
        return node, index % len(node), f"{done}[{index % len(node)}]"
    if isinstance(node, dict):
        return node, segment, f"{done}.{segment}" if done else segment
    if isinstance(node, list):  # an entry chosen by name: grid.methods.sigma_ens
        for i, item in enumerate(node):
            if _entry_name(item) == segment:
                if isinstance(item, str):
                    node[i] = {"name": item}  # so keys can be set under it
                return node, i, f"{done}[{i}]"
        names = ", ".join(str(_entry_name(i)) for i in node) or "none"
        raise SuiteError([f"override {text}: {done} has no entry named {segment!r} ({names})"])
    raise SuiteError([f"override {text}: {done} is {node!r}, not a mapping or a list"])


def apply_one(data: dict[str, Any], text: str) -> str:
    """Apply the override ``text`` to ``data`` in place; returns its canonical key path (list
    entries by position, the form validation messages use)."""
    key, value = parse_assignment(text)
    segments = key.split(".")
    if any(not s for s in segments):
        raise SuiteError([f"override {text}: empty segment in key {key!r}"])
    node: Any = data
    done = ""
    for i, segment in enumerate(segments):
        container, k, done = _step(node, segment, text, done)
        if i == len(segments) - 1:
            here = container.get(k) if isinstance(container, dict) else container[k]
            if isinstance(value, dict) and isinstance(here, dict):
                # Merged, not replaced: `recipe={epochs: 3}` replacing the block dropped the
                # suite's (and its includes') batch size, lr and schedule without a word.
                value = merge_mappings(here, value)
            container[k] = value
        else:
            child = container.get(k) if isinstance(container, dict) else container[k]
            if child is None and isinstance(container, dict):
                child = container[k] = {}  # recipe.lr=0.1 on a suite without a recipe block
            elif isinstance(child, str) and isinstance(container, list):
                child = container[k] = {"name": child}  # "- digits_cnn" gets keys set under it
            node = child
    return done


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, str]:
    """Apply every override in order (a later one wins); returns canonical path → override text.

    Raises:
        SuiteError: every override that cannot be applied, each naming itself.
    """
    applied: dict[str, str] = {}
    problems: list[str] = []
    for text in overrides:
        try:
            applied[apply_one(data, text)] = text
        except SuiteError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SuiteError(problems)
    return applied


def override_of(key: str, applied: dict[str, str]) -> tuple[str, str] | None:
    """The override that set ``key`` or its nearest ancestor: (its canonical path, its text)."""
    while key:
        if key in applied:
            return key, applied[key]
        if key.endswith("]"):
            key = key[: key.rindex("[")]
        elif "." in key:
            key = key.rsplit(".", 1)[0]
        else:
            return None
    return None


# --- --only ------------------------------------------------------------------------------------

_CELL_KEYS = ("method", "M", "seed", "dataset", "backbone")


def split_conditions(text: str) -> list[str]:
    """Split on commas outside brackets: ``'tau=[1,2],seed=0'`` → ``['tau=[1,2]', 'seed=0']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


class CellFilter:
    """The ``--only`` conditions: every key must match; several values of a key are alternatives."""

    def __init__(self, options: Iterable[str]) -> None:
        self.conditions: dict[str, list[Any]] = {}
        self.texts = list(options)
        problems = []
        for text in self.texts:
            parts = split_conditions(text)
            if not parts:  # `--only ,` or `--only ""` would otherwise select the whole grid
                problems.append(
                    f"--only {text!r}: empty filter; give KEY=VALUE, e.g. method=single"
                )
            for part in parts:
                try:
                    key, value = parse_assignment(part, "--only")
                except SuiteError as exc:
                    problems += exc.problems
                    continue
                self.conditions.setdefault(key.removeprefix("hparams."), []).append(value)
        if problems:
            raise SuiteError(problems)

    def __bool__(self) -> bool:
        return bool(self.conditions)

    def check_keys(self, cells: list[Cell]) -> None:
        """Raise SuiteError naming a key that is neither a cell field nor a hyper-parameter."""
        hparams = sorted({k for c in cells for k in c.hparams})
        valid = [*_CELL_KEYS, *hparams]
        bad = [k for k in self.conditions if k not in valid]
        if bad:
            raise SuiteError(
                [f"--only {k}: unknown key; valid keys: {', '.join(valid)}" for k in bad]
            )

    def check_values(self, cells: list[Cell]) -> None:
        """Raise SuiteError naming every value that no cell of the grid has (a typo would
        otherwise drop out silently while its alternatives run), with the closest value."""
        problems = []
        for key, values in self.conditions.items():
            present: list[Any] = []  # distinct values (hyper-parameters may be unhashable)
            for c in cells:
                v = _value_of(c, key)
                if v is not _MISSING and not any(_same(v, p) for p in present):
                    present.append(v)
            for v in values:
                if any(_same(p, v) for p in present):
                    continue
                shown = [str(p) for p in present]
                near = closest(str(v), shown)
                hint = f"; did you mean {near}?" if near else ""
                problems.append(
                    f"--only {key}={v}: no cell of the suite has {key} {v!r}{hint} "
                    f"(values in this grid: {', '.join(shown) or 'none'})"
                )
        if problems:
            raise SuiteError(problems)

    def matches(self, cell: Cell) -> bool:
        """Whether ``cell`` satisfies every condition (values compared as YAML reads them)."""
        for key, values in self.conditions.items():
            actual = _value_of(cell, key)
            if not any(_same(actual, v) for v in values):
                return False
        return True

    def select(self, cells: list[Cell]) -> list[Cell]:
        """The matching cells (SuiteError when a key is unknown or nothing matches)."""
        if not self:
            return cells
        self.check_keys(cells)
        self.check_values(cells)
        out = [c for c in cells if self.matches(c)]
        if not out:
            raise SuiteError([f"--only {' '.join(self.texts)}: no cell of the suite matches"])
        return out


_MISSING = object()


def _value_of(cell: Cell, key: str) -> Any:
    return getattr(cell, key) if key in _CELL_KEYS else cell.hparams.get(key, _MISSING)


def _same(actual: Any, wanted: Any) -> bool:
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return actual is wanted
    if isinstance(actual, int | float) and isinstance(wanted, int | float):
        return float(actual) == float(wanted)
    if isinstance(actual, list | tuple) and isinstance(wanted, list | tuple):
        return len(actual) == len(wanted) and all(map(_same, actual, wanted))
    return actual == wanted or str(actual) == str(wanted)
