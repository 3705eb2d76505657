"""The leaderboard: a self-contained HTML page, plus CSV and Markdown tables, from a results folder.

``write_report(results_dir)`` writes ``leaderboard.html`` (inline CSS/JS, figures as data URIs, a
Content-Security-Policy that forbids any network access, every value escaped by Jinja2's
autoescape), ``leaderboard.csv`` (one row per configuration: ``<metric>_mean/_std/_n`` for every
metric), ``cells.csv`` (one row per cell), ``paired.csv``
(:func:`reports.stats.paired.paired_differences`
against the reference method, one row per configuration × reference configuration × metric) and
``leaderboard.md``; every figure also as ``<id>.png`` beside the page; with ``formats``
containing ``latex``, a paper's files: ``leaderboard.tex`` (:mod:`reports.render.latex`) and every
figure as ``<id>.pdf``; with published values (:mod:`reports.render.published`),
``published.csv``. Everything is written again on every report; only the records are read
through the record index (:mod:`reports.records.index`).

Stable hooks for tests and scripts: ``table#leaderboard`` with ``th.sortable[data-col]`` headers and
``tr.lb-row[data-dataset][data-backbone][data-m]`` rows whose ``td[data-col][data-value]`` hold the
raw mean (and ``data-config``: the configuration, also on its paired rows);
``select#filter-dataset``, ``#filter-backbone``, ``#filter-M``; ``#row-count`` (rows matching the
filters, of all); ``#pager`` with ``button#page-prev``, ``#page-next`` and ``#page-info`` (100
rows a page, shown above 100 rows: the filters select among all rows, a page shows 100 of them and
the paired table the rows of those configurations);
``td.best`` (the best and every configuration not significantly different from it,
:mod:`reports.stats.bolding`; ``p#bold-note`` above the table names the columns left without
bold because no comparison in them could reach significance); ``#count-done`` (trained cells
done) and ``#count-posthoc`` (the ``single+TS`` rows derived from them);
``details#column-picker`` with ``input.col-toggle[data-col]`` (columns hidden by default carry
``hidden`` on their ``th``/``td``); ``select#interval-view`` (``std`` or
``ci``: each metric ``td`` holds ``data-std`` and ``data-ci`` texts); a throughput cell measured on
a shared device is ``td.shared`` (title: the reason); ``section#corruptions`` with
``table#corruption-table``; ``section#published`` with ``table#published-table``;
``table#problems`` (``tr.problem[data-status]``); ``#provenance``; ``#conventions``.
Paired statistics: ``section#paired`` holds ``table#paired-table`` with
``tr.paired-row[data-dataset][data-backbone][data-m][data-method][data-reference]`` rows whose
``td.delta[data-col][data-value][data-lo][data-hi][data-n]`` hold the mean difference and its
interval; a significant one is ``td.sig.better`` or ``td.sig.worse`` with a ``span.sig-mark``
(▲ better, ▼ worse). In ``table#leaderboard`` a mean whose difference to the reference is
significant gets ``td.sig.sig-better`` (or ``sig-worse``) and the same ``span.sig-mark`` (its
title: the difference and interval).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import pandas as pd

from harness.contract import RECORD_FILE
from reports.records.index import load_results
from reports.records.results import Results
from reports.render.markdown import render_markdown as _markdown
from reports.render.page import ReportOptions, context, shown_results
from reports.render.paired import PairedStats, paired_stats, resolve_reference

if TYPE_CHECKING:  # the figures import seaborn and matplotlib: only when drawing
    from reports.figures.base import RenderedFigure

TEMPLATES = Path(__file__).parent / "templates"
FORMATS = ("html", "csv", "md", "latex")


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value, whatever the template's file name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _prepare(
    results: Results,
    reference: str | None,
    paired: PairedStats | None,
    options: ReportOptions | None,
) -> tuple[Results, PairedStats, ReportOptions]:
    options = options or ReportOptions()
    if results.mce_baseline != options.mce_baseline:
        results = results.with_mce_baseline(options.mce_baseline)
    if paired is None:
        paired = paired_stats(results, reference, test=options.test, holm=options.holm)
    return shown_results(results), paired, options


def _title(results: Results, title: str | None) -> str:
    return title or "Leaderboard — " + (", ".join(results.suites) or "no records")


def render_html(
    results: Results,
    figures: list[RenderedFigure] | None = None,
    title: str | None = None,
    *,
    reference: str | None = None,
    paired: PairedStats | None = None,
    options: ReportOptions | None = None,
    published: pd.DataFrame | None = None,
) -> str:
    """The leaderboard page as a string (figures rendered from ``results.cells`` unless given).

    ``paired`` (from :func:`paired_stats`) is computed against ``reference`` with the test of
    ``options`` unless given; ``published`` (:func:`reports.render.published.compare`) adds the
    published-vs-measured table.
    """
    results, paired, options = _prepare(results, reference, paired, options)
    if figures is None:
        from reports.figures.draw import render_figures  # matplotlib: only when drawing

        figures = render_figures(results.cells)
    page = _page_context(results, paired, options, published, title)
    return _render_page({**page, "figures": figures})


def _page_context(
    results: Results,
    paired: PairedStats,
    options: ReportOptions,
    published: pd.DataFrame | None,
    title: str | None = None,
) -> dict[str, Any]:
    """What the page's template renders but the figures (:func:`reports.render.page.context`)."""
    from reports.render.published import published_context

    extra = {"published": published_context(published)}
    return context(results, [], _title(results, title), paired, options, extra)


def _render_page(ctx: dict[str, Any]) -> str:
    return _environment().get_template("leaderboard.html.j2").render(**ctx)


def render_markdown(
    results: Results,
    title: str | None = None,
    *,
    reference: str | None = None,
    paired: PairedStats | None = None,
    options: ReportOptions | None = None,
    published: pd.DataFrame | None = None,
) -> str:
    """The leaderboard as a Markdown (GFM) table, then the paired differences to the reference.

    Bold: the best per dataset and every configuration not significantly different from it; a
    mean whose difference to the reference is significant carries ▲ (better) or ▼ (worse).
    """
    results, paired, options = _prepare(results, reference, paired, options)
    return _markdown(results, _title(results, title), paired, options, published)


def _write_csv(out: Path, results: Results, paired: PairedStats, pub: pd.DataFrame | None) -> None:
    """``leaderboard.csv``, ``cells.csv``, ``paired.csv`` and, with published values,
    ``published.csv``."""
    results.summary.to_csv(out / "leaderboard.csv", index=False)
    results.cells.to_csv(out / "cells.csv", index=False)
    paired.frame.to_csv(out / "paired.csv", index=False)
    if pub is not None:
        pub.to_csv(out / "published.csv", index=False)


def write_report(
    results_dir: Path | str,
    out_dir: Path | str | None = None,
    *,
    expected: Iterable[Any] | None = None,
    figures: bool = True,
    reference: str | None = None,
    options: ReportOptions | None = None,
    formats: Iterable[str] = ("html", "csv", "md"),
    published: Path | str | None = None,
    index: bool = True,
    left_out: list[str] | None = None,
) -> Path:
    """Write the report files (see the module docstring) to ``out_dir``; return leaderboard.html.

    ``out_dir`` defaults to ``results_dir``. ``expected`` (cell ids, config mappings, or objects
    with ``cell_id``/``config``) lists the cells that should exist; those without a record are
    reported as missing. ``reference`` is the method every configuration is compared with, seed by
    seed (default ``deep_ensemble``, else ``single``, else no statistics; ``paired.csv`` then has
    only its header). ``published`` is a published-values CSV; None looks for
    ``<suite-stem>.published.csv`` next to the suite file the results name
    (:func:`reports.render.published.find_published`). The HTML is always written. ``index`` keeps
    the flattened records in ``.report-index.npz`` beside the results
    (:mod:`reports.records.index`), so the next report reads only the records that changed;
    ``figures`` False draws none. ``left_out``, a list, receives the ids of the cells whose
    record is there but could not be read (damaged: each is named in a warning line too).
    """
    from reports.render.published import compare, find_published, read_published

    formats = set(formats) | {"html"}
    unknown = sorted(formats - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown format(s) {', '.join(unknown)}; expected: {', '.join(FORMATS)}")
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir
    results = load_results(results_dir, expected=expected, ignore=[out], index=index)
    for p in results.problems:  # damaged records: named on the terminal too, not only the page
        if p.status == "invalid":
            why = p.reason.removeprefix("DamagedRecord: ")  # it names the file already
            if RECORD_FILE not in why:
                why = f"{results_dir / p.cell_id / RECORD_FILE}: {why}"
            print(f"warning: {why}; left out of the report", file=sys.stderr)
            if left_out is not None:
                left_out.append(p.cell_id)
    # Everything that can fail on bad input before anything is written.
    options = options or ReportOptions()
    if results.mce_baseline != options.mce_baseline:
        results = results.with_mce_baseline(options.mce_baseline)
    # Every file leaves out the scores a single model cannot have (its MI-AUROC, disagreement:
    # reports.columns.without_ensemble_only); the records keep them. Once: bold cells too.
    results = shown_results(results)
    reference = resolve_reference(results, reference, options.test)
    pub_path = Path(published) if published is not None else find_published(results_dir)
    pub = compare(results, read_published(pub_path), options) if pub_path else None
    out.mkdir(parents=True, exist_ok=True)
    paired = paired_stats(results, reference, test=options.test, holm=options.holm)
    title = _title(results, None)
    if "csv" in formats:
        _write_csv(out, results, paired, pub)
    if "md" in formats:
        md = _markdown(results, title, paired, options, pub)
        (out / "leaderboard.md").write_text(md, encoding="utf-8")
    if "latex" in formats:
        from reports.render.latex import render_latex

        (out / "leaderboard.tex").write_text(
            render_latex(results, paired, options), encoding="utf-8"
        )
    rendered: list[RenderedFigure] = []
    if figures:
        # Next to the HTML (a sub-folder would read as a cell). matplotlib: only when drawing.
        from reports.figures.draw import render_figures, write_figure_files

        rendered = render_figures(results.cells)
        write_figure_files(rendered, out, pdf="latex" in formats)
    page = _page_context(results, paired, options, pub)
    html_path = out / "leaderboard.html"
    html_path.write_text(_render_page({**page, "figures": rendered}), encoding="utf-8")
    return html_path
