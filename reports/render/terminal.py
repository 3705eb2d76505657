"""A compact fixed-width leaderboard for the terminal, and the summary ``harness run`` ends with.

Reporter side: reads records and the manifest through the contract layer only, so executors and
the CLI call it without the reporter ever importing them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from harness.contract import SUITE_FILE, read_manifest
from harness.contract.manifest import expected_cells
from reports.columns import (
    COLLAPSE_DISAGREEMENT,
    Column,
    cell_text,
    collapsed,
    leaderboard_columns,
    m_text,
)
from reports.records.flatten import describe_config
from reports.records.index import file_key, load_results
from reports.records.results import Results
from reports.stats.summary import aggregate

TERMINAL_COLUMNS = (
    "acc", "nll", "ece", "ts/nll", "ts/ece", "cAcc", "cECE", "disagreement", "k_eff", "params",
    "eval_ips",
)  # fmt: skip
COLLAPSED = "[collapsed]"  # after the method of a collapsed ensemble (reports.columns.collapsed)
MAX_TEXT = 28


def _clip(text: str, width: int = MAX_TEXT) -> str:
    text = " ".join(str(text).split())  # no newlines or tabs from a config value
    text = "".join(ch if ch.isprintable() else "?" for ch in text)  # nor escape sequences
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(df: pd.DataFrame, columns: tuple[str, ...] = TERMINAL_COLUMNS) -> str:
    """A fixed-width table of mean±std per configuration.

    ``df`` is either the per-cell frame (:func:`reports.records.results.records_to_frame`,
    aggregated
    here) or the summary of :func:`reports.stats.summary.aggregate`. Columns without data are left
    out;
    the first OOD set's MSP AUROC is added when present, and APS's coverage at every α
    (:func:`conformal_coverage`). A collapsed ensemble's method is marked :data:`COLLAPSED`
    (:func:`reports.columns.collapsed`) and the footer says what that means. Failed cells are
    counted in a footer.
    """
    per_cell = "seed" in df.columns and "n" not in df.columns
    summary = aggregate(df) if per_cell else df
    n_failed = int((df["status"] == "failed").sum()) if per_cell and len(df) else 0
    if not len(summary):
        return "no done cells" + (f"; {n_failed} failed" if n_failed else "")
    available = {c.key: c for c in leaderboard_columns(summary)}
    cols: list[Column] = [available[k] for k in columns if k in available]
    cols += [c for k, c in available.items() if k.endswith("/msp/auroc")][:1]
    cols += conformal_coverage(available)
    ident = ["dataset", "backbone", "method", "M", "hparams", "n"]
    if summary["variant"].astype(bool).any():
        ident.insert(5, "variant")
    header = ident + [c.label.replace(" (%)", "%").replace("AUROC ", "MSP-AUROC ") for c in cols]
    rows = []
    flags = collapsed(summary.get("disagreement_mean", pd.Series(float("nan"), summary.index)),
                      summary["M"])  # fmt: skip
    for (_, r), flag in zip(summary.iterrows(), flags, strict=True):
        method = f"{r['method']} {COLLAPSED}" if flag else r["method"]
        cells = [
            m_text(r[k]) if k == "M" else str(int(r[k])) if k == "n"
            else _clip(method if k == "method" else r[k])
            for k in ident
        ]  # fmt: skip
        for c in cols:
            text = cell_text(r[f"{c.key}_mean"], r[f"{c.key}_std"], None, c.kind)
            cells.append(text.replace(" ± ", "±"))
        rows.append(cells)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    numeric = [h in ("M", "n") for h in ident] + [True] * len(cols)

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)]
        return "  ".join(out).rstrip()

    text = [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    footer = "mean±std over seeds; % columns are ×100"
    if flags.any():
        footer += (f"; {COLLAPSED}: members disagree on < {100 * COLLAPSE_DISAGREEMENT:g}% of "
                   "test images, one model")  # fmt: skip
    if n_failed:
        footer += f"; {n_failed} failed cell{'s' if n_failed != 1 else ''} not shown"
    return "\n".join([*text, footer])


def conformal_coverage(available: Mapping[str, Column]) -> list[Column]:
    """APS's clean coverage at every α (its label states α), of the sets as defined; for
    records that hold only torch-uncertainty's (top class added to an empty set), that one,
    labelled "+fb"."""
    aps = [c for k, c in available.items() if k.startswith("cp/aps")]
    defined = [c for c in aps if c.key.endswith("/coverage")]
    return defined or [c for c in aps if c.key.endswith("/coverage_fallback")]


@functools.lru_cache(maxsize=4)
def _manifest(folder: str, key: tuple[int, int] | None) -> Mapping[str, Any]:
    return read_manifest(Path(folder))


def manifest_of(results_dir: Path | str) -> Mapping[str, Any]:
    """:func:`harness.contract.read_manifest` of ``results_dir``, parsed once per process while
    the file's size and mtime stay the same (a 10,000-cell manifest is ~18 MB of JSON, and a
    report asks for it twice: the expected cells and the published values' suite). Callers only
    read it. Raises as ``read_manifest`` does (``FileNotFoundError``, ``DamagedFile``)."""
    folder = Path(results_dir)
    key = file_key(folder / SUITE_FILE)
    if key is None:
        return read_manifest(folder)  # raises FileNotFoundError with its message
    return _manifest(str(folder.resolve()), key)


def expected_of(results_dir: Path | str) -> list[dict] | None:
    """The cells the results folder's manifest expects, as ``{"cell_id", "label"}`` (the label:
    the manifest's, else the configuration described); None when it has no manifest."""
    try:
        manifest = manifest_of(results_dir)
    except FileNotFoundError:
        return None
    return [
        {"cell_id": c["cell_id"], "label": c["label"] or describe_config(c["config"])}
        for c in expected_cells(manifest)
    ]


def _table(results: Results) -> str:
    table = format_table(results.summary) if len(results.summary) else "no done cells"
    if results.problems:
        kinds = pd.Series([p.status for p in results.problems]).value_counts()
        table += "\n" + ", ".join(f"{n} {k}" for k, n in kinds.items()) + " (see harness report)"
    return table


def format_results(results_dir: Path | str, *, index: bool = False) -> str:
    """:func:`format_table` of a results folder, with failed/invalid/missing cells counted
    (missing: expected by the folder's manifest and without a record); ``index``: through the
    record index (:mod:`reports.records.index`), reading only the records that changed."""
    return _table(load_results(results_dir, expected=expected_of(results_dir), index=index))


def print_summary(results_dir: Path) -> int:
    """Print the terminal leaderboard, the failed cells and the expected cells that have no
    record; exit status 1 if any cell failed (what ``harness run`` ends with).

    Through the record index: after a run that added 10 cells to 10,000 it reads those 10
    records (and leaves the index warm for ``harness report``)."""
    results = load_results(results_dir, expected=expected_of(results_dir), index=True)
    print(_table(results))
    cells = results.cells
    failed = cells[cells["status"] == "failed"] if len(cells) else cells
    for cid, method, seed, kind, message in zip(
        failed.get("cell_id", []), failed.get("method", []), failed.get("seed", []),
        failed.get("error_type", []), failed.get("error_message", []), strict=True,
    ):  # fmt: skip
        print(f"FAILED {cid} {method} seed {seed}: {kind}: {message}")
    print(f"results: {results_dir}  (harness report {results_dir} → leaderboard.html)")
    return 1 if len(failed) else 0
