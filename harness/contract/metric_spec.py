"""A metric column: what a per-prediction metric of the clean test set is called on the page,
how it is formatted and which way is better, and, for a plugin's metric, how it is computed.

The built-in metrics (accuracy, NLL, ECE, …, computed by the engine's metric collection) and a
plugin's register the same way, through ``harness.registry.METRICS`` (``register_metric``). The
engine writes a plugin metric's value beside the built-ins (``metrics.clean.<key>``) and its
declaration into the record (``metrics.declared``), so the reporter shows it from the record
alone, whether or not the plugin is loaded when the report is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.contract.errors import UsageError
from harness.contract.record import ENSEMBLE_METRIC_KEYS

KINDS = ("pct", "f3", "f2", "count", "int")
#: The keys of ``metrics.clean`` the engine writes itself: a computed (plugin) metric under one of
#: them would overwrite a measurement, so it is refused when declared. (The built-in columns,
#: which have no ``compute``, are these keys.)
ENGINE_CLEAN_KEYS = (*ENSEMBLE_METRIC_KEYS, "members", "reliability", "reliability_members")


class MetricError(UsageError):
    """A plugin's computed metric raised, or returned something that is not a number: one line
    naming the metric, its function, the cell and what went wrong. In ``harness run`` it fails
    that cell (recorded in its ``error``; the other cells go on, and a re-run re-evaluates the
    trained weights without training); elsewhere it is a ``UsageError`` (exit status 2)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric column.

    Attributes:
        key: the record key (``metrics.clean.<key>``) and the column key.
        label: the column header.
        group: the header group (``"Quality"``, ``"Diversity"`` or a plugin's own).
        kind: number format: ``"pct"`` (a fraction shown ×100), ``"f3"``, ``"f2"``, ``"count"``,
            ``"int"``.
        direction: ``"higher"`` or ``"lower"`` if that is better (bolding, ▲/▼), None if
            neither.
        hidden: left out of the default view (the page's column picker shows it).
        compute: for a plugin metric, ``compute(probs, targets) -> float`` on the whole clean
            test set: ``probs`` the (M, N, K) member probabilities (float32 tensor), ``targets``
            the (N,) integer labels. None for the built-ins, which the engine's metric
            collection computes.
    """

    key: str
    label: str
    group: str = "Quality"
    kind: str = "f3"
    direction: Literal["higher", "lower"] | None = None
    hidden: bool = False
    compute: Callable[[Any, Any], float] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.key!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.direction not in ("higher", "lower", None):
            raise ValueError(
                f"metric {self.key!r}: direction must be 'higher', 'lower' or None, "
                f"got {self.direction!r}"
            )
        if self.compute is not None and self.key in ENGINE_CLEAN_KEYS:
            raise ValueError(
                f"metric {self.key!r}: the engine writes metrics.clean.{self.key} itself; a "
                f"computed metric needs another key (taken: {', '.join(ENGINE_CLEAN_KEYS)})"
            )

    def declaration(self) -> dict[str, Any]:
        """The record's statement of the column (everything but ``compute``)."""
        return {
            "key": self.key,
            "label": self.label,
            "group": self.group,
            "kind": self.kind,
            "direction": self.direction,
            "hidden": self.hidden,
        }

    @classmethod
    def from_declaration(cls, data: Mapping[str, Any]) -> MetricSpec:
        """The column a record declares (no ``compute``: the reporter only shows it)."""
        return cls(
            str(data["key"]),
            str(data.get("label") or data["key"]),
            str(data.get("group") or "Quality"),
            str(data.get("kind") or "f3"),
            data.get("direction"),
            bool(data.get("hidden", False)),
        )
