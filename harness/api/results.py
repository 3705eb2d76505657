"""Read results folders into pandas (:func:`load_results`, :func:`load_records`,
:func:`leaderboard`) and compare configurations (:func:`paired`, :func:`compare`) through the
reporter's own code. Imports no torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.api._common import HarnessError, PathLike

if TYPE_CHECKING:
    import pandas as pd


def load_results(path: PathLike, *, with_records: bool = False) -> pd.DataFrame:
    """One row per record of a results folder (a suite's, or a root holding several suites),
    with the leaderboard's columns: identity (``suite``, ``cell_id``, ``status``, ``dataset``,
    ``backbone``, ``method``, ``M``, ``hparams``, ``variant``, ``seed``, ``label``), each
    hyper-parameter (``hp_tau``…), the clean metrics (``acc``, ``nll``, ``ece``… as fractions
    and nats, as in the record), corruption (``cAcc``, ``cNLL``, ``cECE``), OOD
    (``ood/<set>/<score>/<metric>``), cost and diagnostics. Failed cells are rows too (their
    ``status`` says so); of two records of one configuration and seed the newer counts, as on
    the leaderboard.

    Args:
        path: the results folder.
        with_records: add a ``record`` column holding each row's record dict.

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    from reports.records.index import load_results as load

    cells = load(Path(path)).cells.reset_index(drop=True)
    if with_records:
        by_id = {(r.get("suite"), r.get("cell_id")): r for r in load_records(path)}
        cells["record"] = [by_id.get(k) for k in zip(cells["suite"], cells["cell_id"])]
    return cells


def load_records(path: PathLike) -> list[dict[str, Any]]:
    """The raw records (``record.json`` dicts, docs/records.md) of a results folder or of a
    root of suite folders; damaged ones are left out (``harness status`` names them)."""
    from harness.contract import RECORD_FILE, iter_records

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"results folder {root} does not exist")
    if any(root.glob(f"*/{RECORD_FILE}")) or not any(root.glob(f"*/*/{RECORD_FILE}")):
        return list(iter_records(root))
    return [r for suite in sorted(p for p in root.iterdir() if p.is_dir())
            for r in iter_records(suite)]  # fmt: skip


def leaderboard(path: PathLike) -> pd.DataFrame:
    """The leaderboard's table: one row per configuration (``dataset``, ``backbone``,
    ``method``, ``M``, ``hparams``, ``variant``) with ``n`` seeds and ``<metric>_mean``,
    ``_std``, ``_n``, ``_ci`` for each metric."""
    from reports.records.index import load_results as load

    return load(Path(path)).summary


def paired(
    path: PathLike,
    reference: str | None = None,
    metrics: Sequence[str] | None = None,
    *,
    level: float = 0.95,
    test: str = "signflip",
    holm: bool = False,
) -> pd.DataFrame:
    """The leaderboard's paired table: each configuration minus ``reference``, seed by seed.

    Args:
        path: the results folder.
        reference: a method (``"single"``) or a configuration (``"sigma_ens:tau=0.1"``);
            default ``deep_ensemble`` if it ran, else ``single``.
        metrics: columns to compare (default: acc, nll, ece, brier, cAcc, cECE, OOD MSP AUROC).
        level: the t-interval's level.
        test: ``"signflip"`` (exact) or ``"t"``.
        holm: Holm's adjustment over every row.

    Returns:
        :func:`reports.stats.paired.paired_differences`'s frame (``mean_diff``, ``ci_lo``,
        ``ci_hi``, ``p_value``, ``significant``… per configuration × metric).
    """
    from reports.stats.paired import default_reference, missing_reference, paired_differences

    cells = load_results(path)
    reference = reference or default_reference(cells)
    if reference is None:
        raise HarnessError([f"{path}: no reference: neither deep_ensemble nor single ran"])
    problem = missing_reference(cells, reference)  # as `harness report --reference` refuses it
    if problem:
        raise HarnessError([f"{path}: {problem}"])
    return paired_differences(cells, reference, metrics, level=level, test=test, holm_adjust=holm)


def compare(
    path_a: PathLike,
    path_b: PathLike,
    metrics: Sequence[str] | None = None,
    *,
    level: float = 0.95,
    test: str = "signflip",
) -> pd.DataFrame:
    """The configurations two results folders share, metric by metric: ``b − a`` over the
    seeds both ran (e.g. the same suite before and after a change).

    Pairing and statistics are the leaderboard's: a configuration is (dataset, backbone,
    method, M, hparams, variant); seeds present in one folder only and non-finite values are
    left out; the interval is the paired t-interval and the p-value that of ``test``
    (:mod:`reports.stats.significance`).

    Returns:
        One row per configuration × metric: the configuration keys, ``metric``, ``n_pairs``,
        ``seeds``, ``mean_a``, ``mean_b``, ``mean_diff`` (b − a), ``ci_lo``, ``ci_hi``,
        ``p_value``.
    """
    import numpy as np
    import pandas as pd

    from reports.stats.paired import CONFIG_KEYS, default_metrics
    from reports.stats.significance import pvalue, t_interval

    a, b = (load_results(p) for p in (path_a, path_b))
    a, b = (f[f["status"] == "done"] for f in (a, b))
    metrics = list(metrics or [m for m in default_metrics(a) if m in b.columns])
    keys = [*CONFIG_KEYS, "seed"]
    per_seed = [f.groupby(keys, dropna=False)[metrics].mean() for f in (a, b)]
    both = (
        per_seed[0]
        .merge(per_seed[1], how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))
        .reset_index()
    )
    rows = []
    for config, group in both.groupby(list(CONFIG_KEYS), dropna=False, sort=True):
        for metric in metrics:
            pair = group[[f"{metric}_a", f"{metric}_b", "seed"]].apply(pd.to_numeric)
            pair = pair[np.isfinite(pair).all(axis=1)]
            diffs = (pair[f"{metric}_b"] - pair[f"{metric}_a"]).to_numpy()
            mean, lo, hi = t_interval(diffs, level)
            rows.append({
                **dict(zip(CONFIG_KEYS, config)),
                "metric": metric,
                "n_pairs": len(diffs),
                "seeds": " ".join(str(int(s)) for s in pair["seed"]),
                "mean_a": float(pair[f"{metric}_a"].mean()),
                "mean_b": float(pair[f"{metric}_b"].mean()),
                "mean_diff": float(mean),
                "ci_lo": float(lo),
                "ci_hi": float(hi),
                "p_value": float(pvalue(diffs, test)) if len(diffs) else float("nan"),
            })  # fmt: skip
    return pd.DataFrame(rows)
