"""Reading suite YAML files: ``yaml.safe_load`` plus ``include:`` composition.

``include:`` (a path or a list, relative to the including file) is merged first, in order; the
including file's own keys override them (mappings merge recursively, other values replace).
Every leaf remembers the file it came from, so validation errors can name the right file.

Every YAML file the harness reads (suites, includes, Slurm profiles) goes through
:func:`read_yaml_file`, which bounds what a file can cost: regular files only (not a directory,
``/dev/zero`` or a FIFO), at most :data:`MAX_YAML_BYTES`, and anchors/aliases allowed only while
the document they expand to stays under :data:`MAX_YAML_NODES` nodes (a "billion laughs" alias
bomb is a few hundred bytes that expand to 10⁹ nodes), and no key given twice in one mapping
(YAML keeps the last silently).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: A suite file is a few kB; 1 MiB leaves room for generated grids and bounds a wrong file.
MAX_YAML_BYTES = 2**20
#: Nodes the document may expand to once aliases are followed (the largest shipped suite: ~500).
MAX_YAML_NODES = 100_000


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


def merge_mappings(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge recursively, other values replace (the rule
    of ``include:`` and of a mapping-valued override)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_mappings(out[k], v)
        else:
            out[k] = v
    return out


def _expanded_nodes(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many nodes ``node`` stands for with every alias expanded, counted on the composed
    graph with memoisation (an alias is the same node object again), so the count of a bomb is
    computed in time linear in its size, never by expanding it."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a recursive alias (&a [*a]) counts once instead of looping
        if isinstance(node, yaml.SequenceNode):
            memo[key] = 1 + sum(_expanded_nodes(n, memo) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            memo[key] = 1 + sum(
                _expanded_nodes(k, memo) + _expanded_nodes(v, memo) for k, v in node.value
            )
        else:
            memo[key] = 1
    return memo[key]


def _duplicate_keys(node: yaml.Node, seen: set[int]) -> list[str]:
    """Every key written twice in one mapping, as ``line L: key 'k' given again (first at line
    F)``. PyYAML keeps the last silently, so a second ``hparams:`` or ``recipe:`` block would
    drop the first's settings from the experiment without a word; no loader option refuses it.
    Walked on the composed graph (an alias is the same node again: visited once)."""
    if id(node) in seen:
        return []
    seen.add(id(node))
    found: list[str] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = key.start_mark.line + 1
                if key.value in first:
                    found.append(
                        f"line {line}: key {key.value!r} given again (first at line "
                        f"{first[key.value]}); YAML would keep only the last: merge them"
                    )
                first.setdefault(key.value, line)
        children = [n for pair in node.value for n in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    for child in children:
        found += _duplicate_keys(child, seen)
    return found


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's error as one line: position, then what it expected (its own text spans
    several lines with a quoted snippet)."""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character or a bad encoding
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        return f"character {exc.position}: {char} is not allowed ({exc.reason})"
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}{problem}" + (f" ({' '.join(context.split())})" if context else "")


def read_yaml_file(path: str | Path, what: str = "suite file") -> Any:
    """``yaml.safe_load`` of one file, bounded (see the module docstring).

    Raises:
        SuiteError: one line naming the file and what is wrong (missing, not a regular file, too
            large, unreadable, invalid YAML, aliases expanding past the limit).
    """
    path = Path(path)
    try:
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise SuiteError([f"{path}: {what} is {kind}; give a YAML file"])
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise SuiteError([f"{path}: cannot read the {what}: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise SuiteError([f"{path}: {what} is larger than {MAX_YAML_BYTES // 2**10} KiB"])
    try:
        text = raw.decode("utf-8")
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and (n := _expanded_nodes(node, {})) > MAX_YAML_NODES:
                raise SuiteError(
                    [
                        f"{path}: {what}'s aliases expand to {n:.3g} nodes, more than "
                        f"{MAX_YAML_NODES}: refused (a YAML alias bomb?)"
                    ]
                )
            if node is not None and (dups := _duplicate_keys(node, set())):
                dups.sort(key=lambda d: int(d.split(":")[0].removeprefix("line ")))
                raise SuiteError([f"{path}: {d}" for d in dups])
            return loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except UnicodeDecodeError as exc:
        raise SuiteError([f"{path}: {what} is not UTF-8 text (byte {exc.start})"]) from None
    except yaml.YAMLError as exc:
        raise SuiteError([f"{path}: invalid YAML: {yaml_problem(exc)}"]) from None
    except RecursionError:
        raise SuiteError([f"{path}: {what} is nested too deeply"]) from None


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
    data = read_yaml_file(path, "included file" if _stack else "suite file") or {}
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
        merged = merge_mappings(merged, sub)
        origins._files.update(sub_origins._files)
    _mark(data, path, origins, "")
    return merge_mappings(merged, data), origins
