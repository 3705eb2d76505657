"""The leaderboard: a self-contained HTML page, plus CSV and Markdown tables, from a results folder.

``write_report(results_dir)`` writes ``leaderboard.html`` (inline CSS/JS, figures as data URIs, a
Content-Security-Policy that forbids any network access, every value escaped by Jinja2's
autoescape), ``leaderboard.csv`` (one row per configuration: ``<metric>_mean/_std/_n`` for every
metric), ``cells.csv`` (one row per cell) and ``leaderboard.md``.

Stable hooks for tests and scripts: ``table#leaderboard`` with ``th.sortable[data-col]`` headers and
``tr.lb-row[data-dataset][data-backbone][data-m]`` rows whose ``td[data-col][data-value]`` hold the
raw mean; ``select#filter-dataset``, ``#filter-backbone``, ``#filter-M``; ``#row-count``;
``td.best``; ``table#problems`` (``tr.problem[data-status]``); ``#provenance``; ``#conventions``.
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
)
from reports.figures import RenderedFigure, render_figures

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


def _m_text(m: Any) -> str:
    return "" if m is None or (isinstance(m, float) and math.isnan(m)) else f"{float(m):g}"


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


def _context(results: Results, figures: list[RenderedFigure], title: str) -> dict[str, Any]:
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
    rows = []
    for idx, r in summary.iterrows():
        cells = []
        for k, _, t in identity:
            if k == "M":
                text = value = _m_text(r["M"])
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
                }
            )
        for c in columns:
            mean, std, n = r[f"{c.key}_mean"], r[f"{c.key}_std"], r[f"{c.key}_n"]
            text = format_cell(mean, std, n, c.kind, show_n=False)
            finite = isinstance(mean, float | int) and math.isfinite(mean)
            cells.append(
                {
                    "key": c.key,
                    "text": text,
                    "value": repr(float(mean)) if finite else "",
                    "group": c.group,
                    "num": True,
                    "best": idx in best.get(c.key, ()),
                    "n": int(n) if text != "–" else None,
                    "title": "" if not finite else f"mean {mean:.6g}, std {std:.3g}, n {int(n)}",
                }
            )
        rows.append(
            {
                "dataset": r["dataset"],
                "backbone": r["backbone"],
                "m": _m_text(r["M"]),
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
        "directions": {
            d: sorted(k for k, v in DIRECTIONS.items() if v == d) for d in ("higher", "lower")
        },
    }


def render_html(
    results: Results, figures: list[RenderedFigure] | None = None, title: str | None = None
) -> str:
    """The leaderboard page as a string (figures rendered from ``results.cells`` unless given)."""
    if figures is None:
        figures = render_figures(results.cells)
    title = title or "Leaderboard — " + (", ".join(results.suites) or "no records")
    return (
        _environment()
        .get_template("leaderboard.html.j2")
        .render(**_context(results, figures, title))
    )


def _md_escape(text: str) -> str:
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
        .replace("\n", " ")
    )


def render_markdown(results: Results, title: str | None = None) -> str:
    """The leaderboard as a Markdown (GFM) table; best values per dataset in bold."""
    summary = results.summary
    title = title or "Leaderboard — " + (", ".join(results.suites) or "no records")
    lines = [f"# {_md_escape(title)}", ""]
    if len(summary):
        columns = leaderboard_columns(summary)
        best = best_rows(summary, columns)
        arrow = {"higher": " ↑", "lower": " ↓", None: ""}
        head = ["dataset", "backbone", "method", "M", "hparams", "n"]
        if summary["variant"].astype(bool).any():
            head.insert(5, "variant")
        lines.append("| " + " | ".join(head + [c.label + arrow[c.better] for c in columns]) + " |")
        lines.append("|" + "|".join(["---"] * len(head) + ["---:"] * len(columns)) + "|")
        for idx, r in summary.iterrows():
            ident = [
                _m_text(r[k]) if k == "M" else _n_text(r) if k == "n" else str(r[k]) for k in head
            ]
            vals = []
            for c in columns:
                text = format_cell(r[f"{c.key}_mean"], r[f"{c.key}_std"], r[f"{c.key}_n"], c.kind)
                vals.append(f"**{text}**" if idx in best.get(c.key, ()) else text)
            lines.append("| " + " | ".join(_md_escape(v) for v in ident + vals) + " |")
        lines += [
            "",
            "Mean ± sample std over seeds (n). ↑/↓: better direction; **bold**: best per dataset.",
        ]
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
            f"| {p.status} | {_md_escape(p.cell_id)} | {_md_escape(p.config)} | "
            f"{_md_escape(p.reason)} |"
            for p in results.problems
        ]
    if results.provenance:
        lines += ["", "## Provenance", ""]
        lines += [
            f"- {_md_escape(k)}: {_md_escape('; '.join(v))}" for k, v in results.provenance.items()
        ]
    if results.conventions:
        lines += ["", "## Conventions", ""]
        lines += [
            f"- {_md_escape(k)}: {_md_escape(' | '.join(v))}"
            for k, v in results.conventions.items()
        ]
    return "\n".join(lines) + "\n"


def write_report(
    results_dir: Path | str,
    out_dir: Path | str | None = None,
    *,
    expected: Iterable[Any] | None = None,
    figures: bool = True,
) -> Path:
    """Write leaderboard.html/.csv/.md and cells.csv to ``out_dir`` (default: ``results_dir``).

    ``expected`` (cell ids, config mappings, or objects with ``cell_id``/``config``) lists the
    cells that should exist; those without a record are reported as missing. Returns the path of
    ``leaderboard.html``.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir
    results = load_results(results_dir, expected=expected, ignore=[out])
    out.mkdir(parents=True, exist_ok=True)
    rendered = render_figures(results.cells) if figures else []
    html_path = out / "leaderboard.html"
    html_path.write_text(render_html(results, rendered), encoding="utf-8")
    results.summary.to_csv(out / "leaderboard.csv", index=False)
    results.cells.to_csv(out / "cells.csv", index=False)
    (out / "leaderboard.md").write_text(render_markdown(results), encoding="utf-8")
    return html_path


__all__ = ["best_rows", "format_number", "render_html", "render_markdown", "write_report"]
