"""Two tables of the page and the Markdown: accuracy per corruption, and selection on validation.

A suite that sweeps a method's hyper-parameters (σN-Ens's τ, say) and holds out a validation split
(``recipe.validation: n``) leaves the choice to the reader. This view makes it: per (dataset,
backbone, method, M, variant), the configuration with the lowest mean validation NLL over seeds
(NLL is the proper scoring rule every method is trained on; accuracy ties often), and its test
metrics. Configurations without validation metrics are never candidates, and a group with a
single candidate has nothing to select, so it is left out.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from reports.columns import Column, cell_text, corruption_names, iter_rows, m_text
from reports.records.results import Results

SELECT_ON = "val_nll"
#: (column, label, kind) of the test metrics shown for the selected configuration.
SHOWN = (("acc", "Acc (%)", "pct"), ("nll", "NLL", "f3"), ("ece", "ECE (%)", "pct"))
_GROUP = ("dataset", "backbone", "method", "M", "variant")


def selected_on_validation(summary: pd.DataFrame, metric: str = SELECT_ON) -> pd.DataFrame:
    """The configuration of every sweep with the lowest mean ``metric`` on the validation split.

    Args:
        summary: the per-configuration frame of :func:`reports.stats.summary.aggregate`.
        metric: the validation column to minimise (``val_nll``).

    Returns:
        One row per group with two or more candidates: the group keys, ``hparams`` (the selected
        configuration), ``candidates`` (how many were compared), ``<metric>_mean`` and the selected
        row's ``<col>_mean/_std/_n`` of the shown test metrics. Empty when nothing was swept on a
        validation split.
    """
    col = f"{metric}_mean"
    if summary.empty or col not in summary:
        return pd.DataFrame()
    have = summary[summary[col].map(lambda v: isinstance(v, float | int) and math.isfinite(v))]
    rows = []
    for _, group in have.groupby(list(_GROUP), dropna=False, sort=True):
        if len(group) < 2:
            continue
        best = group.loc[group[col].idxmin()]  # ties: the first in the summary's order
        row = {k: best[k] for k in (*_GROUP, "hparams", col)}
        row["candidates"] = len(group)
        for key, _, _ in SHOWN:
            for stat in ("mean", "std", "n"):
                row[f"{key}_{stat}"] = best.get(f"{key}_{stat}", math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def selection_context(summary: pd.DataFrame) -> dict[str, Any] | None:
    """What the page and the Markdown render: header, rows of text; None when empty."""
    table = selected_on_validation(summary)
    if table.empty:
        return None
    rows = []
    for _, r in table.iterrows():
        rows.append(
            {
                "ident": [r["dataset"], r["backbone"], r["method"], f"{r['M']:g}"],
                "hparams": r["hparams"],
                "candidates": int(r["candidates"]),
                "val": f"{r[f'{SELECT_ON}_mean']:.4f}",
                "cells": [
                    cell_text(r[f"{k}_mean"], r[f"{k}_std"], r[f"{k}_n"], kind)
                    for k, _, kind in SHOWN
                ],
            }
        )
    return {"metric": SELECT_ON, "labels": [label for _, label, _ in SHOWN], "rows": rows}


# The per-corruption accuracy table of the page and the Markdown (one column per corruption).


def corruption_table(results: Results, options: Any) -> dict[str, Any] | None:
    """Per configuration × corruption: accuracy (mean over severities), for its own table.

    ``options``: the :class:`reports.render.page.ReportOptions` (its ``interval`` picks the ±
    part)."""

    summary = results.summary
    names = corruption_names(summary)
    if not names:
        return None
    rows = []
    wanted = {f"corr/{n}/acc_{k}" for n in names for k in ("mean", options.interval)}
    ident = ["dataset", "backbone", "method", "M", "hparams"]
    # Only the columns shown: every row of every column as a dict cost 0.1 s at 1,000 rows.
    for _, r in iter_rows(summary[[c for c in summary.columns if c in wanted or c in ident]]):
        cells = []
        for name in names:
            key = f"corr/{name}/acc"
            spread = r.get(f"{key}_{options.interval}", math.nan)
            cells.append(
                {
                    "key": name,
                    "text": cell_text(r.get(f"{key}_mean"), spread, None, "pct"),
                    "value": "" if pd.isna(r.get(f"{key}_mean")) else repr(float(r[f"{key}_mean"])),
                }
            )
        rows.append({"ident": [m_text(r[k]) if k == "M" else str(r[k]) for k in ident],
                     "cells": cells})  # fmt: skip
    return {"names": names, "rows": rows, "column": Column("corr", "acc", "Corruption", "pct")}
