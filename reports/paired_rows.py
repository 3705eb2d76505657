"""The paired table's rows as the page and the Markdown show them: one per configuration ×
reference configuration, one formatted Δ cell per metric.

At 1,000 configurations formatting the table (30,000 cells, each with its interval, p-value and
tooltip) was a tenth of a report whose records had barely changed. With a
:class:`~reports.row_cache.RowCache`, each row is kept under a digest of its rows of the paired
frame (pandas' hash of every value: the differences, intervals, p-values, marks) and of what
every row shows alike (the columns, the level, the test), so only the rows of configurations
whose numbers changed are formatted again. A cached row is used only if it has this code's shape
and, from a file someone else could have written, only this code's markup
(:func:`reports.row_html.is_paired_markup`).
"""

from __future__ import annotations

import hashlib
from itertools import pairwise
from typing import Any, Protocol

import numpy as np
import pandas as pd
from markupsafe import Markup

from reports.bolding import config_key
from reports.columns import Column, format_number, iter_rows, m_text
from reports.row_cache import RowCache
from reports.row_html import is_paired_markup, paired_cells
from reports.stats import min_pairs


class PairedStats(Protocol):
    """What these rows read of :class:`reports.paired_view.PairedStats` (named here, not
    imported: that module imports this one)."""

    frame: pd.DataFrame
    level: float
    test: str
    holm: bool

    @property
    def alpha(self) -> float: ...


_KEYS = ["dataset", "backbone", "method", "M", "hparams", "variant", "reference"]
_TEXT = ("dataset", "backbone", "method", "m", "hparams", "variant", "reference", "config")
_CELL = ("key", "text", "value", "lo", "hi", "n", "title", "extra")


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
        "cells_html": str(paired_cells(cells)),
    }


def _shape_ok(row: Any) -> bool:
    """A cached row has the entries :func:`_row` writes, of its types."""
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in _TEXT):
        return False
    if not isinstance(row.get("n"), int) or not isinstance(row.get("cells_html"), str):
        return False
    cells = row.get("cells")
    return isinstance(cells, list) and all(
        isinstance(c, dict)
        and all(isinstance(c.get(k), str) for k in _CELL)
        and (c.get("sig") is None or (isinstance(c["sig"], dict)
             and all(isinstance(c["sig"].get(k), str) for k in ("cls", "symbol"))))
        for c in cells
    )  # fmt: skip


def _markup_ok(row: dict[str, Any]) -> bool:
    return is_paired_markup(row["cells_html"])


def paired_rows(
    paired: PairedStats, columns: list[Column], row_cache: RowCache | None = None
) -> list[dict[str, Any]]:
    """One row per configuration × reference configuration, one cell per metric (``columns``);
    with ``row_cache``, the rows whose numbers did not change come from the last report."""
    frame = paired.frame
    if frame.empty:
        return []
    groups = _groups(frame)

    def make(positions: list[int]) -> list[dict[str, Any]]:
        chosen = [groups[i] for i in positions]
        rows = [r for _, r in iter_rows(frame.iloc[np.concatenate(chosen)])] if chosen else []
        bounds = np.cumsum([0, *(len(g) for g in chosen)])
        return [_row(paired, rows[a:b], columns) for a, b in pairwise(bounds)]

    digests = row_cache.digests(frame) if row_cache is not None else None
    if digests is None:
        rows = make(list(range(len(groups))))
    else:
        keys = [hashlib.sha256("|".join(digests[i] for i in g).encode()).hexdigest()
                for g in groups]  # fmt: skip
        context = [[(c.key, c.kind) for c in columns], paired.level, paired.test, paired.holm]
        rows = row_cache.rows("paired", keys, [None] * len(groups), context, make, _shape_ok,
                              _markup_ok)  # fmt: skip
    # Markup: the template writes the cells as they are (each value was escaped in Python).
    return [{**r, "cells_html": Markup(r["cells_html"])} for r in rows]
