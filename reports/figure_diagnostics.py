"""The figures a method declares for its diagnostics (``Diagnostic.figure``, read from the
records by :func:`reports.columns.declared_diagnostics`): the diagnostic against a
hyper-parameter, per M. The reporter names no method: title, axes and reference lines are the
declaration's."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from matplotlib.figure import Figure

from reports.figure_base import (
    _done,
    _figure_legend,
    _finite,
    _m_text,
    _mean_sd_lines,
    _panels,
    _settings,
    _style,
    _tab10,
)


def _text(label: object) -> str:
    """A declared label drawn literally: a ``$`` would start matplotlib math text."""
    return str(label).replace("$", r"\$")


def diagnostic_vs_hparam(cells: pd.DataFrame, declared: dict) -> Figure | None:
    """A declared diagnostic (its column) against the hyper-parameter its figure names, one line
    per M (± std over seeds), with the declared reference lines ("M": each ensemble size)."""
    fig_spec, column = declared["figure"], str(declared.get("column") or declared["key"])
    x = str(fig_spec["x"])
    if f"hp_{x}" not in cells or column not in cells:
        return None
    d = _done(cells)
    d = _finite(d.assign(**{x: pd.to_numeric(d[f"hp_{x}"], errors="coerce")}), x, column)
    if d[x].nunique() < 2:
        return None
    d = d.assign(size=d["M"].map(_m_text))
    sizes = [_m_text(m) for m in sorted(d["M"].unique())]
    pal = dict(zip(sizes, _tab10(len(sizes))))
    settings = _settings(d)
    with _style():
        fig, panels = _panels(len(settings), 1, width=4.6, height=3.4)
        legend: dict = {}
        for (ax,), (title, s) in zip(panels, settings):
            legend = _mean_sd_lines(ax, s, x, column, "size", pal)
            for ref in fig_spec.get("reference_lines") or ():
                for level in sorted(s["M"].dropna().unique()) if ref == "M" else [ref]:
                    ax.axhline(float(level), ls=":", color="0.5", lw=0.8)
            if (s[x] > 0).all():
                ax.set_xscale("log")
            ylabel = fig_spec.get("y_label") or declared.get("label") or column
            ax.set(title=title, xlabel=fig_spec.get("x_label") or x, ylabel=_text(ylabel))
        _figure_legend(fig, (row[0] for row in panels), legend)
        return fig


def declared_figures(cells: pd.DataFrame) -> list[tuple[str, str, str, str, Callable]]:
    """``(id, title, caption, needs, draw)`` of a figure for each diagnostic the records declare
    with one (:class:`harness.contract.DiagnosticFigure`), for ``reports.figures.FigureSpec``."""
    from reports.figure_selection import declared_figure_meta

    return [
        (fid, title, caption, needs, lambda frame, d=d: diagnostic_vs_hparam(frame, d))
        for fid, title, caption, needs, d in declared_figure_meta(cells)
    ]
