"""The leaderboard as Markdown (GFM): the main table, paired differences, accuracy per corruption,
selection on validation, published values, problems and notes — each from the same context as
the page's table (:mod:`reports.render.page`), written by :func:`_table`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from reports.columns import COLLAPSE_NOTE, iter_rows, leaderboard_columns, m_text
from reports.records.results import Results
from reports.render.page import (
    ReportOptions,
    _n_text,
    cell_text,
    corruption_table,
    interval_words,
    is_collapsed,
    report_conventions,
    shown_results,
)
from reports.render.paired import (
    PairedStats,
    bold_cells,
    group_key,
    paired_context,
    significance_marks,
    unbolded_note,
)
from reports.render.tables import selection_context

_ARROW = {"higher": " ↑", "lower": " ↓", None: ""}


def md_escape(text: str) -> str:
    """Text safe in a GFM table cell: HTML characters as entities, ``|`` escaped, one line."""
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
        .replace("\n", " ")
    )


def _table(head: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """A GFM table; ``align`` has an ``l`` (text) or ``r`` (numbers) per column, its last letter
    repeated for the columns beyond it."""
    align = align.ljust(len(head), align[-1])
    lines = ["| " + " | ".join(md_escape(str(h)) for h in head) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines += ["| " + " | ".join(md_escape(str(c)) for c in row) + " |" for row in rows]
    return lines


def render_markdown_table(
    results: Results,
    title: str,
    paired: PairedStats,
    options: ReportOptions,
) -> list[str]:
    """The title, the leaderboard table (columns hidden by default left out) and its legend."""
    summary = results.summary
    lines = [f"# {md_escape(title)}", ""]
    if not len(summary):
        return [*lines, "No done cells."]
    columns = leaderboard_columns(summary, hidden=False)
    best = bold_cells(paired, results)
    if note := unbolded_note(paired, results):  # said once, above the table
        lines += [md_escape(note), ""]
    significance = significance_marks(paired, columns)
    head = ["dataset", "backbone", "method", "M", "hparams", "n"]
    if summary["variant"].astype(bool).any():
        head.insert(5, "variant")
    body = []
    any_collapsed = False
    for idx, r in iter_rows(summary):
        ident = [m_text(r[k]) if k == "M" else _n_text(r) if k == "n" else str(r[k])
                 for k in head]  # fmt: skip
        if is_collapsed(r):  # the method cell of a collapsed ensemble, marked
            any_collapsed = True
            ident[head.index("method")] += " (collapsed)"
        vals = []
        for c in columns:
            spread = r.get(f"{c.key}_{options.interval}")
            text = cell_text(r[f"{c.key}_mean"], spread, r[f"{c.key}_n"], c.kind, show_n=True)
            text = f"**{text}**" if idx in best.get(c.key, ()) else text
            marks = "".join(m for _, m, _ in significance.get((*group_key(r), c.key), []))
            vals.append(f"{text} {marks}" if marks else text)
        body.append(ident + vals)
    lines += _table(
        head + [c.label + _ARROW[c.better] for c in columns], "l" * len(head) + "r", body
    )
    legend = f"{interval_words(options.interval).capitalize()} over seeds (n). ↑/↓: better "
    legend += "direction; **bold**: the best per dataset and every configuration not "
    legend += "significantly different from it"
    lines += ["", legend + "."]
    if paired.reference is not None:
        lines[-1] += f" {md_escape(paired.rule)}"
    if any_collapsed:
        lines[-1] += f" (collapsed) — {md_escape(COLLAPSE_NOTE)}."
    return lines


def markdown_corruptions(results: Results, options: ReportOptions) -> list[str]:
    """Accuracy per corruption (mean over severities), one row per configuration."""
    table = corruption_table(results, options)
    if table is None:
        return []
    head = ["dataset", "backbone", "method", "M", "hparams", *table["names"]]
    rows = ([*r["ident"], *(c["text"] for c in r["cells"])] for r in table["rows"])
    return [
        "",
        "## Accuracy per corruption (mean over severities, %)",
        "",
        *_table(head, "lllllr", rows),
    ]


def markdown_paired(paired: PairedStats, summary: pd.DataFrame) -> list[str]:
    """The paired differences to the reference, as the page's ``table#paired-table``."""
    ctx = paired_context(paired, summary)
    if ctx is None:
        return []
    lines = ["", f"## {md_escape(ctx['title'])}", ""]
    if not ctx["rows"]:
        ref = md_escape(paired.reference)
        return [*lines, f"No configuration shares dataset, backbone, variant and seeds with {ref}."]
    head = ["dataset", "backbone", "method", "M", "hparams"]
    head += ["variant"] if ctx["show_variant"] else []
    head += ["reference", "n"]
    body = []
    for r in ctx["rows"]:
        vals = []
        for c in r["cells"]:
            text = c["text"] + (f" {c['extra']}" if c["extra"] else "")
            vals.append(f"**{text} {c['sig']['symbol']}**" if c["sig"] else text)
        body.append([str(r["m"] if k == "M" else r[k]) for k in head] + vals)
    labels = [c["label"] + _ARROW[c["better"]] for c in ctx["columns"]]
    lines += _table(head + labels, "l" * len(head) + "r", body)
    lines += [
        "",
        f"Δ = configuration − {md_escape(paired.reference)} on the same dataset, backbone, "
        f"variant and seed (same M where the reference has it); mean over paired seeds "
        f"[{ctx['level']} paired t-interval]; pp: percentage points. "
        + md_escape(paired.rule).replace("▲/▼", "**▲**/**▼**", 1),
    ]
    return lines


def markdown_selection(summary: pd.DataFrame) -> list[str]:
    """The selection on validation (:mod:`reports.render.tables`); none without one."""
    ctx = selection_context(summary)
    if ctx is None:
        return []
    head = ["dataset", "backbone", "method", "M", "selected", "of", "val NLL", *ctx["labels"]]
    rows = (
        [*r["ident"], r["hparams"], r["candidates"], r["val"], *r["cells"]] for r in ctx["rows"]
    )
    title = "## Selected on the validation split (lowest mean validation NLL; test metrics)"
    return ["", title, "", *_table(head, "lllrlrr", rows)]


def markdown_published(compared: pd.DataFrame) -> list[str]:
    """The published-vs-measured table (:mod:`reports.render.published`)."""
    from reports.render.published import published_context

    ctx = published_context(compared)
    if ctx is None:
        return []
    head = ["dataset", "backbone", "method", "M", "hparams", "metric", "published", "measured",
            "n", "Δ (measured − published)", "source"]  # fmt: skip
    rows = [[*r["ident"], r["label"], r["published"], r["measured"], r["n"], r["difference"],
             r["source"]] for r in ctx["rows"]]  # fmt: skip
    lines = ["", "## Published vs measured", "", *_table(head, "llllllrrrrl", rows)]
    return [*lines, "", f"Measured: {md_escape(ctx['interval'])} over seeds; “–”: not run here."]


def render_markdown(
    results: Results,
    title: str,
    paired: PairedStats,
    options: ReportOptions,
    published: pd.DataFrame | None = None,
) -> str:
    """The whole Markdown report (see the module docstring)."""
    results = shown_results(results)
    lines = render_markdown_table(results, title, paired, options)
    if len(results.summary):
        lines += markdown_paired(paired, results.summary)
    lines += markdown_corruptions(results, options)
    lines += markdown_selection(results.summary)
    if published is not None and len(published):
        lines += markdown_published(published)
    if results.problems:
        problems = [[p.status, p.cell_id, p.config, p.reason] for p in results.problems]
        lines += ["", "## Failed and missing cells", ""]
        lines += _table(["status", "cell", "configuration", "reason"], "l", problems)
    if results.provenance:
        lines += ["", "## Provenance", ""]
        lines += [
            f"- {md_escape(k)}: {md_escape('; '.join(v))}" for k, v in results.provenance.items()
        ]
    conventions = {k: " | ".join(v) for k, v in results.conventions.items()}
    conventions.update(report_conventions(results, paired, options))
    lines += ["", "## Conventions", ""]
    lines += [f"- {md_escape(k)}: {md_escape(v)}" for k, v in conventions.items()]
    return "\n".join(lines) + "\n"
