"""Read results folders into pandas through the reporter's own code: one row per cell with
documented columns (:func:`load_results`, docs/results.md), the long tables
(:func:`corruption_table`, :func:`ood_table`, :func:`reliability_table`, :func:`history_table`,
:func:`conformal_table`), the raw records (:func:`load_records`) and the leaderboard
(:func:`leaderboard`); compare configurations (:func:`paired`, :func:`compare`). Imports no
torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.api._common import HarnessError, PathLike

if TYPE_CHECKING:
    import pandas as pd


def load_results(
    path: PathLike, *, with_records: bool = False, calibrated: bool = False
) -> pd.DataFrame:
    """One row per cell of a results folder (a suite's, or a root holding several suites). Every
    column is listed with its meaning and unit
    in docs/results.md: the configuration (``suite``, ``cell_id``, ``status``, ``dataset``,
    ``backbone``, ``method``, ``M``, ``seed``, ``hparams`` as the leaderboard labels it,
    ``variant``, ``hparams_all`` with every default, ``epochs``, ``calibration``, and one
    ``hp_<name>`` per hyper-parameter a cell set), the headline metrics (``acc``, ``nll``,
    ``ece``, ``brier``…, temperature-scaled ``nll_ts``…, ``cAcc``/``cNLL``/``cECE``, ``mCE``,
    ``ood_auroc``), the diversity diagnostics (``disagreement``, ``k_eff``…, ``collapsed``) and
    cost. Fractions stay fractions and NLL nats, as in the record. Failed cells are rows too
    (``status``, ``error``); of two records of one configuration and seed the newer counts, as
    on the leaderboard. Per corruption, OOD set, reliability bin, epoch and conformal predictor:
    :func:`corruption_table`, :func:`ood_table`, :func:`reliability_table`,
    :func:`history_table`, :func:`conformal_table`.

    Args:
        path: the results folder.
        with_records: add a ``record`` column holding each row's record dict.
        calibrated: add, after each cell with a post-hoc temperature, a row with
            ``calibration == "ts"`` whose metrics are the temperature-scaled ones (every row is
            ``"raw"`` otherwise): select with ``df[df.calibration == "raw"]``, or group by
            ``["method", "calibration"]``.

    Warns:
        UserWarning: records that could not be read (left out; ``harness report`` names them).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    scanned = _scan(path)
    if invalid := [p for p in scanned.problems if p.status == "invalid"]:
        # `harness report` names them and exits 1; a DataFrame would just be short of rows
        import warnings

        first = invalid[0]
        warnings.warn(
            f"{path}: {len(invalid)} record(s) could not be read and are left out (e.g. "
            f"{first.cell_id}: {first.reason}); `harness status {path}` lists them",
            UserWarning,
            stacklevel=2,
        )
    cells = scanned.tidy(calibrated=calibrated)
    if with_records:
        by_id = {(r.get("suite"), r.get("cell_id")): r for r in load_records(path)}
        cells["record"] = [by_id.get(k) for k in zip(cells["suite"], cells["cell_id"])]
    return cells


def _scan(path: PathLike) -> Any:
    """One reading of the folder's records (:class:`reports.records.index.Scan`), whose two
    views are the reporter's ``results()`` and the documented ``tidy()``."""
    from reports.records.index import scan

    return scan(Path(path))


def _wide(path: PathLike) -> pd.DataFrame:
    """The reporter's own per-cell frame (every flattened column, ``single+TS`` as a
    configuration of its own), which :func:`paired` and :func:`compare` pair on, as the
    leaderboard does."""
    return _scan(path).results().cells.reset_index(drop=True)


def _long(path: PathLike, table: str) -> pd.DataFrame:
    from reports.records.tidy import load_long

    return load_long(_scan(path).tidy(), table, load_records(path))


def corruption_table(path: PathLike) -> pd.DataFrame:
    """Per cell × corruption × severity × metric, long: the cell's keys (``suite``, ``cell_id``,
    ``dataset``, ``backbone``, ``method``, ``M``, ``hparams``, ``variant``, ``seed``: joins
    with :func:`harness.api.load_results`), ``calibration`` (``raw``; ``ts`` after the
    temperature fitted on clean held-out images), ``corruption``, ``severity`` (1–5),
    ``metric`` (``acc``, ``nll``, ``ece``… as the record names them) and ``value`` (fractions
    and nats, as in the record). ``cAcc``/``cNLL``/``cECE`` are the means of these over the
    corruptions and severities a cell's ``corruption_mean_over`` names.

    Example: ``t = corruption_table(p); t[t.metric == "acc"].pivot_table(index="method",
    columns="severity", values="value")``."""
    return _long(path, "corruption")


def ood_table(path: PathLike) -> pd.DataFrame:
    """Per cell × OOD set × score × metric, long: the cell's keys (as :func:`corruption_table`),
    ``calibration`` (``raw`` or ``ts``), ``ood_set``, ``score`` (``msp``, ``entropy``, ``mi``,
    and the raw ``energy`` and ``max_logit`` where the model gave logits: higher for more
    in-distribution inputs), ``metric`` (``auroc``, ``aupr_in``, ``aupr_out``,
    ``fpr95`` with OOD positive, ``fpr95_id`` with ID positive) and ``value`` (a fraction).
    :func:`harness.api.load_results`' ``ood_auroc`` is the mean of the raw MSP AUROC over the
    sets."""
    return _long(path, "ood")


def reliability_table(path: PathLike) -> pd.DataFrame:
    """Per cell × reliability bin, long: the cell's keys (as :func:`corruption_table`),
    ``calibration`` (``raw`` or ``ts``), ``member`` (empty for the ensemble's prediction, else
    the member's index: its own bins, raw), ``bin`` (0–14), ``lower`` and ``upper`` (the bin's
    confidence edges: 15 equal-width bins of [0, 1], the ECE's), ``count`` (test images whose
    top-class confidence falls in the bin), ``confidence`` (their mean confidence) and
    ``accuracy`` (the fraction of them classified correctly; both empty for an empty bin).
    Seeds pool by adding ``count`` and the count-weighted ``confidence`` and ``accuracy``."""
    return _long(path, "reliability")


def history_table(path: PathLike) -> pd.DataFrame:
    """Per cell × epoch × metric, long: the cell's keys (as :func:`corruption_table`),
    ``source`` (``history``: the training loop's ``train_loss``, ``train_acc``, ``lr``,
    ``time_s``, ``steps`` and, with a validation split, ``val_acc``, ``val_nll``…;
    ``diagnostics``: the method's per-epoch diagnostics, e.g. σN-Ens's ``k_eff``,
    ``k_eff_scale``, ``grad_ratio``, ``l_div``), ``epoch`` (from 1) and ``value`` (numbers
    only)."""
    return _long(path, "history")


def conformal_table(path: PathLike) -> pd.DataFrame:
    """Per cell × conformal predictor × α × split × statistic, long: the cell's keys (as
    :func:`corruption_table`), ``predictor`` (``thr``, ``aps``, ``raps``), ``alpha`` (the target
    miscoverage; NaN for a record that stated none), ``split`` (``clean``: the test set;
    ``corrupted``: the mean over the corruption sets), ``stat`` (``coverage``, ``size``,
    ``empty_rate`` of the sets as defined; ``coverage_fallback``, ``size_fallback`` with
    torch-uncertainty's top class added to an empty set) and ``value`` (fractions; sizes in
    classes). docs/methods.md, "Post-hoc calibration and conformal sets"."""
    return _long(path, "conformal")


def load_records(path: PathLike) -> list[dict[str, Any]]:
    """The raw records (``record.json`` dicts, docs/records.md) of a results folder or of a
    root of suite folders; damaged ones are left out (``harness status`` names them)."""
    from harness.contract import RECORD_FILE, iter_records

    root = Path(path)
    if not root.is_dir():
        what = "is a file, not a results folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"results folder {root} {what}")
    if any(root.glob(f"*/{RECORD_FILE}")) or not any(root.glob(f"*/*/{RECORD_FILE}")):
        return list(iter_records(root))
    return [r for suite in sorted(p for p in root.iterdir() if p.is_dir())
            for r in iter_records(suite)]  # fmt: skip


def leaderboard(
    path: PathLike,
    metrics: Sequence[str] | None = None,
    *,
    calibrated: bool = False,
    wide: bool = False,
) -> pd.DataFrame:
    """Mean, std and n per configuration, long: one row per configuration × metric, over the
    cells :func:`load_results` returns (the same numbers: its columns, averaged by the
    reporter's own statistics). docs/results.md, "leaderboard", lists the columns:
    the configuration (``dataset``, ``backbone``, ``method``, ``M``, ``hparams``, ``variant``,
    ``calibration``), ``n_cells`` (done cells) and ``n_failed``, ``metric``, ``mean``, ``std``
    (over the seeds, ddof = 1), ``n`` (the finite values averaged) and ``ci`` (the 95%
    t-interval's half-width). A configuration × metric without a value has no row.

    Example: ``b = h.leaderboard(p); b.pivot_table(index=["method", "M"], columns="metric",
    values="mean")``.

    Args:
        path: the results folder.
        metrics: columns of :func:`load_results` to average (numbers; a plugin's metric
            too); default: ``acc``, ``nll``, ``ece``, ``brier``, ``aurc``, ``cAcc``, ``cNLL``,
            ``cECE``, ``mCE``, ``ood_auroc``, ``ood_fpr95``, ``member_acc``, ``disagreement``,
            ``mi``, ``k_eff``, ``params``, ``flops``, ``train_time_s``.
        calibrated: add the temperature-scaled configurations (``calibration == "ts"``: the
            page's ``single+TS`` row and its like for every recalibrated method).
        wide: deprecated: the reporter's own summary frame (``<metric>_mean``, ``_std``,
            ``_n``, ``_ci`` of its 400+ columns, about 1,500 columns); it warns
            (``FutureWarning``) and will go: pivot the long frame instead.

    Raises:
        HarnessError: a metric that is not a numeric column of :func:`load_results`, or
            ``metrics`` not a list of names (one line, naming the choices).
        FileNotFoundError: the folder does not exist.
    """
    from reports.records.tidy import LEADERBOARD_METRICS, leaderboard_table, numeric_columns

    if isinstance(metrics, str) or not (metrics is None or (
        isinstance(metrics, Sequence) and all(isinstance(m, str) for m in metrics)
    )):  # fmt: skip
        raise HarnessError([f"metrics: {metrics!r}: pass a list of column names (['acc', "
                            "'nll']) or None for the default set"])  # fmt: skip
    scanned = _scan(path)
    if wide:
        import warnings

        warnings.warn(
            "h.leaderboard(path, wide=True) returns the reporter's ~1,500-column summary and "
            "will be removed; use h.leaderboard(path) (long: one row per configuration × "
            "metric with mean, std, n, ci) and pivot it: board.pivot_table(index=['method', "
            "'M'], columns='metric', values='mean')",
            FutureWarning,
            stacklevel=2,
        )
        return scanned.results().summary
    cells = scanned.tidy(calibrated=calibrated)
    if not len(cells):  # every metric would be "not a numeric column"
        raise HarnessError([f"{path}: no records yet (harness run writes one per cell)"])
    chosen = list(dict.fromkeys(metrics or LEADERBOARD_METRICS))
    known = numeric_columns(cells)
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise HarnessError([f"metrics: {unknown} are not numeric columns of "
                            f"h.load_results({str(path)!r}); choose from {known}"])  # fmt: skip
    return leaderboard_table(cells, chosen)


def paired(
    path: PathLike,
    reference: str | None = None,
    metrics: Sequence[str] | None = None,
    *,
    level: float = 0.95,
    test: str = "signflip",
    holm: bool = False,
    images: bool = False,
    replicates: int = 2000,
) -> pd.DataFrame:
    """The leaderboard's paired table: each configuration minus ``reference``, seed by seed.

    Args:
        path: the results folder.
        reference: a method (``"single"``) or a configuration (``"sigma_ens:tau=0.1"``);
            default ``deep_ensemble`` if it ran, else ``single``.
        metrics: columns to compare (default: acc, nll, ece, brier, cAcc, cECE, OOD MSP AUROC).
        level: the t-interval's level, a fraction in (0, 1) (0.95, not 95).
        test: ``"signflip"`` (exact) or ``"t"``.
        holm: Holm's adjustment over every row.
        images: also the comparison that counts the test set's sampling, seeds × images
            crossed, from each cell's ``outcomes.npz``: the unbiased variance-components
            interval, Satterthwaite's df (:mod:`reports.stats.bootstrap`, docs/methods.md), as
            ``boot_se``, ``boot_lo``, ``boot_hi`` (at ``level``), ``boot_p``, ``df``,
            ``n_images``, ``boot_note`` (why a row has none; the names are the former
            bootstrap's), ``boot_p_adjusted`` (Holm over the table when ``holm``) and
            ``boot_significant``.
        replicates: a whole number ≥ 2, still checked; the images' interval draws nothing.

    Returns:
        :func:`reports.stats.paired.paired_differences`'s frame (``mean_diff``, ``ci_lo``,
        ``ci_hi``, ``p_value``, ``significant``… per configuration × metric).

    Raises:
        HarnessError: before anything is read, a ``level``, ``replicates`` or ``test`` that
            cannot be used (one line each); then a ``reference`` without done cells (the line
            names the methods that have some); with ``images``, a compared cell's damaged
            ``outcomes.npz`` (the line names the file and what is wrong), one whose number of
            images differs from its record's, or two cells of one comparison scored on
            different numbers of images (the line names both folders and both counts).
        FileNotFoundError: the folder does not exist.
    """
    from harness.contract.errors import DamagedFile, UsageError
    from reports.stats.bootstrap import argument_problems
    from reports.stats.paired import (
        check_test,
        default_reference,
        missing_reference,
        paired_differences,
    )

    # The arguments first: a level of 95 or zero replicates would otherwise come back as NaN
    # columns, or a notice on every row, after the results were read.
    problems = argument_problems(level, replicates)
    try:
        check_test(test)
    except ValueError as exc:
        problems.append(f"test={test!r}: {exc}")
    if problems:
        raise HarnessError(problems)
    cells = _wide(path)
    reference = reference or default_reference(cells)
    if reference is None:
        raise HarnessError([f"{path}: no reference: neither deep_ensemble nor single ran"])
    problem = missing_reference(cells, reference)  # as `harness report --reference` refuses it
    if problem:
        raise HarnessError([f"{path}: {problem}"])
    table = paired_differences(cells, reference, metrics, level=level, test=test, holm_adjust=holm)
    if images:
        from reports.records.outcomes import with_image_bootstrap

        try:
            table = with_image_bootstrap(
                Path(path), cells, reference, table, level, replicates, holm=holm
            )
        except (DamagedFile, UsageError) as exc:  # a damaged outcomes.npz, counts that differ
            raise HarnessError([str(exc)]) from exc
    return table


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

    a, b = (_wide(p) for p in (path_a, path_b))
    a, b = (f[f["status"] == "done"] for f in (a, b))
    metrics = list(metrics or [m for m in default_metrics(a) if m in b.columns])
    keys = [*CONFIG_KEYS, "seed"]
    per_seed = [f.groupby(keys, dropna=False)[metrics].mean() for f in (a, b)]
    both = (
        per_seed[0]
        .merge(per_seed[1], how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))
        .reset_index()
    )
    if both.empty:  # an empty frame without columns read as "no difference"
        raise HarnessError([
            f"{path_a} and {path_b} share no configuration and seed (a configuration is dataset, "
            "backbone, method, M, hparams and variant; a recipe override makes a variant)"
        ])  # fmt: skip
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
