"""``harness report --images``: the paired table with the seeds × images interval beside the
t-interval (:mod:`reports.stats.variance`), printed and written as ``paired_images.csv``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reports.columns import m_text
from reports.records.index import load_results
from reports.records.outcomes import with_image_bootstrap
from reports.stats.bootstrap import supports
from reports.stats.paired import default_reference, paired_differences

#: The file beside the leaderboard.
IMAGES_CSV = "paired_images.csv"


def image_table(
    results_dir: Path,
    reference: str | None,
    *,
    test: str = "signflip",
    holm: bool = False,
    level: float = 0.95,
    replicates: int = 2000,
) -> pd.DataFrame:
    """The paired table of ``results_dir`` against ``reference`` (default: the deep ensemble,
    else single) for the per-image metrics (:func:`reports.stats.bootstrap.supports`), with the
    bootstrap's columns.

    Raises:
        ValueError: no reference ran (``harness report`` says so before this is called).
    """
    cells = load_results(results_dir).cells
    reference = reference or default_reference(cells)
    if reference is None:
        raise ValueError(f"{results_dir}: no reference: neither deep_ensemble nor single ran")
    metrics = [m for m in ("acc", "nll", "ece", "brier", "ts/nll", "ts/ece") if m in cells]
    table = paired_differences(cells, reference, metrics, level=level, test=test,
                               holm_adjust=holm)  # fmt: skip
    table = table[[supports(m) for m in table["metric"]]] if len(table) else table
    return with_image_bootstrap(results_dir, cells, reference, table, level, replicates)


def format_images(table: pd.DataFrame, level: float = 0.95) -> str:
    """One line per configuration × metric: the mean difference, the t-interval over seeds and
    the seeds × images interval (percentage points for accuracy and ECE, nats for NLL)."""
    if table.empty:
        return "no paired comparisons with per-image metrics"
    pct = round(level * 100)
    names = [f"{r.method} M={m_text(r.M, '?')}" + (f" ({r.hparams})" if r.hparams else "")
             for r in table.itertuples(index=False)]  # fmt: skip
    width = min(max(len(n) for n in names), 100)
    head = (f"{'configuration':<{width}} {'metric':<7} {'n':>2} {'diff':>8} "
            f"{f'{pct}% t (seeds)':>20} {f'{pct}% seeds×images':>20} {'p':>6}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for name, r in zip(names, table.itertuples(index=False), strict=True):
        scale = 100.0 if r.metric.removeprefix("ts/") in ("acc", "ece") else 1.0
        digits = 2 if scale == 100.0 else 4

        def span(lo: float, hi: float, scale: float = scale, digits: int = digits) -> str:
            if pd.isna(lo):
                return "—"
            return f"[{lo * scale:+.{digits}f}, {hi * scale:+.{digits}f}]"

        boot = span(r.boot_lo, r.boot_hi) if not r.boot_note else r.boot_note[:20]
        p = f"{r.boot_p:.3f}" if not pd.isna(r.boot_p) else "—"
        diff = f"{r.mean_diff * scale:>+8.{digits}f}"
        lines.append(f"{name[:width]:<{width}} {r.metric:<7} {r.n_pairs:>2} {diff} "
                     f"{span(r.ci_lo, r.ci_hi):>20} {boot:>20} {p:>6}")  # fmt: skip
    lines.append(
        f"configuration − {table['reference'].iloc[0]}; accuracy and ECE in percentage points, "
        "NLL in nats; seeds×images: variance components over the paired seeds and the test "
        "images (each noise source counted once), t with Satterthwaite df (docs/methods.md)"
    )
    return "\n".join(lines)


def write_images(results_dir: Path, out_dir: Path, reference: str | None, **kwargs) -> str:
    """Compute :func:`image_table`, write it to ``out_dir/paired_images.csv`` and return the
    printed text."""
    table = image_table(results_dir, reference, **kwargs)
    table.to_csv(out_dir / IMAGES_CSV, index=False)
    return format_images(table)
