"""The per-corruption accuracy table of the page and the Markdown (one column per corruption)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from reports.columns import Column, cell_text, corruption_names, iter_rows, m_text
from reports.results import Results


def corruption_table(results: Results, options: Any) -> dict[str, Any] | None:
    """Per configuration × corruption: accuracy (mean over severities), for its own table.

    ``options``: the :class:`reports.page.ReportOptions` (its ``interval`` picks the ± part)."""

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
        rows.append(
            {
                "ident": [
                    str(r["dataset"]),
                    str(r["backbone"]),
                    str(r["method"]),
                    m_text(r["M"]),
                    str(r["hparams"]),
                ],
                "cells": cells,
            }
        )
    return {"names": names, "rows": rows, "column": Column("corr", "acc", "Corruption", "pct")}
