"""Validation helpers for YAML mappings → frozen dataclasses, and the ``name:key=value`` syntax.

Both live in the contract layer (:mod:`harness.contract.build`), so ``Cell.from_json``, the YAML
parser and the reporter share one implementation; re-exported here for the parser's callers.
"""

from __future__ import annotations

from harness.contract.build import (
    build_dataclass,
    check_constraints,
    closest,
    coerce,
    field_doc,
    parse_name_values,
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
