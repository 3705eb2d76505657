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
from dataclasses import dataclass
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
from reports.stats import COLUMNS as PAIRED_COLUMNS
from reports.stats import default_reference, paired_differences

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


@dataclass
class PairedStats:
    """The paired differences a report shows: against which method, at which confidence level."""

    reference: str | None  # None: no reference method in the results, no statistics section
    frame: pd.DataFrame  # reports.stats.paired_differences (empty without a reference)
    level: float = 0.95
    n_resamples: int = 10_000

    @property
    def title(self) -> str:
        return f"Δ vs {self.reference}, mean over paired seeds, {100 * self.level:g}% bootstrap CI"


def paired_stats(
    results: Results,
    reference: str | None = None,
    *,
    level: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> PairedStats:
    """Paired differences of every configuration to ``reference`` (see :mod:`reports.stats`).

    ``reference`` None picks ``deep_ensemble`` if it has done cells, else ``single``, else none
    (no statistics). A named reference without done cells is an error, not a silent omission.
    """
    cells = results.cells
    if reference is None:
        reference = default_reference(cells)
    elif reference not in set(cells.loc[cells["status"] == "done", "method"]):
        methods = sorted(set(cells.loc[cells["status"] == "done", "method"]))
        raise ValueError(
            f"reference method {reference!r} has no done cells in these results "
            f"(methods: {', '.join(methods) or 'none'})"
        )
    if reference is None:
        frame = pd.DataFrame(columns=list(PAIRED_COLUMNS))
    else:
        frame = paired_differences(
            cells, reference, n_resamples=n_resamples, level=level, seed=seed
        )
    return PairedStats(reference, frame, level, n_resamples)


def _group_key(row: Any) -> tuple:
    return tuple(
        _m_text(row["M"]) if k == "M" else str(row[k])
        for k in ("dataset", "backbone", "method", "M", "hparams", "variant")
    )


def format_delta(value: Any, kind: str) -> str:
    """A signed difference in a column's format (``pct``: percentage points): ``+5.00``."""
    text = format_number(value, kind)
    if text not in ("–", "inf") and float(value) > 0:
        text = "+" + text
    return text


def _delta_text(r: Any, kind: str) -> str:
    text = format_delta(r["mean_diff"], kind)
    if pd.isna(r["ci_lo"]):
        return f"{text} [–]"
    return f"{text} [{format_delta(r['ci_lo'], kind)}, {format_delta(r['ci_hi'], kind)}]"


def _sig(r: Any) -> tuple[str, str, str] | None:
    """(class, symbol, words) for a significant difference; None otherwise."""
    if not r["significant"]:
        return None
    if pd.isna(r["better"]):
        return "neutral", "◆", "significant difference (metric without a better direction)"
    if r["better"]:
        return "better", "▲", "significantly better than the reference"
    return "worse", "▼", "significantly worse than the reference"


def _delta_label(column: Column) -> str:
    label = column.label.replace(" (%)", "")
    return f"Δ {label} (pp)" if column.kind == "pct" else f"Δ {label}"


def _paired_columns(paired: PairedStats, summary: pd.DataFrame) -> list[Column]:
    known = {c.key: c for c in (*QUALITY, *CORRUPTION, *leaderboard_columns(summary))}
    metrics = list(dict.fromkeys(paired.frame["metric"]))
    return [known.get(m, Column(m, m, "", "f3")) for m in metrics]


def _paired_rows(paired: PairedStats, columns: list[Column]) -> list[dict[str, Any]]:
    """One row per configuration × reference configuration, one cell per metric."""
    frame = paired.frame
    if frame.empty:
        return []
    rows = []
    keys = ["dataset", "backbone", "method", "M", "hparams", "variant", "reference"]
    kinds = {c.key: c.kind for c in columns}
    for _, part in frame.groupby(keys, sort=False, dropna=False):
        first = part.iloc[0]
        by_metric = {r["metric"]: r for _, r in part.iterrows()}
        n = int(part["n_pairs"].max())
        cells = []
        for c in columns:
            r = by_metric.get(c.key)
            if r is None:
                cells.append({"key": c.key, "text": "–", "value": "", "lo": "", "hi": ""})
                cells[-1].update({"n": "", "sig": None, "title": "no paired seeds", "extra": ""})
                continue
            sig = _sig(r)
            lo, hi = r["ci_lo"], r["ci_hi"]
            ci = (
                "no interval from a single pair"
                if pd.isna(lo)
                else f"{100 * paired.level:g}% CI [{lo:.6g}, {hi:.6g}]"
            )
            cells.append(
                {
                    "key": c.key,
                    "text": _delta_text(r, kinds[c.key]),
                    "value": repr(float(r["mean_diff"])),
                    "lo": "" if pd.isna(lo) else repr(float(lo)),
                    "hi": "" if pd.isna(hi) else repr(float(hi)),
                    "n": str(int(r["n_pairs"])),
                    "sig": None if sig is None else {"cls": sig[0], "symbol": sig[1]},
                    "title": f"Δ {r['mean_diff']:.6g}, {ci}, n {int(r['n_pairs'])} paired "
                    f"seeds ({r['seeds']})" + (f"; {sig[2]}" if sig else ""),
                    "extra": f"({int(r['n_pairs'])})" if int(r["n_pairs"]) != n else "",
                }
            )
        rows.append(
            {
                "dataset": first["dataset"],
                "backbone": first["backbone"],
                "method": first["method"],
                "m": _m_text(first["M"]),
                "hparams": first["hparams"],
                "variant": first["variant"],
                "reference": first["reference"],
                "n": n,
                "cells": cells,
            }
        )
    return rows


def _significance(paired: PairedStats, columns: list[Column]) -> dict[tuple, list]:
    """(configuration key, metric) → [(class, symbol, title)] of its significant differences."""
    out: dict[tuple, list] = {}
    kinds = {c.key: c.kind for c in columns}
    for _, r in paired.frame.iterrows():
        sig = _sig(r)
        if sig is None or r["metric"] not in kinds:
            continue
        title = (
            f"Δ vs {r['reference']}: {_delta_text(r, kinds[r['metric']])}"
            f"{' pp' if kinds[r['metric']] == 'pct' else ''}, n {int(r['n_pairs'])}; {sig[2]}"
        )
        out.setdefault((*_group_key(r), r["metric"]), []).append((sig[0], sig[1], title))
    return out


def _paired_context(paired: PairedStats, summary: pd.DataFrame) -> dict[str, Any] | None:
    if paired.reference is None:
        return None
    columns = _paired_columns(paired, summary)
    return {
        "title": paired.title,
        "reference": paired.reference,
        "level": f"{100 * paired.level:g}%",
        "n_resamples": f"{paired.n_resamples:,}",
        "show_variant": bool(len(paired.frame)) and paired.frame["variant"].astype(bool).any(),
        "columns": [
            {"key": c.key, "label": _delta_label(c), "better": c.better, "group": c.group}
            for c in columns
        ],
        "rows": _paired_rows(paired, columns),
    }


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
    significance = _significance(paired, columns)
    rows = []
    for idx, r in summary.iterrows():
        key = _group_key(r)
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
        "paired": _paired_context(paired, summary),
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


def _md_escape(text: str) -> str:
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
        .replace("\n", " ")
    )


def _markdown_paired(paired: PairedStats, summary: pd.DataFrame) -> list[str]:
    ctx = _paired_context(paired, summary)
    if ctx is None:
        return []
    lines = ["", f"## {_md_escape(ctx['title'])}", ""]
    if not ctx["rows"]:
        ref = _md_escape(paired.reference)
        return [*lines, f"No configuration shares dataset, backbone, variant and seeds with {ref}."]
    arrow = {"higher": " ↑", "lower": " ↓", None: ""}
    head = ["dataset", "backbone", "method", "M", "hparams"]
    head += ["variant"] if ctx["show_variant"] else []
    head += ["reference", "n"]
    lines.append(
        "| " + " | ".join(head + [c["label"] + arrow[c["better"]] for c in ctx["columns"]]) + " |"
    )
    lines.append("|" + "|".join(["---"] * len(head) + ["---:"] * len(ctx["columns"])) + "|")
    for r in ctx["rows"]:
        ident = [str(r["m"] if k == "M" else r[k]) for k in head]
        vals = []
        for c in r["cells"]:
            text = c["text"] + (f" {c['extra']}" if c["extra"] else "")
            vals.append(f"**{text} {c['sig']['symbol']}**" if c["sig"] else text)
        lines.append("| " + " | ".join(_md_escape(v) for v in ident + vals) + " |")
    lines += [
        "",
        f"Δ = configuration − {_md_escape(paired.reference)} on the same dataset, backbone, "
        f"variant and seed (same M where the reference has it); mean over paired seeds "
        f"[{ctx['level']} percentile bootstrap interval, {ctx['n_resamples']} resamples]; pp: "
        "percentage points. **▲**/**▼**: the interval excludes 0 and the difference is "
        "better/worse. With few seeds the interval is too narrow (with no true difference it "
        "excludes 0 for about 16% of comparisons at 5 seeds, 9% at 10; nominal 5%).",
    ]
    return lines


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
    lines = [f"# {_md_escape(title)}", ""]
    if len(summary):
        columns = leaderboard_columns(summary)
        best = best_rows(summary, columns)
        significance = _significance(paired, columns)
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
                text = f"**{text}**" if idx in best.get(c.key, ()) else text
                marks = "".join(m for _, m, _ in significance.get((*_group_key(r), c.key), []))
                vals.append(f"{text} {marks}" if marks else text)
            lines.append("| " + " | ".join(_md_escape(v) for v in ident + vals) + " |")
        lines += [
            "",
            "Mean ± sample std over seeds (n). ↑/↓: better direction; **bold**: best per dataset.",
        ]
        if paired.reference is not None:
            lines[-1] += (
                f" ▲/▼: significantly better/worse than {_md_escape(paired.reference)} "
                "(paired differences below)."
            )
        lines += _markdown_paired(paired, summary)
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
