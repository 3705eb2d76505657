"""Turning plain mappings into frozen dataclasses, with every problem reported at once.

The dataclass is the single source of truth: valid keys are its fields, types come from its
annotations, and range constraints from ``field(metadata={"gt": 0, ...})`` (like submitit, which
validates executor parameters against its own signature). Hand-written because no maintained
library we depend on collects *all* errors with key paths and valid choices in one pass. Part of
the contract layer: standard library only, used by the YAML parser and by ``Cell.from_json``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, get_args, get_origin

#: A number in exponent notation without a dot (``1e-3``, ``-5E+2``, ``2.e4``): YAML 1.1 reads
#: it as a string, YAML 1.2 as a float.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")

#: Other tools' names for a key, suggested where the spelling is too far off for difflib:
#: lm-eval's ``limit`` is ours, RobustBench's ``n_examples`` and friends are ``limit``.
ALIASES = {"n_examples": "limit", "num_examples": "limit", "n_samples": "limit",
           "max_examples": "limit", "subset": "limit"}  # fmt: skip


def closest(name: str, choices: list[str]) -> str | None:
    """Return the choice most similar to ``name``, or None if nothing is close."""
    if ALIASES.get(name) in choices:
        return ALIASES[name]
    matches = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return matches[0] if matches else None


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


#: The words YAML 1.1 (PyYAML) reads as booleans when unquoted, by the boolean they become.
_YAML_BOOL_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _yaml_word(value: bool, choices: tuple[Any, ...]) -> str | None:
    """The one choice of a Literal that an unquoted YAML word read as ``value`` spelled
    (``off`` → False for ``Literal["auto", "off"]``), or None when none or several do."""
    words = [c for c in choices if isinstance(c, str) and c.lower() in _YAML_BOOL_WORDS[value]]
    return words[0] if len(words) == 1 else None


def coerce(value: Any, tp: Any, where: str, errors: list[str]) -> Any:
    """Check ``value`` against annotation ``tp``; convert it (list → tuple, int → float)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if isinstance(value, bool) and (word := _yaml_word(value, get_args(tp))):
            return word  # YAML 1.1 read an unquoted `off`/`on` as a boolean: the word meant
        if value in get_args(tp) and not isinstance(value, bool):
            return value
        if isinstance(value, bool):
            errors.append(
                f"{where}: {value!r} is not one of {list(get_args(tp))}: YAML reads unquoted "
                "on/off/yes/no as true/false; quote the word you meant"
            )
            return value
        sugg = closest(str(value), [str(a) for a in get_args(tp)])
        hint = f" (did you mean {sugg!r}?)" if sugg else ""
        errors.append(f"{where}: {value!r} is not one of {list(get_args(tp))}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            trial: list[str] = []
            out = coerce(value, arg, where, trial)
            if not trial:
                return out
        errors.append(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            errors.append(f"{where}: expected a list, got {type(value).__name__} {value!r}")
            return value
        (item_tp, *_) = get_args(tp)
        return tuple(coerce(v, item_tp, f"{where}[{i}]", errors) for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        return value
    if tp is type(None):
        if value is not None:
            errors.append(f"{where}: expected null, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _EXPONENT_FLOAT.match(value):
            # YAML 1.1 (PyYAML) reads `5e-2` as a string (it wants `5.0e-2`); YAML 1.2, JSON
            # and every reader of a suite take it for the number it is.
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool or tp is str:
        if isinstance(value, tp):
            return value
        if tp is str and isinstance(value, bool):
            errors.append(
                f"{where}: expected a string, got {value!r}: YAML reads unquoted "
                "on/off/yes/no as true/false; quote it"
            )
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    errors.append(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def check_constraints(
    value: Any, meta: typing.Mapping[str, Any], where: str, errors: list[str]
) -> None:
    """Apply ``gt``/``ge``/``lt``/``le`` bounds from field metadata (to each item of a tuple);
    a float must be finite (YAML's ``.inf``/``.nan`` set no meaningful setting, and a record
    cannot hold them as JSON)."""
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            errors.append(f"{where}: must be a finite number, got {v!r}")
            continue
        for key, ok, word in (
            ("gt", lambda a, b: a > b, ">"),
            ("ge", lambda a, b: a >= b, ">="),
            ("lt", lambda a, b: a < b, "<"),
            ("le", lambda a, b: a <= b, "<="),
        ):
            if key in meta and not ok(v, meta[key]):
                errors.append(f"{where}: must be {word} {meta[key]}, got {v!r}")


def unknown_keys(data: typing.Mapping[str, Any], valid: list[str], where: str) -> list[str]:
    """Messages for keys of ``data`` not in ``valid``, with a suggestion and the valid list."""
    out = []
    for key in data:
        if key not in valid:
            sugg = closest(str(key), valid)
            hint = f" Did you mean {sugg!r}?" if sugg else ""
            prefix = f"{where}.{key}" if where else str(key)
            out.append(f"{prefix}: unknown key.{hint} Valid keys: {', '.join(valid)}")
    return out


def build_dataclass(cls: type, data: Any, where: str, errors: list[str]) -> Any:
    """Instantiate frozen dataclass ``cls`` from ``data``, appending problems to ``errors``.

    Returns None when ``data`` is not a mapping or a required field is missing.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.append(f"{where or 'top level'}: expected a mapping, got {type(data).__name__}")
        return None
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    errors.extend(unknown_keys(data, list(fields), where))
    kwargs: dict[str, Any] = {}
    ok = True
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append(f"{key}: required key is missing")
                ok = False
            continue
        before = len(errors)
        value = coerce(data[name], hints[name], key, errors)
        if len(errors) == before:
            check_constraints(value, f.metadata, key, errors)
        kwargs[name] = value
    if not ok:
        return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        errors.append(f"{where or 'top level'}: {exc}")
        return None


def field_doc(cls: type) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, help) of each field, for ``harness ls`` and docs."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append((f.name, _type_name(hints[f.name]), default, f.metadata.get("help", "")))
    return out


def parse_name_values(text: str, what: str = "name") -> tuple[str, dict[str, Any]]:
    """``"name"`` → (name, {}); ``"name:key=value,key=value"`` → (name, values), each value read
    as a YAML scalar. The command-line syntax for a configuration (``harness bench --methods``,
    ``harness report --reference``).

    Raises:
        ValueError: an item without ``=``.
    """
    import yaml  # YAML's scalar rules (1e-3, true, [1, 2]), as in suite files; lazily imported

    name, _, rest = text.partition(":")
    values: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{text!r}: expected {what}:key=value,...")
        values[key.strip()] = yaml.safe_load(value)
    return name, values
