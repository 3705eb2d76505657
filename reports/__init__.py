"""Reports: result records → leaderboard (HTML, CSV, Markdown), figures and a terminal table.

Public API (imported lazily, so ``import reports.terminal`` does not pull in matplotlib)::

    write_report(results_dir, out_dir=None, *, expected=None, figures=True, reference=None,
                 options=ReportOptions(), formats=("html", "csv", "md"), published=None) -> Path
    load_results(results_dir, expected=None, ignore=()) -> Results
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
    "write_report": "reports.leaderboard",
    "render_html": "reports.leaderboard",
    "render_markdown": "reports.leaderboard",
    "load_results": "reports.aggregate",
    "load_frame": "reports.aggregate",
    "from_records": "reports.aggregate",
    "records_to_frame": "reports.aggregate",
    "aggregate": "reports.summary",
    "direction": "reports.columns",
    "DIRECTIONS": "reports.columns",
    "Results": "reports.aggregate",
    "render_figures": "reports.figures",
    "write_figure_files": "reports.figures",
    "ReportOptions": "reports.page",
    "paired_differences": "reports.stats",
    "render_latex": "reports.latex",
    "format_table": "reports.terminal",
    "format_results": "reports.terminal",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'reports' has no attribute {name!r}")
