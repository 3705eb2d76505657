"""The work of a report besides its statistics — the figures, the tables (CSV, Markdown, LaTeX), the
page's rows — done side by side in forked workers where that is safe.

The figures need only the records, so :func:`started` hands each figure still to draw
(:func:`reports.figure_cache.plan_figures`) to a forked worker (:mod:`reports.forked`: at most one
per core) as soon as the records are read, while this process computes the paired statistics; then
:meth:`Jobs.finish` writes the tables — in a worker too when no figure is being drawn, the
statistics sent along — while this process builds the page's rows. With no figure to draw, the idle
worker first computes the bold cells and writes the tables that need no statistics (``cells.csv``,
``leaderboard.csv``) while this process computes the paired statistics. At 10,000 records that is
most of a report's time. Workers inherit the records by the fork; what comes back is small: each
figure's page part, and the row cache's new entries (the Markdown lines and CSV spans a worker
wrote, so the next report finds them). Without a fork, or for any job whose worker failed, this
process does it: the same files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from reports import forked
from reports.columns import leaderboard_columns
from reports.csv_cache import write_csv
from reports.figure_cache import FigurePlan, RenderedFigure, draw_figure
from reports.markdown import render_markdown
from reports.page import ReportOptions
from reports.paired_view import (
    LEVEL,
    PairedStats,
    bold_cells,
    compute_bold,
    paired_context,
    set_bold,
    significance_marks,
)
from reports.results import Results
from reports.row_cache import RowCache


@dataclass
class Report:
    """What the jobs read: the results and their statistics, where to write, which formats."""

    results: Results
    paired: PairedStats | None  # None until the statistics are computed (:func:`started`)
    options: ReportOptions
    published: pd.DataFrame | None
    out: Path
    formats: set[str]
    rows: RowCache
    title: str
    results_written: bool = False  # cells.csv and leaderboard.csv already (write_result_tables)


_RESULT_TABLES = ("leaderboard.csv", "cells.csv")


def write_result_tables(r: Report) -> dict[str, Any]:
    """``leaderboard.csv`` and ``cells.csv`` (if ``r.formats`` asks for CSV): the tables that
    need no statistics; returns their CSV spans for the row cache."""
    if "csv" in r.formats:
        # The rows that did not change since the last report are not formatted again.
        write_csv(r.results.summary, r.out / "leaderboard.csv", r.rows)
        write_csv(r.results.cells, r.out / "cells.csv", r.rows)
    return {k: r.rows.new_csv[k] for k in _RESULT_TABLES if k in r.rows.new_csv}


def write_tables(r: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    """The CSVs, the Markdown and the LaTeX (those ``r.formats`` asks; cells.csv and
    leaderboard.csv unless ``r.results_written``); returns the row cache's entries (rows, CSV
    spans) for the next report."""
    if not r.results_written:
        write_result_tables(r)
    if "csv" in r.formats:
        write_csv(r.paired.frame, r.out / "paired.csv", r.rows)
        if r.published is not None:
            r.published.to_csv(r.out / "published.csv", index=False)
    if "md" in r.formats:
        md = render_markdown(r.results, r.title, r.paired, r.options, r.published, r.rows)
        (r.out / "leaderboard.md").write_text(md, encoding="utf-8")
    if "latex" in r.formats:
        from reports.latex import render_latex

        tex = render_latex(r.results, r.paired, r.options)
        (r.out / "leaderboard.tex").write_text(tex, encoding="utf-8")
    return r.rows.new, r.rows.new_csv


def _tables_in_worker(
    paired: PairedStats, results_written: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    return write_tables(replace(forked.shared(), paired=paired, results_written=results_written))


def _figure_in_worker(fid: str) -> RenderedFigure:
    r: Report = forked.shared()
    return draw_figure(fid, r.results.cells, r.out)


def _results_job(r: Report, test: str, alpha: float) -> tuple[dict[str, set[Any]], dict]:
    """What needs only the results: the bold cells and the tables of :func:`write_result_tables`
    (their CSV spans returned)."""
    return compute_bold(r.results, test, alpha), write_result_tables(r)


def _results_in_worker(test: str, alpha: float) -> tuple[dict[str, set[Any]], dict]:
    return _results_job(forked.shared(), test, alpha)


def _statistics(r: Report) -> None:
    """The statistics the page and the tables both show (bold cells, marks, the paired table),
    computed once, here, before the tables go to a worker (:mod:`reports.paired_view` keeps
    them in ``r.paired.memo``, which goes with them), not once in each process."""
    summary = r.results.summary
    if len(summary):
        bold_cells(r.paired, r.results)
        for hidden in (True, False):  # the page's columns, the Markdown's
            significance_marks(r.paired, leaderboard_columns(summary, hidden=hidden))
        paired_context(r.paired, summary, r.rows)


@dataclass
class Jobs:
    """The report's jobs once :func:`started`: the figures being drawn."""

    base: Report
    figures: FigurePlan | None
    executor: Any
    drawing: dict[str, Any]
    bold: tuple[str, float, Any] | None = None  # (test, alpha, the worker's bold cells)

    def finish(
        self, paired: PairedStats, page: Callable[[], dict[str, Any]]
    ) -> tuple[dict[str, Any], list[RenderedFigure]]:
        """(``page()``, the report's figures), the tables written (with ``paired``): in a worker
        while ``page()`` runs here when no figure is being drawn, else here after it."""
        r = replace(self.base, paired=paired)
        if self.bold is not None:
            bold, spans = forked.collect(self.bold[2], _results_job, r, *self.bold[:2])
            self.base.rows.new_csv.update(spans)
            r.results_written = True
            if self.bold[:2] == (paired.test, paired.alpha):
                set_bold(paired, r.results, bold)
        tables = None
        if self.executor is not None and not self.drawing:
            _statistics(r)
            tables = forked.start(self.executor, _tables_in_worker, paired, r.results_written)
        context = page()
        rows, csv_spans = forked.collect(tables, write_tables, r)
        self.base.rows.new.update(rows)  # (the same dicts when this process wrote the tables)
        self.base.rows.new_csv.update(csv_spans)
        drawn = {
            fid: forked.collect(future, draw_figure, fid, r.results.cells, r.out)
            for fid, future in self.drawing.items()
        }
        return context, self.figures.finish(drawn) if self.figures is not None else []


@contextmanager
def started(base: Report, figures: FigurePlan | None, parallel: bool) -> Iterator[Jobs]:
    """The figures of ``figures`` being drawn by forked workers (``parallel``, where that is
    safe), and a worker ready for the tables when there is none to draw and the row cache is
    cold; ``base`` is the report without its statistics (``paired`` None). Leaving waits for the
    workers."""
    todo = figures.todo if figures is not None else []
    # No figure to draw and the rows of the last report at hand: what is left (the statistics
    # of a few changed configurations, the tables' few new rows) costs less than a worker's
    # fork (its copy-on-write page faults slowed this process by more than the worker saved).
    light = not todo and bool(base.rows.old)
    workers = min(len(todo) or 1, forked.cores()) if parallel and not light else 0
    with forked.pool(workers, shared=base) as executor:
        drawing = {fid: forked.start(executor, _figure_in_worker, fid) for fid in todo}
        bold = None
        if executor is not None and not todo:  # an idle worker: bold cells, CSVs, meanwhile
            test, alpha = base.options.test, 1 - LEVEL  # what paired_stats will use
            bold = (test, alpha, forked.start(executor, _results_in_worker, test, alpha))
        yield Jobs(base, figures, executor, drawing, bold)
