"""The harness from Python: check and run suites, read results into pandas, compare them, and
σN-Ens on your own model in your own training loop.

    import harness.api as h

    h.validate("suites/smoke.yaml", ["recipe.epochs=1"])          # every problem, or the cells
    out = h.run("suites/smoke.yaml", ["recipe.epochs=1"], executor="inprocess")
    df = h.load_results(out.results_dir)     # one row per record, the leaderboard's columns
    df.groupby("method")["acc"].mean()
    h.leaderboard(out.results_dir)           # mean / std / n per configuration
    h.paired(out.results_dir, "single")      # the leaderboard's paired table
    h.compare("results/smoke", "results/smoke_new")  # the same configurations, folder b − a
    h.load_records(out.results_dir)          # the raw record dicts (docs/records.md)

    net = h.sigma_ensemble(my_resnet, num_members=4)   # methods._sigma_public

Everything here goes through the code the CLI and the reporter use (suite loading and
validation, ``harness run``, ``reports.records``, ``reports.stats``); nothing is computed a
second way. Reading results imports no torch; :func:`run` and the σN-Ens functions do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from harness.contract import Cell
    from methods._sigma_public import SigmaEnsembleModel

__all__ = [
    "HarnessError",
    "RunResult",
    "Validation",
    "compare",
    "diversity_loss",
    "k_eff",
    "leaderboard",
    "load_records",
    "load_results",
    "paired",
    "run",
    "sigma_ensemble",
    "validate",
]

PathLike = str | os.PathLike


class HarnessError(ValueError):
    """A suite, an override or the data is not right; ``problems`` holds one line each (the
    lines ``harness validate`` prints)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Validation:
    """A suite that passed every check.

    Attributes:
        suite: the suite's name (its results go to ``<results>/<suite>``).
        cells: the cells it expands to (after ``only``): ``cell.cell_id``, ``cell.label``,
            ``cell.config()``.
        left_out: ``(method, why)`` for each method ``methods: [all]`` leaves out.
    """

    suite: str
    cells: list[Cell]
    left_out: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` did.

    Attributes:
        exit_code: ``harness run``'s: 0 every cell done (or handed to Slurm), 1 a cell failed
            (its record says why), 2 a problem found before anything ran or missing data.
        results_dir: the suite's results folder; read it with :func:`load_results`.
    """

    exit_code: int
    results_dir: Path


def _suite_problems(exc: Exception) -> list[str]:
    return list(getattr(exc, "problems", None) or [str(exc)])


def validate(
    suite: PathLike,
    overrides: Sequence[str] = (),
    *,
    only: Sequence[str] = (),
    check_data: bool = True,
    data_root: PathLike | None = None,
) -> Validation:
    """Check a suite as ``harness validate`` does, without training anything.

    Args:
        suite: a suite YAML file.
        overrides: ``KEY=VALUE`` strings, as on the command line (``"recipe.epochs=1"``).
        only: ``--only`` filters (``"method=sigma_ens,seed=0"``).
        check_data: check that the datasets (and ``pretrained:`` weights) are on this machine.
        data_root: where the data lives (default: ``$HARNESS_DATA_ROOT``, else the user cache).

    Returns:
        The suite's name and cells.

    Raises:
        HarnessError: every problem, each naming its file and key or the override.
    """
    from harness.cli.validate import check_data as data_problems
    from harness.cli.validate import load_suite_arg
    from harness.config.includes import SuiteError
    from harness.config.overrides import CellFilter
    from harness.registry.core import RegistryError

    try:
        loaded = load_suite_arg(str(suite), list(overrides), check_files=check_data)
        cells = CellFilter(list(only)).select(loaded.cells())
    except (SuiteError, RegistryError, FileNotFoundError) as exc:
        raise HarnessError(_suite_problems(exc)) from None
    if check_data:
        from harness.data.base import default_data_root

        root = default_data_root(Path(data_root) if data_root else None)
        if problems := data_problems(loaded, root):
            raise HarnessError([f"{suite}: {p}" for p in problems])
    return Validation(loaded.name, cells, list(loaded.left_out))


def run(
    suite: PathLike,
    overrides: Sequence[str] = (),
    *,
    executor: str = "auto",
    results: PathLike = "results",
    only: Sequence[str] = (),
    force: bool = False,
    loggers: Sequence[str] = (),
    workers: int | None = None,
    threads: int | None = None,
    data_root: PathLike | None = None,
    progress: bool = False,
    args: Sequence[str] = (),
) -> RunResult:
    """Run a suite's pending cells as ``harness run`` does (same checks, executors, records).

    Args:
        suite: a suite YAML file.
        overrides: ``KEY=VALUE`` strings (``"recipe.epochs=1"``).
        executor: ``auto``, ``inprocess``, ``local``, ``slurm`` or a plugin's.
        results: the results root; the suite's folder is ``<results>/<suite name>``.
        only: ``--only`` filters.
        force: redo finished cells.
        loggers: trackers (``"mlflow"``, ``"wandb"``, ``"tensorboard"``); MLflow logs to
            ``$MLFLOW_TRACKING_URI`` when set, else to ``<results>/<suite>/mlruns``.
        workers, threads: local worker processes and torch threads per worker.
        data_root: where the data lives.
        progress: show progress bars (off by default in a notebook).
        args: any other ``harness run`` flags (``["--profile", "local", "--wait"]``).

    Returns:
        The exit code and the results folder. The summary table is printed as the CLI prints it.

    Raises:
        HarnessError: the problems that stop a run before it starts (the suite, overrides, data).
    """
    from harness.cli import main
    from harness.storage.loggers import LOGGERS_ENV
    from harness.storage.progress import TENSORBOARD_ENV

    name = validate(suite, overrides, only=only, check_data=False).suite
    argv = ["run", str(suite), *overrides, "--executor", executor, "--results", str(results)]
    for flag in only:
        argv += ["--only", flag]
    for logger in loggers:
        argv += ["--logger", logger]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if data_root is not None:
        argv += ["--data-root", str(data_root)]
    argv += [*(["--force"] if force else []), *([] if progress else ["-q"]), *args]
    # `harness run --logger` hands the trackers to the cells' processes through the environment;
    # in a long-lived Python session that must not outlive this call.
    saved = {k: os.environ.get(k) for k in (LOGGERS_ENV, TENSORBOARD_ENV)}
    try:
        code = main(argv)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return RunResult(code, Path(results) / name)


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


# --- σN-Ens on your own model (torch; imported when called) ------------------------------------


def sigma_ensemble(model: nn.Module, num_members: int, **kwargs: Any) -> SigmaEnsembleModel:
    """:func:`methods._sigma_public.sigma_ensemble`: a user's model with BatchNorm, LayerNorm or
    GroupNorm as a σN-Ens of ``num_members`` members (input (B, ...) → logits (M, B, K))."""
    from methods._sigma_public import sigma_ensemble as make

    return make(model, num_members, **kwargs)


def diversity_loss(model: nn.Module, tau: float, lam: float) -> Any:
    """:func:`methods._sigma_public.diversity_loss`: λ·L_div to add to the task loss."""
    from methods._sigma_public import diversity_loss as loss

    return loss(model, tau, lam)


def k_eff(model: nn.Module) -> float:
    """:func:`methods._sigma_public.k_eff`: members sharing a feature (1 = owned, M = shared)."""
    from methods._sigma_public import k_eff as measure

    return measure(model)
