"""The leaderboard as Markdown (GFM): main table, paired differences, published values, notes."""

from __future__ import annotations

import pandas as pd

from reports.columns import iter_rows, leaderboard_columns, m_text
from reports.records.results import Results
from reports.render.page import (
    ReportOptions,
    _n_text,
    cell_text,
    corruption_table,
    interval_words,
    report_conventions,
)
from reports.render.paired import (
    PairedStats,
    bold_cells,
    group_key,
    markdown_paired,
    md_escape,
    significance_marks,
)
from reports.render.tables import markdown_selection


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
    significance = significance_marks(paired, columns)
    arrow = {"higher": " ↑", "lower": " ↓", None: ""}
    head = ["dataset", "backbone", "method", "M", "hparams", "n"]
    if summary["variant"].astype(bool).any():
        head.insert(5, "variant")
    lines.append("| " + " | ".join(head + [c.label + arrow[c.better] for c in columns]) + " |")
    lines.append("|" + "|".join(["---"] * len(head) + ["---:"] * len(columns)) + "|")
    for idx, r in iter_rows(summary):
        ident = [m_text(r[k]) if k == "M" else _n_text(r) if k == "n" else str(r[k])
                 for k in head]  # fmt: skip
        vals = []
        for c in columns:
            spread = r.get(f"{c.key}_{options.interval}")
            text = cell_text(r[f"{c.key}_mean"], spread, r[f"{c.key}_n"], c.kind, show_n=True)
            text = f"**{text}**" if idx in best.get(c.key, ()) else text
            marks = "".join(m for _, m, _ in significance.get((*group_key(r), c.key), []))
            vals.append(f"{text} {marks}" if marks else text)
        lines.append("| " + " | ".join(md_escape(v) for v in ident + vals) + " |")
    legend = f"{interval_words(options.interval).capitalize()} over seeds (n). ↑/↓: better "
    legend += "direction; **bold**: the best per dataset and every configuration not "
    legend += "significantly different from it"
    lines += ["", legend + "."]
    if paired.reference is not None:
        lines[-1] += f" {md_escape(paired.rule)}"
    return lines


def markdown_corruptions(results: Results, options: ReportOptions) -> list[str]:
    """Accuracy per corruption (mean over severities), one row per configuration."""
    table = corruption_table(results, options)
    if table is None:
        return []
    head = ["dataset", "backbone", "method", "M", "hparams", *table["names"]]
    lines = ["", "## Accuracy per corruption (mean over severities, %)", ""]
    lines.append("| " + " | ".join(md_escape(h) for h in head) + " |")
    lines.append("|" + "|".join(["---"] * 5 + ["---:"] * len(table["names"])) + "|")
    for r in table["rows"]:
        cells = [*r["ident"], *(c["text"] for c in r["cells"])]
        lines.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
    return lines


def render_markdown(
    results: Results,
    title: str,
    paired: PairedStats,
    options: ReportOptions,
    published: pd.DataFrame | None = None,
) -> str:
    """The whole Markdown report (see the module docstring)."""
    lines = render_markdown_table(results, title, paired, options)
    if len(results.summary):
        lines += markdown_paired(paired, results.summary)
    lines += markdown_corruptions(results, options)
    lines += markdown_selection(results.summary, cell_text)
    if published is not None and len(published):
        from reports.render.published import markdown_published

        lines += markdown_published(published)
    if results.problems:
        lines += ["", "## Failed and missing cells", ""]
        lines += ["| status | cell | configuration | reason |", "|---|---|---|---|"]
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
    conventions = {k: " | ".join(v) for k, v in results.conventions.items()}
    conventions.update(report_conventions(results, paired, options))
    lines += ["", "## Conventions", ""]
    lines += [f"- {md_escape(k)}: {md_escape(v)}" for k, v in conventions.items()]
    return "\n".join(lines) + "\n"
