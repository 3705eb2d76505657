"""Reading suite YAML files: ``yaml.safe_load`` plus ``include:`` composition.

``include:`` (a path or a list, relative to the including file) is merged first, in order; the
including file's own keys override them (mappings merge recursively, other values replace).
Every leaf remembers the file it came from, so validation errors can name the right file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class SuiteError(ValueError):
    """A suite is invalid. ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Origins:
    """Which file each key path came from (key paths are dotted, e.g. ``recipe.lr``)."""

    def __init__(self, default: Path) -> None:
        self.default = default
        self._files: dict[str, Path] = {}

    def set(self, path: str, file: Path) -> None:
        self._files[path] = file

    def file_of(self, path: str) -> Path:
        """The file that set ``path`` or its nearest ancestor."""
        while True:
            if path in self._files:
                return self._files[path]
            if "." not in path and "[" not in path:
                return self._files.get(path, self.default)
            path = path.rsplit(".", 1)[0] if "." in path else path.split("[", 1)[0]


def _mark(data: Any, file: Path, origins: Origins, prefix: str) -> None:
    if prefix:
        origins.set(prefix, file)
    if isinstance(data, dict):
        for k, v in data.items():
            _mark(v, file, origins, f"{prefix}.{k}" if prefix else str(k))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_suite_yaml(path: str | Path, _stack: tuple[Path, ...] = ()) -> tuple[dict, Origins]:
    """Load a suite file with its includes resolved.

    Returns:
        The merged mapping and the origins of its keys.

    Raises:
        SuiteError: unreadable file, YAML syntax error, include cycle, non-mapping top level.
    """
    path = Path(path).resolve()
    origins = Origins(path)
    if path in _stack:
        chain = " -> ".join(str(p) for p in (*_stack, path))
        raise SuiteError([f"{path}: include cycle: {chain}"])
    if not path.exists():
        where = f" (included from {_stack[-1]})" if _stack else ""
        raise SuiteError([f"{path}: suite file not found{where}"])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SuiteError([f"{path}: invalid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise SuiteError([f"{path}: top level must be a mapping, got {type(data).__name__}"])
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise SuiteError([f"{path}: include: must be a file name or a list of file names"])
    merged: dict[str, Any] = {}
    for inc in includes:
        sub, sub_origins = load_suite_yaml(path.parent / inc, (*_stack, path))
        merged = _merge(merged, sub)
        origins._files.update(sub_origins._files)
    _mark(data, path, origins, "")
    return _merge(merged, data), origins
