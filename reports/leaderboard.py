"""The leaderboard: a self-contained HTML page, plus CSV and Markdown tables, from a results folder.

``write_report(results_dir)`` writes ``leaderboard.html`` (inline CSS/JS, figures as data URIs, a
Content-Security-Policy that forbids any network access, every value escaped by Jinja2's
autoescape), ``leaderboard.csv`` (one row per configuration: ``<metric>_mean/_std/_n`` for every
metric), ``cells.csv`` (one row per cell), ``paired.csv`` (:func:`reports.stats.paired_differences`
against the reference method, one row per configuration × reference configuration × metric) and
``leaderboard.md``.

Stable hooks for tests and scripts: ``table#leaderboard`` with ``th.sortable[data-col]`` headers and
``tr.lb-row[data-dataset][data-backbone][data-m]`` rows whose ``td[data-col][data-value]`` hold the
raw mean; ``select#filter-dataset``, ``#filter-backbone``, ``#filter-M``; ``#row-count``;
``td.best``; ``table#problems`` (``tr.problem[data-status]``); ``#provenance``; ``#conventions``.
Paired statistics: ``section#paired`` holds ``table#paired-table`` with
``tr.paired-row[data-dataset][data-backbone][data-m][data-method][data-reference]`` rows whose
``td.delta[data-col][data-value][data-lo][data-hi][data-n]`` hold the mean difference and its
interval; a significant one is ``td.sig.better`` or ``td.sig.worse`` with a ``span.sig-mark``
(▲ better, ▼ worse). In ``table#leaderboard`` a mean whose difference to the reference is
significant gets ``td.sig.sig-better`` (or ``sig-worse``) and the same ``span.sig-mark`` (its
title: the difference and interval).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd

from reports.aggregate import (
    CORRUPTION,
    COST,
    DIRECTIONS,
    DIVERSITY,
    QUALITY,
    Column,
    Results,
    format_cell,
    format_number,
    leaderboard_columns,
    load_results,
    m_text,
)
from reports.figures import RenderedFigure, render_figures
from reports.paired_view import (
    PairedStats,
    format_delta,
    group_key,
    markdown_paired,
    md_escape,
    paired_context,
    paired_stats,
    significance_marks,
)

TEMPLATES = Path(__file__).parent / "templates"
AGGREGATION = (
    "cells that differ only in seed are one configuration; each cell shows the mean ± sample "
    "standard deviation (ddof=1) over its seeds and, in parentheses, n = the number of seeds with "
    "a finite value (NaN/inf from a diverged run are left out and counted in the n column); "
    "failed cells are listed below and not averaged"
)
GROUP_TITLES = {
    "OOD": "OOD detection (MSP score, ID positive)",
    "Corruption": "Corruption (mean over corruptions × severities)",
}
IDENTITY = (
    ("dataset", "dataset", "text"),
    ("backbone", "backbone", "text"),
    ("method", "method", "text"),
    ("M", "M", "num"),
    ("hparams", "hparams", "text"),
    ("variant", "variant", "text"),
    ("n", "n", "num"),
)


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value, whatever the template's file name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def best_rows(summary: pd.DataFrame, columns: Iterable[Column], within: str = "dataset"):
    """Per column key, the summary row labels holding the best mean within each ``within`` group.

    Only groups with two or more finite values are considered; ties are all best.
    """
    out: dict[str, set[Any]] = {}
    for c in columns:
        if c.better is None:
            continue
        values = summary[f"{c.key}_mean"].astype(float)
        for _, idx in summary.groupby(within, dropna=False).groups.items():
            v = values.loc[idx]
            v = v[np.isfinite(v)]
            if len(v) < 2:
                continue
            best = v.max() if c.better == "higher" else v.min()
            out.setdefault(c.key, set()).update(v.index[v == best])
    return out


def _n_text(row: pd.Series) -> str:
    extra = []
    if row.get("n_nonfinite", 0):
        extra.append(f"{int(row['n_nonfinite'])} diverged")
    if row.get("n_failed", 0):
        extra.append(f"{int(row['n_failed'])} failed")
    return f"{int(row['n'])}" + (f" ({', '.join(extra)})" if extra else "")


def _context(
    results: Results, figures: list[RenderedFigure], title: str, paired: PairedStats
) -> dict[str, Any]:
    summary = results.summary
    columns = leaderboard_columns(summary)
    show_variant = bool(len(summary)) and summary["variant"].astype(bool).any()
    identity = [i for i in IDENTITY if i[0] != "variant" or show_variant]
    header = [
        {
            "key": k,
            "label": label,
            "type": t,
            "group": "Configuration",
            "better": None,
            "title": "seeds: done cells averaged" if k == "n" else k,
        }
        for k, label, t in identity
    ] + [
        {
            "key": c.key,
            "label": c.label,
            "type": "num",
            "group": c.group,
            "better": c.better,
            "title": f"{c.key}; {c.better or 'no'} is better"
            if c.better
            else f"{c.key}; diagnostic",
        }
        for c in columns
    ]
    groups: list[dict[str, Any]] = []
    for h in header:
        if groups and groups[-1]["name"] == h["group"]:
            groups[-1]["span"] += 1
        else:
            groups.append(
                {"name": h["group"], "span": 1, "title": GROUP_TITLES.get(h["group"], h["group"])}
            )
    best = best_rows(summary, columns)
    significance = significance_marks(paired, columns)
    rows = []
    for idx, r in summary.iterrows():
        key = group_key(r)
        cells = []
        for k, _, t in identity:
            if k == "M":
                text = value = m_text(r["M"])
            elif k == "n":
                text, value = _n_text(r), str(int(r["n"]))
            else:
                text = value = str(r[k])
            cells.append(
                {
                    "key": k,
                    "text": text,
                    "value": value,
                    "group": "Configuration",
                    "num": t == "num",
                    "best": False,
                    "n": None,
                    "title": "",
                    "sig": [],
                }
            )
        for c in columns:
            mean, std, n = r[f"{c.key}_mean"], r[f"{c.key}_std"], r[f"{c.key}_n"]
            text = format_cell(mean, std, n, c.kind, show_n=False)
            finite = isinstance(mean, float | int) and math.isfinite(mean)
            sig = significance.get((*key, c.key), [])
            tip = "" if not finite else f"mean {mean:.6g}, std {std:.3g}, n {int(n)}"
            cells.append(
                {
                    "key": c.key,
                    "text": text,
                    "value": repr(float(mean)) if finite else "",
                    "group": c.group,
                    "num": True,
                    "best": idx in best.get(c.key, ()),
                    "n": int(n) if text != "–" else None,
                    "title": "; ".join([tip, *(t for _, _, t in sig)]).strip("; "),
                    "sig": [{"cls": cls, "symbol": sym} for cls, sym, _ in sig],
                }
            )
        rows.append(
            {
                "dataset": r["dataset"],
                "backbone": r["backbone"],
                "m": m_text(r["M"]),
                "cells": cells,
            }
        )
    m_values = sorted({float(m) for m in summary["M"] if pd.notna(m)}) if len(summary) else []
    filters = [
        {
            "id": "filter-dataset",
            "label": "Dataset",
            "attr": "dataset",
            "options": sorted(set(summary["dataset"])) if len(summary) else [],
        },
        {
            "id": "filter-backbone",
            "label": "Backbone",
            "attr": "backbone",
            "options": sorted(set(summary["backbone"])) if len(summary) else [],
        },
        {"id": "filter-M", "label": "M", "attr": "m", "options": [f"{m:g}" for m in m_values]},
    ]
    shown = {c.key for c in columns}
    dropped = [c.label for c in (*QUALITY, *COST, *CORRUPTION, *DIVERSITY) if c.key not in shown]
    status = [p.status for p in results.problems]
    return {
        "title": title,
        "source": results.source,
        "counts": {
            "groups": len(summary),
            "done": results.n_done,
            "failed": status.count("failed"),
            "invalid": status.count("invalid"),
            "missing": status.count("missing"),
        },
        "filters": filters,
        "header": header,
        "header_groups": groups,
        "rows": rows,
        "dropped": dropped,
        "figures": figures,
        "problems": results.problems,
        "provenance": results.provenance,
        "conventions": results.conventions,
        "aggregation": AGGREGATION,
        "paired": paired_context(paired, summary),
        "directions": {
            d: sorted(k for k, v in DIRECTIONS.items() if v == d) for d in ("higher", "lower")
        },
    }


def render_html(
    results: Results,
    figures: list[RenderedFigure] | None = None,
    title: str | None = None,
    *,
    reference: str | None = None,
    paired: PairedStats | None = None,
) -> str:
    """The leaderboard page as a string (figures rendered from ``results.cells`` unless given).

    ``paired`` (from :func:`paired_stats`) is computed against ``reference`` unless given.
    """
    if figures is None:
        figures = render_figures(results.cells)
    if paired is None:
        paired = paired_stats(results, reference)
    title = title or "Leaderboard — " + (", ".join(results.suites) or "no records")
    return (
        _environment()
        .get_template("leaderboard.html.j2")
        .render(**_context(results, figures, title, paired))
    )


def render_markdown(
    results: Results,
    title: str | None = None,
    *,
    reference: str | None = None,
    paired: PairedStats | None = None,
) -> str:
    """The leaderboard as a Markdown (GFM) table; best values per dataset in bold.

    Followed by the paired differences to the reference method (see :func:`paired_stats`); a
    mean whose difference is significant carries ▲ (better) or ▼ (worse).
    """
    summary = results.summary
    if paired is None:
        paired = paired_stats(results, reference)
    title = title or "Leaderboard — " + (", ".join(results.suites) or "no records")
    lines = [f"# {md_escape(title)}", ""]
    if len(summary):
        columns = leaderboard_columns(summary)
        best = best_rows(summary, columns)
        significance = significance_marks(paired, columns)
        arrow = {"higher": " ↑", "lower": " ↓", None: ""}
        head = ["dataset", "backbone", "method", "M", "hparams", "n"]
        if summary["variant"].astype(bool).any():
            head.insert(5, "variant")
        lines.append("| " + " | ".join(head + [c.label + arrow[c.better] for c in columns]) + " |")
        lines.append("|" + "|".join(["---"] * len(head) + ["---:"] * len(columns)) + "|")
        for idx, r in summary.iterrows():
            ident = [
                m_text(r[k]) if k == "M" else _n_text(r) if k == "n" else str(r[k]) for k in head
            ]
            vals = []
            for c in columns:
                text = format_cell(r[f"{c.key}_mean"], r[f"{c.key}_std"], r[f"{c.key}_n"], c.kind)
                text = f"**{text}**" if idx in best.get(c.key, ()) else text
                marks = "".join(m for _, m, _ in significance.get((*group_key(r), c.key), []))
                vals.append(f"{text} {marks}" if marks else text)
            lines.append("| " + " | ".join(md_escape(v) for v in ident + vals) + " |")
        lines += [
            "",
            "Mean ± sample std over seeds (n). ↑/↓: better direction; **bold**: best per dataset.",
        ]
        if paired.reference is not None:
            lines[-1] += (
                f" ▲/▼: significantly better/worse than {md_escape(paired.reference)} "
                "(paired differences below)."
            )
        lines += markdown_paired(paired, summary)
    else:
        lines.append("No done cells.")
    if results.problems:
        lines += [
            "",
            "## Failed and missing cells",
            "",
            "| status | cell | configuration | reason |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {p.status} | {md_escape(p.cell_id)} | {md_escape(p.config)} | "
            f"{md_escape(p.reason)} |"
            for p in results.problems
        ]
    if results.provenance:
        lines += ["", "## Provenance", ""]
        lines += [
            f"- {md_escape(k)}: {md_escape('; '.join(v))}" for k, v in results.provenance.items()
        ]
    if results.conventions:
        lines += ["", "## Conventions", ""]
        lines += [
            f"- {md_escape(k)}: {md_escape(' | '.join(v))}" for k, v in results.conventions.items()
        ]
    return "\n".join(lines) + "\n"


def write_report(
    results_dir: Path | str,
    out_dir: Path | str | None = None,
    *,
    expected: Iterable[Any] | None = None,
    figures: bool = True,
    reference: str | None = None,
) -> Path:
    """Write leaderboard.html/.csv/.md, cells.csv and paired.csv to ``out_dir``.

    ``out_dir`` defaults to ``results_dir``. ``expected`` (cell ids, config mappings, or objects
    with ``cell_id``/``config``) lists the cells that should exist; those without a record are
    reported as missing. ``reference`` is the method every configuration is compared with, seed by
    seed (default ``deep_ensemble``, else ``single``, else no statistics; ``paired.csv`` then has
    only its header). Returns the path of ``leaderboard.html``.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir
    results = load_results(results_dir, expected=expected, ignore=[out])
    paired = paired_stats(results, reference)  # before writing: a bad reference writes nothing
    out.mkdir(parents=True, exist_ok=True)
    rendered = render_figures(results.cells) if figures else []
    html_path = out / "leaderboard.html"
    html_path.write_text(render_html(results, rendered, paired=paired), encoding="utf-8")
    results.summary.to_csv(out / "leaderboard.csv", index=False)
    results.cells.to_csv(out / "cells.csv", index=False)
    paired.frame.to_csv(out / "paired.csv", index=False)
    (out / "leaderboard.md").write_text(render_markdown(results, paired=paired), encoding="utf-8")
    return html_path


__all__ = [
    "PairedStats",
    "best_rows",
    "format_delta",
    "format_number",
    "paired_stats",
    "render_html",
    "render_markdown",
    "write_report",
]
