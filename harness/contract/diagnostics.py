"""What a method declares about its per-epoch diagnostics, and how the reporter shows them.

A method lists :class:`Diagnostic` entries on its ``MethodSpec.diagnostics``; the engine writes
them as JSON into each record (``diagnostics.declared``), so the reporter shows every declared
diagnostic from the record alone, naming no method and importing none. Records written before
declarations existed get :func:`shown_diagnostics`' fallback: every numeric key of the last
epoch's entry, under its own name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMATS = ("pct", "f3", "f2", "count", "int")


@dataclass(frozen=True)
class DiagnosticFigure:
    """A figure of a diagnostic against a hyper-parameter, one line per M (± std over seeds).

    Attributes:
        x: the hyper-parameter on the x axis (a key of the cell's ``hparams``).
        id: the figure's id (its file name, ``<id>.png``).
        title / caption: shown above and below it.
        x_label / y_label: axis labels (default: ``x`` and the diagnostic's label).
        reference_lines: horizontal dotted lines: numbers, or ``"M"`` for each ensemble size.
    """

    x: str
    id: str
    title: str
    caption: str = ""
    x_label: str = ""
    y_label: str = ""
    reference_lines: tuple[float | str, ...] = ()


@dataclass(frozen=True)
class Diagnostic:
    """One per-epoch diagnostic a method records (a key of ``model.diagnostics()``).

    Attributes:
        key: its key in each epoch's entry of ``diagnostics.per_epoch``.
        label: the column header.
        group: the header group it is shown under.
        format: number format: "pct", "f3", "f2", "count" or "int".
        epoch: "last" or "first": the epoch whose value a row shows.
        column: the column's key in the report's frames (default: ``key``).
        hidden: left out of the default view (the column picker shows it).
        figure: optionally, a figure of it against a hyper-parameter.
    """

    key: str
    label: str
    group: str = "Diagnostics"
    format: str = "f3"
    epoch: str = "last"
    column: str = ""
    hidden: bool = True
    figure: DiagnosticFigure | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS or self.epoch not in ("first", "last"):
            raise ValueError(f"diagnostic {self.key!r}: format in {FORMATS}, epoch first/last")

    @property
    def column_key(self) -> str:
        return self.column or self.key

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Diagnostic | None:
        """The declaration from a record; None when it is not one (a damaged or newer entry)."""
        try:
            fig = data.get("figure")
            fields = {f.name for f in dataclasses.fields(cls)} - {"figure"}
            figure = (
                DiagnosticFigure(
                    **{**fig, "reference_lines": tuple(fig.get("reference_lines") or ())}
                )
                if fig
                else None
            )
            return cls(**{k: v for k, v in data.items() if k in fields}, figure=figure)
        except (TypeError, ValueError, AttributeError):
            return None


def shown_diagnostics(section: Mapping[str, Any]) -> list[Diagnostic]:
    """The diagnostics a record's ``diagnostics`` section shows: its declarations, or, for a
    record without any, every numeric key of the last epoch's entry but ``epoch`` (label = key)."""
    declared = section.get("declared")
    if isinstance(declared, list):
        found = (Diagnostic.from_json(d) for d in declared if isinstance(d, Mapping))
        return [d for d in found if d is not None]
    per_epoch = section.get("per_epoch") or []
    last = per_epoch[-1] if per_epoch and isinstance(per_epoch[-1], Mapping) else {}
    return [
        Diagnostic(str(k), str(k))
        for k, v in last.items()
        if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool)
    ]
