"""The leaderboard as LaTeX for a paper: one booktabs table per dataset, mean ± interval, best bold.

``render_latex`` returns a complete document (``article`` with ``booktabs`` and ``graphicx``, both
in TeX Live's ``texlive-latex-base``/``-recommended``) that compiles as is; each table sits between
``% BEGIN TABLE <dataset>`` and ``% END TABLE`` lines, to be copied into a paper. Cells are
``mean $\\pm$ interval`` in the leaderboard's units (percent columns ×100), the interval being the
95% t-interval half-width by default (``ReportOptions.latex_interval``; ``std`` gives the sample
std); the caption says which, the seeds (n) and the bolding rule. Bold: the best mean per column
and every configuration not significantly different from it (:mod:`reports.stats.bolding`), with the
test of the paired table. Columns are the leaderboard's default view (no hidden columns), each
table keeping those with a value for its dataset. Text from records is escaped.
"""

from __future__ import annotations

import pandas as pd

from reports.columns import Column, format_number, iter_rows, leaderboard_columns, m_text
from reports.records.results import Results
from reports.render.page import ReportOptions, shown_results
from reports.render.paired import PairedStats, bold_cells
from reports.stats.significance import TEST_NAMES

_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


# Characters pdfLaTeX's utf8 input cannot typeset without more packages, as math.
_UNICODE = {
    "−": "-",
    "–": "--",
    "—": "---",
    "±": r"$\pm$",
    "≤": r"$\le$",
    "≥": r"$\ge$",
    "×": r"$\times$",
    "·": r"$\cdot$",
    "√": r"$\surd$",
    "→": r"$\to$",
    "τ": r"$\tau$",
    "λ": r"$\lambda$",
    "σ": r"$\sigma$",
    "μ": r"$\mu$",
    "α": r"$\alpha$",
    "β": r"$\beta$",
    "Δ": r"$\Delta$",
}


def escape(text: object) -> str:
    """``text`` with LaTeX's special characters escaped (printable as it reads).

    Latin-1 letters pass (inputenc utf8 sets them); a few math and Greek characters become
    math; any other character becomes ``?`` rather than break the compilation.
    """
    out = []
    for ch in str(text):
        if not ch.isprintable():
            continue
        if ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif ch in _UNICODE:
            out.append(_UNICODE[ch])
        else:
            out.append(ch if ord(ch) < 256 else "?")
    return "".join(out)


_INTERVAL_TEX = {
    "std": r"mean $\pm$ sample std",
    "ci": r"mean $\pm$ half-width of the 95\% $t$-interval of the mean "
    r"($t_{n-1,0.975}\,s/\sqrt{n}$)",
}


def _header(c: Column) -> str:
    arrow = {"higher": r" $\uparrow$", "lower": r" $\downarrow$"}.get(c.better or "", "")
    return escape(c.label) + arrow


def latex_cell(mean: object, spread: object, kind: str, bold: bool) -> str:
    """``90.00 $\\pm$ 1.23`` (``\\textbf`` when bold); ``--`` for a missing mean."""
    text = format_number(mean, kind)
    if text == "–":
        return "--"
    text = escape(text)
    if spread is not None and not pd.isna(spread) and float(spread) != 0:
        text += r" $\pm$ " + escape(format_number(spread, kind))
    return rf"\textbf{{{text}}}" if bold else text


def dataset_table(
    results: Results, dataset: str, paired: PairedStats, options: ReportOptions
) -> list[str]:
    """One ``table`` environment for ``dataset`` (empty list when it has no column to show)."""
    summary = results.summary[results.summary["dataset"] == dataset]
    columns = [
        c
        for c in leaderboard_columns(results.summary, hidden=False)
        if summary[f"{c.key}_mean"].notna().any()
    ]
    if not columns:
        return []
    best = bold_cells(paired, results)  # over all datasets, once per report
    interval = options.latex_interval
    show_variant = summary["variant"].astype(bool).any()
    ident = ["backbone", "method", "M", "hparams", *(["variant"] if show_variant else []), "n"]
    lines = [
        f"% BEGIN TABLE {escape(dataset)}",
        "% COLUMNS " + " ".join(c.key for c in columns),  # for scripts: metric keys, in order
        r"\begin{table}[htbp]",
        r"\centering",
        rf"\caption{{{escape(dataset)}: {_INTERVAL_TEX[interval]} over seeds (n). "
        rf"Bold: the best per column and every configuration the {escape(TEST_NAMES[paired.test])} "
        rf"cannot tell apart from it at $p \le {paired.alpha:g}$; none in a column whose "
        rf"comparisons all have too few seeds to reach that level.}}",
        rf"\label{{tab:{''.join(ch for ch in dataset if ch.isalnum())}}}",
        r"\resizebox{\textwidth}{!}{%",
        r"\begin{tabular}{" + "l" * (len(ident) - 1) + "r" + "r" * len(columns) + "}",
        r"\toprule",
        " & ".join([*(escape(k) for k in ident), *(_header(c) for c in columns)]) + r" \\",
        r"\midrule",
    ]
    for idx, r in iter_rows(summary):
        cells = [
            m_text(r["M"]) if k == "M" else str(int(r["n"])) if k == "n" else escape(r[k])
            for k in ident
        ]
        cells += [
            latex_cell(
                r[f"{c.key}_mean"],
                r.get(f"{c.key}_{interval}"),
                c.kind,
                idx in best.get(c.key, ()),
            )
            for c in columns
        ]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}", r"\end{table}", "% END TABLE", ""]
    return lines


def render_latex(results: Results, paired: PairedStats, options: ReportOptions) -> str:
    """A compilable document with one table per dataset (see the module docstring)."""
    results = shown_results(results)
    lines = [
        r"\documentclass{article}",
        r"\usepackage[utf8]{inputenc}",
        r"\usepackage{booktabs}",
        r"\usepackage{graphicx}",
        r"\usepackage[margin=2cm]{geometry}",
        r"\begin{document}",
        "",
    ]
    datasets = sorted(set(results.summary["dataset"])) if len(results.summary) else []
    tables = [line for d in datasets for line in dataset_table(results, d, paired, options)]
    lines += tables or ["No done cells."]
    lines += [r"\end{document}", ""]
    return "\n".join(lines)
