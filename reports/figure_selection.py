"""Which configurations the figures draw when a study has too many for a readable legend.

A figure with one line or bar per configuration is unreadable past a few dozen (a 1,000-entry
legend, a bar group of 1,000 bars). Above :data:`MAX_CONFIGS` configurations, the figures draw, per
dataset, backbone, method, M and variant, the one hyper-parameter setting with the lowest mean
validation NLL (the test NLL where no cell has a validation split) — the setting a practitioner
would pick, as in :mod:`reports.selection` — and say so in their caption. The tables keep every
configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_CONFIGS = 24
#: The ids of :data:`reports.figures.FIGURES`, in order, known without importing matplotlib (a
#: report whose figures are drawn elsewhere or cached never imports it; a test holds them equal).
FIGURE_IDS = (
    "fig-tau-frontier",
    "fig-quality-vs-m",
    "fig-corruption",
    "fig-ood",
    "fig-cost",
    "fig-reliability",
)
SWEEPS = ("fig-tau-frontier", "fig-keff")  # drawn along τ: one point per setting, no legend
_SWEEP = ["dataset", "backbone", "method", "M", "variant"]
_CONFIG = [*_SWEEP, "hparams"]


def figure_cells(cells: pd.DataFrame, figure: str = "") -> tuple[pd.DataFrame, str]:
    """(the cells ``figure`` draws, a caption note; empty when every configuration is drawn).

    The τ figures (:data:`SWEEPS`) always draw every setting: their points are the sweep."""
    keys = [k for k in _CONFIG if k in cells]
    if cells.empty or len(keys) < len(_CONFIG) or figure in SWEEPS:
        return cells, ""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    n_configs = len(done.groupby(keys, dropna=False)) if len(done) else 0
    if n_configs <= MAX_CONFIGS:
        return cells, ""
    metric = "val_nll" if "val_nll" in done and done["val_nll"].notna().any() else "nll"
    means = done.groupby(keys, dropna=False)[metric].mean().reset_index()
    means = means.sort_values(metric, kind="stable", na_position="last")
    chosen = means.drop_duplicates(_SWEEP, keep="first")[keys]
    kept = cells.merge(chosen, on=keys, how="inner")
    note = (
        f" {n_configs} configurations: drawn is the hyper-parameter setting with the lowest "
        f"mean {'validation' if metric == 'val_nll' else 'test'} NLL per dataset, backbone, "
        f"method, M and variant ({len(chosen)} of them); every configuration is in the tables."
    )
    return kept, note


def declared_figure_meta(cells: pd.DataFrame) -> list[tuple[str, str, str, str, dict]]:
    """``(id, title, caption, needs, declaration)`` of a figure for each diagnostic the records
    declare with one (:class:`harness.contract.DiagnosticFigure`); no plotting import, so the
    figure cache can key them before deciding whether to draw."""
    from reports.columns import declared_diagnostics

    return [
        (
            str(d["figure"]["id"]),
            str(d["figure"].get("title") or d["key"]),
            str(d["figure"].get("caption") or ""),
            f"{d.get('label') or d['key']} at two or more values of {d['figure']['x']}",
            d,
        )
        for d in declared_diagnostics(cells)
        if isinstance(d.get("figure"), dict) and d["figure"].get("x") and d["figure"].get("id")
    ]


@dataclass(frozen=True)
class RenderedFigure:
    """One figure for the page (here, not in :mod:`reports.figures`, so that a report whose
    figures all come from :mod:`reports.figure_cache` imports no matplotlib)."""

    id: str
    title: str
    caption: str
    png: str | None  # base64 PNG, or None when skipped
    note: str = ""  # why it was skipped
    figure: Figure | None = field(default=None, repr=False, compare=False)  # for the files
