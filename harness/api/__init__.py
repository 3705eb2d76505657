"""The harness from Python: check and run suites, read results into pandas, compare them, and
σN-Ens on your own model in your own training loop.

    import harness.api as h

    h.validate("suites/smoke.yaml", ["recipe.epochs=1"])          # every problem, or the cells
    out = h.run("suites/smoke.yaml", ["recipe.epochs=1"], executor="inprocess")
    out.exit_code, out.done, out.failed      # what became of each cell (h.RunResult)
    df = h.load_results(out.results_dir)     # one row per cell, documented columns
    df.groupby("method")["acc"].mean()       # docs/results.md; long tables: h.ood_table …
    h.leaderboard(out.results_dir)           # mean / std / n per configuration × metric, long
    h.paired(out.results_dir, "single")      # the leaderboard's paired table
    h.compare("results/smoke", "results/smoke_new")  # the same configurations, folder b − a
    h.load_records(out.results_dir)          # the raw record dicts (docs/records.md)

    train = h.data("digits", "train", validation=100)  # the benchmark's splits, for your loop
    h.data(dataset, "test", suite="suites/smoke.yaml"); h.data("digits", "digits_heldout")
    h.evaluate(my_model, suite="suites/smoke.yaml", results="results")  # a model you have
    h.load_model("results/smoke/<cell id>"); h.predictions("results/smoke/<cell id>", "test")

    net = h.sigma_ensemble(my_resnet, num_members=4)   # methods._sigma_public

Everything here goes through the code the CLI and the reporter use (the run layer
:mod:`harness.session` below both faces, ``reports.records``, ``reports.stats``); nothing is
computed a second way, and nothing here prints. Reading results imports no torch; :func:`run`,
the model functions (:mod:`harness.api.models`), the data (:mod:`harness.api.datasets`, imported
when :func:`data` or :class:`BenchmarkData` is first named) and the σN-Ens functions do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.api._common import HarnessError, PathLike
from harness.api.models import Evaluated, Predictions, evaluate, load_model, predictions
from harness.api.results import (
    compare,
    conformal_table,
    corruption_table,
    history_table,
    leaderboard,
    load_records,
    load_results,
    ood_table,
    paired,
    reliability_table,
)
from harness.api.running import RunResult, Validation, run, validate
from harness.api.sigma import diversity_loss, k_eff, sigma_ensemble
from harness.session.result import CellFailure, SkippedCell

if TYPE_CHECKING:
    from harness.api.datasets import BenchmarkData, data

__all__ = [
    "BenchmarkData",
    "CellFailure",
    "Evaluated",
    "HarnessError",
    "PathLike",
    "Predictions",
    "RunResult",
    "SkippedCell",
    "Validation",
    "compare",
    "conformal_table",
    "corruption_table",
    "data",
    "diversity_loss",
    "evaluate",
    "history_table",
    "k_eff",
    "leaderboard",
    "load_model",
    "load_records",
    "load_results",
    "ood_table",
    "paired",
    "predictions",
    "reliability_table",
    "run",
    "sigma_ensemble",
    "validate",
]

#: Resolved on first use (PEP 562): they import torch, which reading results does not.
_LAZY = {"BenchmarkData": "harness.api.datasets", "data": "harness.api.datasets"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'harness.api' has no attribute {name!r}")
