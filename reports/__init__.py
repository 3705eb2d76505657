"""Reports: result records → leaderboard (HTML, CSV, Markdown, LaTeX), figures, terminal table.

Four sub-packages, one job each: ``records`` (read, flatten and index result records),
``stats`` (per-configuration summaries, paired tests, bolding), ``render`` (the page, Markdown,
LaTeX and terminal tables) and ``figures`` (seaborn figures). ``columns`` is the shared vocabulary.

Public API (imported lazily, so ``import reports`` pulls in neither matplotlib nor Jinja2)::

    write_report(results_dir, out_dir=None, *, expected=None, figures=True, reference=None,
                 options=ReportOptions(), formats=("html", "csv", "md"), published=None,
                 index=True, left_out=None) -> Path   # left_out: gets unreadable cells
    scan(results_dir, ignore=(), index=False) -> Scan   # one reading: .results(), .tidy()
    load_results(results_dir, expected=None, ignore=()) -> Results   # scan(...).results()
    load_frame(results_dir) -> DataFrame            # one row per cell of a results folder
    records_to_frame(records) -> DataFrame          # one row per cell
    aggregate(cells) -> DataFrame                   # mean/std/n per configuration
    format_table(df) -> str                         # terminal leaderboard
    paired_differences(cells, reference, ...)       # paired t-intervals, sign-flip/t p-values
    render_latex(results, paired, options) -> str   # booktabs tables, one per dataset
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "write_report": "reports.render.leaderboard",
    "render_html": "reports.render.leaderboard",
    "render_markdown": "reports.render.leaderboard",
    "load_results": "reports.records.index",
    "scan": "reports.records.index",
    "Scan": "reports.records.index",
    "load_frame": "reports.records.index",
    "from_records": "reports.records.results",
    "records_to_frame": "reports.records.results",
    "Results": "reports.records.results",
    "aggregate": "reports.stats.summary",
    "direction": "reports.columns",
    "DIRECTIONS": "reports.columns",
    "directions": "reports.columns",
    "render_figures": "reports.figures.draw",
    "write_figure_files": "reports.figures.draw",
    "ReportOptions": "reports.render.page",
    "paired_differences": "reports.stats.paired",
    "render_latex": "reports.render.latex",
    "format_table": "reports.render.terminal",
    "format_results": "reports.render.terminal",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'reports' has no attribute {name!r}")
