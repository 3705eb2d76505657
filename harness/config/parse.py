"""Parsing a suite: a loaded YAML mapping (with its ``include:``s and ``KEY=VALUE`` overrides
applied) into the typed :class:`~harness.config.suite.Suite`, every problem collected with its
file and key path (or the override that set it) and raised at once as :class:`SuiteError`.

Each rule is checked here or in :mod:`harness.config.validator` (the rules that need the whole
suite: recipes, calibration splits, pretrained weights), once; :mod:`harness.config.suite` is
the model alone.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from harness.config.expand import expand_all
from harness.config.includes import Origins, SuiteError, load_suite_yaml
from harness.config.overrides import apply_overrides
from harness.config.suite import Grid, Suite, entry_settings, members_for, method_backbones
from harness.config.validator import (
    attribute,
    backbone_option_problems,
    method_build_problems,
    suite_problems,
)
from harness.contract.build import build_dataclass, check_constraints, coerce, unknown_keys
from harness.contract.config import BackboneEntry, Evaluation, MethodEntry, Recipe
from harness.registry import BACKBONES, DATASETS, METHODS
from harness.registry.core import UnknownNameError

#: Bytes in one path component on Linux, macOS and Windows file systems (NAME_MAX).
NAME_MAX = 255

TOP_KEYS = ["name", "description", "grid", "recipe", "evaluation"]
GRID_KEYS = ["datasets", "backbones", "methods", "M", "seeds"]
METHOD_KEYS = ["name", "M", "hparams", "recipe", "backbones"]
#: The largest seed a suite may name (2³¹ − 1).
MAX_SEED = 2**31 - 1


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _lookup(registry, name: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(name, str):
        errors.append(f"{where}: expected a {registry.kind} name, got {name!r}")
        return None
    try:
        return registry.get(name)
    except UnknownNameError as exc:
        errors.append(f"{where}: {exc}")
        return None


def _parse_methods(raw: Any, errors: list[str]) -> list[MethodEntry]:
    entries = []
    for i, item in enumerate(_as_list(raw)):
        where = f"grid.methods[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or "name" not in item:
            errors.append(f"{where}: expected a method name or a mapping with 'name'")
            continue
        errors.extend(unknown_keys(item, METHOD_KEYS, where))
        spec = _lookup(METHODS, item["name"], f"{where}.name", errors)
        ms = None
        if "M" in item:
            ms = coerce(_as_list(item["M"]), tuple[int, ...], f"{where}.M", errors)
        hp = item.get("hparams") or {}
        if not isinstance(hp, dict):
            errors.append(f"{where}.hparams: expected a mapping, got {hp!r}")
            hp = {}
        settings: tuple = ()
        if spec is not None:
            before = len(errors)
            hp = _check_hparams(spec, hp, f"{where}.hparams", errors)
            if len(errors) == before:  # the one expansion of the sweep, typed once
                settings = _settings(
                    spec, MethodEntry(str(item["name"]), hparams=hp), where, errors
                )
        delta: dict[str, Any] = {}
        if item.get("recipe") is not None:
            # A method's documented recipe delta (e.g. a short fine-tuning schedule): validated
            # against the same Recipe dataclass as the suite's recipe.
            checked = build_dataclass(Recipe, item["recipe"], f"{where}.recipe", errors)
            if checked is not None:
                delta = {k: getattr(checked, k) for k in item["recipe"] if hasattr(checked, k)}
        bbs = None
        if "backbones" in item:
            bbs = coerce(_as_list(item["backbones"]), tuple[str, ...], f"{where}.backbones", errors)
            for j, name in enumerate(bbs or ()):
                _lookup(BACKBONES, name, f"{where}.backbones[{j}]", errors)
        entries.append(MethodEntry(str(item["name"]), ms, hp, delta, bbs, settings))
    return entries


def _settings(spec: Any, entry: MethodEntry, where: str, errors: list[str]) -> tuple:
    """:func:`harness.config.suite.entry_settings`, a dataclass's own refusal of a value (its
    ``__post_init__``) reported as a problem of the entry instead of raised."""
    try:
        return entry_settings(spec, entry)
    except (TypeError, ValueError) as exc:
        errors.append(f"{where}.hparams: {exc}")
        return ()


def _grid_list_problems(datasets: Any, grid_m: Any, seeds: Any) -> list[str]:
    """Seeds out of range, and a value listed twice in the grid's lists."""
    errors = []
    ints = [s for s in seeds if isinstance(s, int)] if isinstance(seeds, tuple) else []
    if out := [s for s in ints if not 0 <= s <= MAX_SEED]:
        # what every generator a cell seeds accepts (numpy's legacy seeding stops at 2³² − 1);
        # a larger one failed inside the first cell with "Overflow when unpacking long long"
        errors.append(f"grid.seeds: {out[0]} is out of range: seeds are 0 … {MAX_SEED}")
    for key, values in (("datasets", datasets), ("M", grid_m), ("seeds", seeds)):
        errors += _repeated(values, f"grid.{key}")
    return errors


def _repeated(values: Any, where: str) -> list[str]:
    """A value listed twice in a grid list: the grid would hold its cells once while the run's
    count (``× 2 seeds``) and the reader's assumption say twice; almost always a typo."""
    if not isinstance(values, list | tuple):
        return []
    counts = Counter(v for v in values if isinstance(v, str | int))
    return [f"{where}: {v!r} is listed more than once" for v, n in counts.items() if n > 1]


def _check_hparams(spec, hp: dict[str, Any], where: str, errors: list[str]) -> dict[str, Any]:
    """Validate hyper-parameter values (scalars or sweep lists) against the method's dataclass."""
    import typing

    fields = spec.hparam_fields()
    errors.extend(unknown_keys(hp, list(fields), where))
    hints = typing.get_type_hints(spec.hparams)
    out = {}
    for key, value in hp.items():
        if key not in fields:
            continue
        tp = hints[key]
        is_tuple_type = typing.get_origin(tp) is tuple
        values = value if isinstance(value, list) and not is_tuple_type else [value]
        if not values:
            errors.append(f"{where}.{key}: an empty list sweeps no value; give one or more")
            continue
        if isinstance(value, list) and is_tuple_type and value and isinstance(value[0], list):
            values = value  # a sweep over list-valued hparams
        coerced = []
        for j, v in enumerate(values):
            w = f"{where}.{key}" + (f"[{j}]" if len(values) > 1 else "")
            before = len(errors)
            cv = coerce(v, tp, w, errors)
            if len(errors) == before:
                check_constraints(cv, fields[key].metadata, w, errors)
            coerced.append(cv)
        out[key] = coerced if len(coerced) > 1 else coerced[0]
    return out


def _check_entries(
    methods: list[MethodEntry],
    backbones: list[BackboneEntry],
    grid_m: tuple[int, ...],
    errors: list[str],
) -> None:
    """Each method entry's M against the method's range and checks, and its backbones against
    the ones it supports."""
    for me in methods:
        if me.name not in METHODS:
            continue
        spec = METHODS.get(me.name)
        where = f"grid.methods[{methods.index(me)}]"
        for m in members_for(spec, me, grid_m) if all(isinstance(x, int) for x in grid_m) else ():
            if not isinstance(m, int):
                continue
            if m < 1:
                errors.append(f"{where}.M: M must be >= 1, got {m}")
            elif m < spec.min_members or (spec.max_members and m > spec.max_members):
                hi = spec.max_members or "any"
                errors.append(
                    f"{where}.M: method {me.name!r} allows M in [{spec.min_members}, {hi}], got {m}"
                )
            else:
                for setting in me.settings:
                    errors.extend(f"{where}: {p}" for p in spec.problems(setting.typed, m))
        for bb in method_backbones(me, backbones):
            if spec.backbones is not None and bb.name not in spec.backbones:
                errors.append(
                    f"{where}: method {me.name!r} does not support backbone "
                    f"{bb.name!r}; supported backbones: {', '.join(spec.backbones)}"
                )


def _check_builds(
    methods: list[MethodEntry],
    backbones: list[BackboneEntry],
    datasets: list[str],
    grid_m: tuple[int, ...],
) -> list:
    """Each method's ``check_build`` over its backbones × datasets × M × settings."""
    problems: list = []
    for i, me in enumerate(methods):
        spec = METHODS.get(me.name)
        if spec.check_build:
            members = members_for(spec, me, grid_m)
            bbs = method_backbones(me, backbones)
            problems += method_build_problems(spec, me.settings, i, bbs, datasets, members)
    return problems


def _parse_evaluation(raw: Any, datasets: list[str], errors: list[str]) -> Evaluation | None:
    """The evaluation block: its OOD sets and corruptions exist for the grid's datasets (the
    recipe's rules are :func:`harness.config.validator.recipe_problems`')."""
    evaluation = build_dataclass(Evaluation, raw, "evaluation", errors)
    if evaluation is not None:
        for i, o in enumerate(evaluation.ood):
            _lookup(DATASETS, o, f"evaluation.ood[{i}]", errors)
        from harness.data._machinery.corruption_sets import (
            check_corruptions,
        )  # names, generators here

        for d in datasets:
            errors.extend(
                f"evaluation.corruptions: {p}" for p in check_corruptions(d, evaluation.corruptions)
            )
    return evaluation


def parse_suite(
    data: dict[str, Any],
    origins: Origins,
    source: Path,
    applied: dict[str, str] | None = None,
    check_files: bool = False,
) -> Suite:
    """Validate a loaded mapping into a :class:`Suite` (raises SuiteError with every problem).

    ``applied`` (canonical key path → override text, from :func:`apply_overrides`) makes each
    problem under an overridden key name the override instead of the file; ``check_files``
    is passed to :func:`harness.config.validator.suite_problems`.
    """
    applied = applied or {}
    errors: list[str] = []
    errors.extend(unknown_keys(data, TOP_KEYS, ""))
    name = data.get("name", source.stem)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        errors.append(f"name: must be letters, digits, '-' or '_', got {name!r}")
    elif len(name.encode()) > NAME_MAX:  # it names the results folder: one path component
        errors.append(
            f"name: {len(name.encode())} bytes, more than the {NAME_MAX} a file name may have "
            "(it names the results folder); shorten it"
        )
    grid_raw = data.get("grid")
    if not isinstance(grid_raw, dict):
        errors.append("grid: required mapping is missing (datasets, backbones, methods, M, seeds)")
        grid_raw = {}
    errors.extend(unknown_keys(grid_raw, GRID_KEYS, "grid"))
    for req in ("datasets", "backbones", "methods"):
        if req not in grid_raw and "grid" in data:
            errors.append(f"grid.{req}: required key is missing")

    datasets = [
        d
        for i, d in enumerate(_as_list(grid_raw.get("datasets", [])))
        if _lookup(DATASETS, d, f"grid.datasets[{i}]", errors) is not None
    ]
    for d in datasets:
        if DATASETS.get(d).num_classes is None:
            errors.append(f"grid.datasets: {d!r} is an OOD-only set and cannot be trained on")
    backbones = []
    for i, b in enumerate(_as_list(grid_raw.get("backbones", []))):
        entry = (
            BackboneEntry(b)
            if isinstance(b, str)
            else (build_dataclass(BackboneEntry, b, f"grid.backbones[{i}]", errors))
        )
        if entry and _lookup(BACKBONES, entry.name, f"grid.backbones[{i}]", errors):
            backbones.append(entry)
            if entry.kwargs and datasets:  # options the builder accepts, before any cell runs
                errors += backbone_option_problems(entry, DATASETS.get(datasets[0]), i)
    grid_m = coerce(_as_list(grid_raw.get("M", [4])), tuple[int, ...], "grid.M", errors)
    listed, left_out = expand_all(_as_list(grid_raw.get("methods", [])), backbones, grid_m)
    methods = _parse_methods(listed, errors)
    seeds = coerce(_as_list(grid_raw.get("seeds", [0])), tuple[int, ...], "grid.seeds", errors)
    errors += _grid_list_problems(datasets, grid_m, seeds)

    _check_entries(methods, backbones, grid_m, errors)
    if not errors:  # problems only sizing the model shows (Packed's alpha: auto)
        errors += _check_builds(methods, backbones, datasets, grid_m)

    recipe = build_dataclass(Recipe, data.get("recipe"), "recipe", errors)
    evaluation = _parse_evaluation(data.get("evaluation"), datasets, errors)

    suite = None
    if not errors:  # what only the whole suite shows, once its parts are sound
        grid = Grid(tuple(datasets), tuple(backbones), tuple(methods), tuple(grid_m), tuple(seeds))
        description = str(data.get("description", ""))
        overrides = tuple(applied.values())
        suite = Suite(
            name, grid, recipe, evaluation, description, source, overrides, tuple(left_out)
        )
        errors += suite_problems(suite, check_files)
    if errors:
        raise SuiteError([attribute(e, origins, source, applied) for e in dict.fromkeys(errors)])
    return suite


def load_suite(
    path: str | Path, overrides: tuple[str, ...] | list[str] = (), check_files: bool = False
) -> Suite:
    """Load, compose and validate a suite file, with command-line ``KEY=VALUE`` overrides applied
    to its mapping first (see :mod:`harness.config.overrides`); ``check_files``: also require
    the ``pretrained:`` weight files on this machine.

    Raises:
        SuiteError: every problem, each naming the file and key or the override that set it.
    """
    data, origins = load_suite_yaml(path)
    applied = apply_overrides(data, overrides)
    return parse_suite(data, origins, Path(path).resolve(), applied, check_files)
