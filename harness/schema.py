"""Validation helpers for YAML mappings → frozen dataclasses, and the ``name:key=value`` syntax.

The dataclass builder itself lives in the contract layer (:mod:`harness.contract.build`), so
``Cell.from_json`` and the YAML parser share one implementation; it is re-exported here.
"""

from __future__ import annotations

from typing import Any

from harness.contract.build import (
    build_dataclass,
    check_constraints,
    closest,
    coerce,
    field_doc,
    unknown_keys,
)

__all__ = [
    "build_dataclass",
    "check_constraints",
    "closest",
    "coerce",
    "field_doc",
    "parse_name_values",
    "unknown_keys",
]


def parse_name_values(text: str, what: str = "name") -> tuple[str, dict[str, Any]]:
    """``"name"`` → (name, {}); ``"name:key=value,key=value"`` → (name, values), each value read
    as a YAML scalar. The command-line syntax for a configuration (``harness bench --methods``,
    ``harness report --reference``).

    Raises:
        ValueError: an item without ``=``.
    """
    import yaml

    name, _, rest = text.partition(":")
    values: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{text!r}: expected {what}:key=value,...")
        values[key.strip()] = yaml.safe_load(value)
    return name, values
