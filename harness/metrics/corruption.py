"""Summary of corruption-shift cells: cAcc / cNLL / cECE over the benchmark corruptions only.

Hendrycks & Dietterich (ICLR 2019) average over 15 benchmark corruptions × 5 severities; the 4
extra corruptions of CIFAR-10-C / CIFAR-100-C were their validation set and are reported apart.
uncertainty-baselines' cA / cNLL / cCE (baselines/cifar/README.md) are likewise "the mean across
corruption intensities and corruption types". Mixing extras into the mean, or averaging fewer
corruptions than the benchmark, gives numbers that cannot be compared with published ones, so the
summary says exactly what it averaged (``corruption_mean_over``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["CELL_METRICS", "summarize_corruptions", "summarize_sets"]

#: Metrics of each corruption × severity cell.
CELL_METRICS = ("acc", "nll", "ece")


def _mean(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {k: sum(r[k] for r in rows) / len(rows) for k in CELL_METRICS}


def _slope(severities: Sequence[int], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` over severity (0 with a single severity)."""
    if len(severities) < 2:
        return 0.0
    x = torch.tensor([float(s) for s in severities], dtype=torch.float64)
    y = torch.tensor(list(values), dtype=torch.float64)
    design = torch.stack([x, torch.ones_like(x)], 1)  # (S, 2)
    return float(torch.linalg.lstsq(design, y[:, None]).solution[0])


def summarize_corruptions(
    cells: list[dict[str, Any]], dataset: str, severities: Sequence[int]
) -> dict[str, Any]:
    """The ``metrics.corruption`` block of a record.

    Args:
        cells: One dict per evaluated corruption × severity with ``corruption``, ``severity``,
            ``acc``, ``nll``, ``ece``.
        dataset: Registered dataset name (decides which corruptions are its benchmark set).
        severities: The severities evaluated, in order.

    Returns:
        ``cells`` as given; ``mean`` ({acc, nll, ece}: cAcc, cNLL, cECE) and ``per_severity``
        over the benchmark corruptions only; ``ece_slope`` (of the per-severity ECE);
        ``corruptions`` / ``corruptions_used`` (every corruption evaluated);
        ``mean_corruptions`` (those averaged); ``corruption_mean_over`` (one line saying so);
        ``extras`` ({corruptions, mean}) for evaluated extras, or None.

    Raises:
        ValueError: No cell, or no benchmark corruption among the cells.
    """
    from harness.data._machinery.corruption_sets import corruption_set, mean_over

    if not cells:
        raise ValueError("no corruption cell to summarize")
    bench = set(corruption_set(dataset).benchmark)
    used = list(dict.fromkeys(c["corruption"] for c in cells))
    in_mean = [c for c in cells if c["corruption"] in bench]
    if not in_mean:
        raise ValueError(
            f"none of the evaluated corruptions ({', '.join(used)}) is a benchmark corruption "
            f"of {dataset!r}: cAcc/cNLL/cECE would be undefined"
        )
    extras = [c for c in cells if c["corruption"] not in bench]
    per_sev = {
        str(s): _mean(rows)
        for s in severities
        if (rows := [c for c in in_mean if c["severity"] == s])
    }
    sevs = [s for s in severities if str(s) in per_sev]
    return {
        "cells": cells,
        "per_severity": per_sev,
        "mean": _mean(in_mean),
        "ece_slope": _slope(sevs, [per_sev[str(s)]["ece"] for s in sevs]),
        "corruptions": used,
        "corruptions_used": used,
        "mean_corruptions": [c for c in used if c in bench],
        "corruption_mean_over": mean_over(dataset, used, tuple(severities)),
        "extras": (
            {
                "corruptions": list(dict.fromkeys(c["corruption"] for c in extras)),
                "mean": _mean(extras),
            }
            if extras
            else None
        ),
    }


def summarize_sets(
    cells: list[dict[str, Any]], dataset: str, severities: Sequence[int]
) -> dict[str, Any]:
    """Conformal sets under corruption: coverage and mean set size per severity and overall.

    Args:
        cells: One dict per corruption × severity with ``corruption``, ``severity`` and the
            set statistics (:class:`harness.metrics.posthoc.SetAccumulator`: ``coverage``,
            ``size``, ``coverage_fallback``, ``size_fallback``, ``empty_rate``).
        dataset: Registered dataset name (its benchmark corruptions are averaged, as cAcc).
        severities: The severities evaluated, in order.

    Returns:
        ``cells`` as given, ``per_severity`` ({severity: {statistic: mean}}) and ``mean``, both
        over the benchmark corruptions only (extras are in ``cells``).
    """
    from harness.data._machinery.corruption_sets import corruption_set

    bench = set(corruption_set(dataset).benchmark)
    in_mean = [c for c in cells if c["corruption"] in bench]

    keys = [k for k in (cells[0] if cells else {}) if k not in ("corruption", "severity")]

    def mean(rows: list[dict[str, Any]]) -> dict[str, float]:
        return {k: sum(r[k] for r in rows) / len(rows) for k in keys}

    per_sev = {
        str(s): mean(rows)
        for s in severities
        if (rows := [c for c in in_mean if c["severity"] == s])
    }
    return {"cells": cells, "per_severity": per_sev, "mean": mean(in_mean) if in_mean else {}}
