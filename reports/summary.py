"""Per-configuration statistics over seeds: mean, sample std and n of every metric.

``aggregate`` groups done cells by (dataset, backbone, method, M, hparams, variant) and gives, per
metric, ``<col>_mean``, ``<col>_std`` (sample std, ddof=1; NaN when fewer than two values) and
``<col>_n`` (the number of finite values, so a diverged seed shows as a smaller n, never as a
silently better mean).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.columns import GROUP_KEYS, ID_COLUMNS, TEXT_COLUMNS


def metric_columns(cells: pd.DataFrame) -> list[str]:
    """The numeric measurement columns of a cell frame (not identity, text or hparams)."""
    skip = set(ID_COLUMNS) | set(TEXT_COLUMNS)
    return [
        c
        for c in cells.columns
        if c not in skip and not c.startswith("hp_") and pd.api.types.is_numeric_dtype(cells[c])
    ]


def aggregate(cells: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (ddof=1) and n of every metric over the seeds of each group of done cells.

    Non-finite values (a diverged seed) are left out of mean and std and counted in
    ``n_nonfinite``; ``n`` is the number of done cells, ``n_failed`` the failed ones of the group.
    """
    keys = list(GROUP_KEYS)
    metrics = metric_columns(cells)
    done = cells[cells["status"] == "done"]
    if done.empty:
        return pd.DataFrame(columns=[*keys, "n", "n_failed", "n_nonfinite", "seeds"])
    values = done[metrics].astype(float)
    nonfinite = ~np.isfinite(values[[c for c in ("acc", "nll") if c in values]]).all(axis=1)
    values = values.where(np.isfinite(values))
    grouped = values.groupby([done[k] for k in keys], dropna=False, sort=True)
    parts = {"mean": grouped.mean(), "std": grouped.std(ddof=1), "n": grouped.count()}
    stats = pd.DataFrame({f"{c}_{s}": parts[s][c] for c in metrics for s in ("mean", "std", "n")})
    by_key = done.groupby(keys, dropna=False, sort=True)
    failed = cells[cells["status"] == "failed"].groupby(keys, dropna=False).size()
    front = pd.DataFrame(
        {
            "n": by_key.size(),
            "n_failed": failed.reindex(stats.index, fill_value=0).astype(int),
            "n_nonfinite": nonfinite.groupby([done[k] for k in keys], dropna=False).sum(),
            "seeds": by_key["seed"].agg(lambda s: ", ".join(str(x) for x in sorted(s))),
        }
    )
    hp = [c for c in cells.columns if c.startswith("hp_")]
    stats = pd.concat([front, stats, *([by_key[hp].first()] if hp else [])], axis=1)
    return stats.reset_index()
