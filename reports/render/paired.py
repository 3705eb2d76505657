"""Paired differences to a reference method, shaped for the leaderboard page and Markdown.

The statistics themselves are in :mod:`reports.stats.paired`; this module pairs them with the
leaderboard's columns and formats the Δ cells and significance marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup, escape

from harness.contract.errors import UsageError
from reports.columns import (
    CORRUPTION,
    Column,
    format_number,
    iter_rows,
    leaderboard_columns,
    m_text,
    quality_columns,
)
from reports.records.results import Results
from reports.stats.bolding import Bolding, bolding, config_key
from reports.stats.paired import COLUMNS as PAIRED_COLUMNS
from reports.stats.paired import (
    TEST_NAMES,
    check_test,
    default_reference,
    min_pairs,
    missing_reference,
    paired_differences,
)

#: Where the marks' level holds, measured by benchmarks/signflip_level.py (100,000 null
#: experiments each, docs/benchmarks.md): shown wherever the marks are explained.
LEVEL_CAVEAT = (
    "Both tests hold their level only for per-seed differences symmetric about their mean: with "
    "skewed ones of mean zero (exponential − 1) the sign-flip test marks 6.7% of comparisons "
    "with no true difference at 6 seeds and 9.6% at 10, the t-test 11.5% and 10.2% (normal "
    "noise: 3.2%/4.8% and 5.0%/4.9%)."
)


#: The confidence level of the paired intervals; 1 − LEVEL is the marks' and bold cells' alpha.
LEVEL = 0.95


@dataclass
class PairedStats:
    """The paired differences a report shows: against which method, with which test and level."""

    reference: str | None  # None: no reference method in the results, no statistics section
    frame: pd.DataFrame  # reports.stats.paired.paired_differences (empty without a reference)
    level: float = LEVEL
    test: str = "signflip"
    holm: bool = False
    # Computed once per report for every output (page, Markdown, LaTeX): see bold_cells().
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def alpha(self) -> float:
        return 1 - self.level

    @property
    def title(self) -> str:
        return f"Δ vs {self.reference}, mean over paired seeds, {100 * self.level:g}% t-interval"

    @property
    def rule(self) -> str:
        """The marking rule in words, for the page, Markdown and LaTeX notes."""
        test = TEST_NAMES[self.test]
        need = min_pairs(self.test, self.alpha)
        text = f"▲/▼: p ≤ {self.alpha:g} by the {test}"
        if self.holm:
            text += ", Holm-adjusted across every comparison of the paired table"
        text += f"; it cannot reach p ≤ {self.alpha:g} with fewer than {need} paired seeds"
        if need > 2:
            text += ", so such comparisons never carry a mark (“no mark possible” in their title)"
        return text + ". " + LEVEL_CAVEAT


def resolve_reference(results: Results, reference: str | None, test: str) -> str | None:
    """The reference :func:`paired_stats` compares with (``None``: the default, or none), and
    the test checked: a :class:`UsageError` for a reference without done cells or an unknown
    test, before a report writes anything."""
    check_test(test)
    cells = results.cells
    if reference is None:
        return default_reference(cells)
    problem = missing_reference(cells, reference)
    if problem:
        raise UsageError(f"--{problem}")
    return reference


def paired_stats(
    results: Results,
    reference: str | None = None,
    *,
    level: float = LEVEL,
    test: str = "signflip",
    holm: bool = False,
) -> PairedStats:
    """Paired differences of every configuration to ``reference`` (see :mod:`reports.stats.paired`).

    ``reference`` None picks ``deep_ensemble`` if it has done cells, else ``single``, else none
    (no statistics). A named reference without done cells is an error, not a silent omission.
    ``test`` (``signflip`` or ``t``) decides the marks, ``holm`` adjusts them across the table.
    """
    reference = resolve_reference(results, reference, test)
    cells = results.cells
    if reference is None:
        frame = pd.DataFrame(columns=list(PAIRED_COLUMNS))
    else:
        frame = paired_differences(cells, reference, level=level, test=test, holm_adjust=holm)
    return PairedStats(reference, frame, level, test, holm)


def group_key(row: Any) -> tuple:
    return tuple(
        m_text(row["M"]) if k == "M" else str(row[k])
        for k in ("dataset", "backbone", "method", "M", "hparams", "variant")
    )


def _delta_label(column: Column) -> str:
    label = column.label.replace(" (%)", "")
    return f"Δ {label} (pp)" if column.kind == "pct" else f"Δ {label}"


def _paired_columns(paired: PairedStats, summary: pd.DataFrame) -> list[Column]:
    known = {c.key: c for c in (*quality_columns(), *CORRUPTION, *leaderboard_columns(summary))}
    metrics = list(dict.fromkeys(paired.frame["metric"]))
    return [known.get(m, Column(m, m, "", "f3")) for m in metrics]


def bold_cells(paired: PairedStats, results: Results) -> dict[str, set[Any]]:
    """The bold cells (:func:`reports.stats.bolding.bolding`) of every leaderboard column of
    ``results``."""
    return bolding_of(paired, results).bold


def bolding_of(paired: PairedStats, results: Results) -> Bolding:
    """:func:`reports.stats.bolding.bolding` of every leaderboard column of ``results``,
    computed once per report (the page, Markdown and LaTeX each show a subset of the columns; a
    column's bold cells do not depend on which other columns are shown)."""
    key = ("bold", id(results.summary))
    if key not in paired.memo:
        columns = leaderboard_columns(results.summary)
        paired.memo[key] = bolding(
            results.summary, results.cells, columns, test=paired.test, alpha=paired.alpha
        )
    return paired.memo[key]


def unbolded_note(paired: PairedStats, results: Results) -> str:
    """The sentence above a table whose columns carry no bold because no comparison in them
    could reach significance (:attr:`reports.stats.bolding.Bolding.unreachable`); empty when
    there is none. Every column: "No cell is bold: …"; some: they are named (with the
    dataset where the results have several)."""
    b = bolding_of(paired, results)
    if not b.unreachable:
        return ""
    need = min_pairs(paired.test, paired.alpha)
    if paired.test == "signflip":
        why = (
            "the exact sign-flip test's smallest two-sided p with n pairs is 2/2ⁿ: "
            f"{2.0 ** (2 - need):g} at n = {need - 1}, above α = {paired.alpha:g}"
        )
    else:
        why = f"the paired t-test has no p-value below {need} pairs"
    head = f"bold marks need ≥ {need} paired seeds ({why}); these results have {b.seeds}"
    pairs = {(k, g) for k, groups in b.unreachable.items() for g in groups}
    if pairs == {(k, g) for k, groups in b.compared.items() for g in groups}:
        return f"No cell is bold: {head}."
    labels = {c.key: c.label for c in leaderboard_columns(results.summary)}
    several = len({g for _, g in pairs}) > 1 or results.summary["dataset"].nunique() > 1
    order = {k: i for i, k in enumerate(labels)}
    named = [
        f"{labels.get(k, k)}{f' ({g})' if several else ''}"
        for k, g in sorted(pairs, key=lambda p: (order.get(p[0], len(order)), str(p[1])))
    ]
    return f"No bold in {', '.join(named)}: {head} there."


def significance_marks(paired: PairedStats, columns: list[Column]) -> dict[tuple, list]:
    """(configuration key, metric) → [(class, symbol, title)] of its significant differences."""
    out: dict[tuple, list] = {}
    kinds = {c.key: c.kind for c in columns}
    frame = paired.frame
    if len(frame):  # only significant rows carry a mark (_sig): the others are not read
        frame = frame[frame["significant"].to_numpy(dtype=bool) & frame["metric"].isin(kinds)]
    for _, r in iter_rows(frame):
        sig = sig_of(r)
        if sig is None or r["metric"] not in kinds:
            continue
        title = (
            f"Δ vs {r['reference']}: {delta_text(r, kinds[r['metric']])}"
            f"{' pp' if kinds[r['metric']] == 'pct' else ''}, n {int(r['n_pairs'])}; {sig[2]}"
        )
        out.setdefault((*group_key(r), r["metric"]), []).append((sig[0], sig[1], title))
    return out


def paired_context(paired: PairedStats, summary: pd.DataFrame) -> dict[str, Any] | None:
    """The paired table as the page and Markdown show it (computed once per report)."""
    if paired.reference is None:
        return None
    key = ("context", id(summary))
    if key not in paired.memo:
        paired.memo[key] = _paired_context(paired, summary)
    return paired.memo[key]


def _paired_context(paired: PairedStats, summary: pd.DataFrame) -> dict[str, Any]:
    columns = _paired_columns(paired, summary)
    return {
        "title": paired.title,
        "reference": paired.reference,
        "level": f"{100 * paired.level:g}%",
        "test": TEST_NAMES[paired.test],
        "holm": paired.holm,
        "rule": paired.rule,
        "min_pairs": min_pairs(paired.test, paired.alpha),
        "n_max": int(paired.frame["n_pairs"].max()) if len(paired.frame) else 0,
        "show_variant": bool(len(paired.frame)) and paired.frame["variant"].astype(bool).any(),
        "columns": [
            {"key": c.key, "label": _delta_label(c), "better": c.better, "group": c.group}
            for c in columns
        ],
        "rows": paired_rows(paired, columns),
    }


# The paired table's rows: one per configuration × reference configuration, one Δ cell per
# metric, each cell's HTML written here (as the leaderboard's, :mod:`reports.render.page`).


_KEYS = ["dataset", "backbone", "method", "M", "hparams", "variant", "reference"]


def format_delta(value: Any, kind: str) -> str:
    """A signed difference in a column's format (``pct``: percentage points): ``+5.00``."""
    text = format_number(value, kind)
    if text not in ("–", "inf") and float(value) > 0:
        text = "+" + text
    return text


def delta_text(r: Any, kind: str) -> str:
    """``+1.20 [+0.40, +2.00]``: a paired row's mean difference and interval."""
    text = format_delta(r["mean_diff"], kind)
    if pd.isna(r["ci_lo"]):
        return f"{text} [–]"
    return f"{text} [{format_delta(r['ci_lo'], kind)}, {format_delta(r['ci_hi'], kind)}]"


def sig_of(r: Any) -> tuple[str, str, str] | None:
    """(class, symbol, words) for a significant difference; None otherwise."""
    if not r["significant"]:
        return None
    if pd.isna(r["better"]):
        return "neutral", "◆", "significant difference (metric without a better direction)"
    if r["better"]:
        return "better", "▲", "significantly better than the reference"
    return "worse", "▼", "significantly worse than the reference"


def _groups(frame: pd.DataFrame) -> list[np.ndarray]:
    """The positions of each configuration × reference's rows, groups in order of first
    appearance (NaN M groups as one)."""
    codes = frame.groupby(_KEYS, sort=False, dropna=False).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    return np.split(order, np.cumsum(np.bincount(codes))[:-1])


def _cell(paired: PairedStats, r: dict[str, Any], kind: str, n: int) -> dict[str, Any]:
    sig = sig_of(r)
    lo, hi = r["ci_lo"], r["ci_hi"]
    ci = (
        "no interval from a single pair"
        if pd.isna(lo)
        else f"{100 * paired.level:g}% CI [{lo:.6g}, {hi:.6g}]"
    )
    ci += f", p = {r['p_value']:.3g}" if pd.notna(r["p_value"]) else ""
    if paired.holm and pd.notna(r["p_adjusted"]):
        ci += f" (Holm-adjusted {r['p_adjusted']:.3g})"
    if not r["reachable"]:
        need = min_pairs(paired.test, paired.alpha)
        ci += f"; no mark possible: the test needs ≥ {need} pairs"
    return {
        "key": r["metric"],
        "text": delta_text(r, kind),
        "value": repr(float(r["mean_diff"])),
        "lo": "" if pd.isna(lo) else repr(float(lo)),
        "hi": "" if pd.isna(hi) else repr(float(hi)),
        "n": str(int(r["n_pairs"])),
        "sig": None if sig is None else {"cls": sig[0], "symbol": sig[1]},
        "title": f"Δ {r['mean_diff']:.6g}, {ci}, n {int(r['n_pairs'])} paired "
        f"seeds ({r['seeds']})" + (f"; {sig[2]}" if sig else ""),
        "extra": f"({int(r['n_pairs'])})" if int(r["n_pairs"]) != n else "",
    }


def _row(paired: PairedStats, part: list[dict[str, Any]], columns: list[Column]) -> dict:
    """One configuration × reference's row from its rows of the paired frame."""
    first = part[0]
    by_metric = {r["metric"]: r for r in part}
    n = max(int(r["n_pairs"]) for r in part)
    cells = []
    for c in columns:
        r = by_metric.get(c.key)
        if r is None:
            cells.append({"key": c.key, "text": "–", "value": "", "lo": "", "hi": "", "n": "",
                          "sig": None, "title": "no paired seeds", "extra": ""})  # fmt: skip
        else:
            cells.append(_cell(paired, r, c.kind, n))
    return {
        "dataset": first["dataset"],
        "backbone": first["backbone"],
        "method": first["method"],
        "m": m_text(first["M"]),
        "hparams": first["hparams"],
        "variant": first["variant"],
        "reference": first["reference"],
        "config": " | ".join(config_key(first)),  # the leaderboard row's data-config
        "n": n,
        "cells": cells,
        "cells_html": paired_cells(cells),
    }


def paired_rows(paired: PairedStats, columns: list[Column]) -> list[dict[str, Any]]:
    """One row per configuration × reference configuration, one cell per metric (``columns``)."""
    frame = paired.frame
    if frame.empty:
        return []
    rows = [r for _, r in iter_rows(frame)]
    return [_row(paired, [rows[i] for i in g], columns) for g in _groups(frame)]


def paired_cells(cells: Iterable[Mapping[str, Any]]) -> Markup:
    """The Δ ``<td>`` elements of one paired-table row (see :mod:`reports.render.paired`)."""
    out = []
    for c in cells:
        sig = c["sig"]
        cls = "delta num" + (f" sig {escape(sig['cls'])}" if sig else "")
        body = str(escape(c["text"]))
        body += f' <span class="n">{escape(c["extra"])}</span>' if c["extra"] else ""
        if sig:
            body += f' <span class="sig-mark {escape(sig["cls"])}">{escape(sig["symbol"])}</span>'
        out.append(
            f'<td data-col="{escape(c["key"])}" data-value="{escape(c["value"])}" '
            f'data-lo="{escape(c["lo"])}" data-hi="{escape(c["hi"])}" data-n="{escape(c["n"])}" '
            f'class="{cls}" title="{escape(c["title"])}">{body}</td>'
        )
    return Markup("".join(out))
