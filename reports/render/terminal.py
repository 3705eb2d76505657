"""A compact fixed-width leaderboard for the terminal, and the summary ``harness run`` ends with.

Reporter side: reads records and the manifest through the contract layer only, so executors and
the CLI call it without the reporter ever importing them.
"""

from __future__ import annotations

import functools
import os
import re
import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    limit_text,
    limits_note,
    m_text,
    without_ensemble_only,
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
LIMITED = "[limited]"  # after the method of a row scored on a subset (evaluation.limit)
MAX_TEXT = 28
#: The widest the table is by default, in characters; ``$COLUMNS`` above it widens it
#: (:func:`table_width`).
WIDTH = 160
#: The metric columns a table too wide keeps longest, first to last: the last goes first
#: (``"ood"``: the MSP AUROC column, ``"aps"``: APS's coverage; any other column before these).
PRIORITY = (
    "acc", "nll", "ece", "disagreement", "k_eff", "ts/nll", "ts/ece", "ood", "cAcc", "cECE",
    "aps", "params", "eval_ips",
)  # fmt: skip
MIN_HPARAMS = 12  # the narrowest the hparams column is clipped to when nothing else is left
_SETTING = re.compile(r", (?=[^,=\s]+=)")  # between two ``key=value`` of a hparams text


def _clip(text: str, width: int = MAX_TEXT) -> str:
    text = " ".join(str(text).split())  # no newlines or tabs from a config value
    text = "".join(ch if ch.isprintable() else "?" for ch in text)  # nor escape sequences
    return text if len(text) <= width else text[: width - 1] + "…"


def table_width() -> int:
    """How wide :func:`format_table` makes the table: :data:`WIDTH`, or ``$COLUMNS`` where that
    is a whole number above it (``COLUMNS=400 harness run …`` shows every column; a narrower
    or unreadable value leaves the default, as the table never needs less)."""
    text = os.environ.get("COLUMNS", "").strip()
    return max(WIDTH, int(text)) if text.isdecimal() else WIDTH


def differing_hparams(methods: Sequence[str], hparams: Sequence[str]) -> tuple[list[str], bool]:
    """Per row, only the hyper-parameters whose value differs between the rows of its method
    (``tau=0.2`` vs ``tau=2`` when every other setting is the same; nothing for a method with
    one configuration), and whether any setting was left out. A setting one row lacks differs."""
    parsed = [dict(p.partition("=")[::2] for p in _SETTING.split(str(h))) if h else {}
              for h in hparams]  # fmt: skip
    rows: dict[str, list[int]] = defaultdict(list)
    for i, m in enumerate(methods):
        rows[str(m)].append(i)
    out, narrowed = [""] * len(parsed), False
    for idx in rows.values():
        keys = {k for i in idx for k in parsed[i]}
        differ = {k for k in keys if len({parsed[i].get(k) for i in idx}) > 1}
        for i in idx:
            shown = [f"{k}={v}" for k, v in parsed[i].items() if k in differ]
            out[i] = ", ".join(shown)
            narrowed |= len(shown) < len(parsed[i])
    return out, narrowed


@dataclass
class _Column:
    """One column of the terminal table: its header, its cells' texts, right-aligned or not."""

    header: str
    cells: list[str]
    numeric: bool
    key: str = ""
    rank: int | None = None  # a metric column's in PRIORITY: the highest goes first

    @property
    def width(self) -> int:
        return max(len(self.header), *(len(c) for c in self.cells))


def _width(columns: Sequence[_Column]) -> int:
    return sum(c.width for c in columns) + 2 * (len(columns) - 1)


def _rank(key: str) -> int:
    name = "ood" if key.endswith("/msp/auroc") else "aps" if key.startswith("cp/aps") else key
    return PRIORITY.index(name) if name in PRIORITY else len(PRIORITY)


def _header(c: Column) -> str:
    """A metric column's header: its label with ``%`` kept short; the OOD column is
    ``MSP-AUROC <set or group>``."""
    label = c.label.replace(" (%)", "%")
    if c.key.endswith("/msp/auroc"):
        label = _clip("MSP-" + label.replace(" (MSP)", ""), 24)
    return label


def _fit(columns: list[_Column], limit: int) -> tuple[list[_Column], list[str], list[str]]:
    """``columns`` narrowed to ``limit`` characters: (what is left, the identity columns with one
    value, as ``name value``, for the footer, the headers of the metric columns left out). In
    this order, each step only while the table is too wide: the constant identity columns
    (dataset, backbone, variant) move to the footer; metric columns go, the last of
    :data:`PRIORITY` first (one is always kept); the hparams column is clipped, down to
    :data:`MIN_HPARAMS`."""
    above, dropped = [], []
    if _width(columns) > limit:
        for c in [c for c in columns if c.key in ("dataset", "backbone", "variant")]:
            if len(set(c.cells)) == 1:
                above.append(f"{c.header} {c.cells[0]}")
                columns = [x for x in columns if x is not c]
    metrics = sorted((c for c in columns if c.rank is not None),
                     key=lambda c: (c.rank, columns.index(c)))  # fmt: skip
    while _width(columns) > limit and len(metrics) > 1:
        gone = metrics.pop()
        dropped.append(gone.header)
        columns = [x for x in columns if x is not gone]
    hp = next((c for c in columns if c.key == "hparams"), None)
    while hp is not None and _width(columns) > limit and hp.width > MIN_HPARAMS:
        cut = max(MIN_HPARAMS, hp.width - (_width(columns) - limit))
        hp.cells = [_clip(t, cut) for t in hp.cells]
        hp.header = _clip(hp.header, cut)
    return columns, above, dropped


def format_table(
    df: pd.DataFrame, columns: tuple[str, ...] = TERMINAL_COLUMNS, *, width: int | None = None
) -> str:
    """A fixed-width table of mean±std per configuration, at most ``width`` characters wide
    (default :func:`table_width`: 160) where that can be done.

    ``df`` is either the per-cell frame (:func:`reports.records.results.records_to_frame`,
    aggregated here) or the summary of :func:`reports.stats.summary.aggregate`. Columns without
    data are left out; the first OOD set's MSP AUROC is added when present, and APS's coverage
    at every α (:func:`conformal_coverage`). A single model's scores only an ensemble has (its
    disagreement, MI) are "–" (:func:`reports.columns.without_ensemble_only`). hparams shows
    only the settings that differ between a method's rows (:func:`differing_hparams`). Too wide,
    the table is narrowed as :func:`_fit` says, and the footer names what it left out. A
    collapsed ensemble's method is marked :data:`COLLAPSED` (:func:`reports.columns.collapsed`)
    and the footer says what that means. Failed cells are counted in the footer.
    """
    per_cell = "seed" in df.columns and "n" not in df.columns
    summary = aggregate(df) if per_cell else df
    n_failed = int((df["status"] == "failed").sum()) if per_cell and len(df) else 0
    if not len(summary):
        return "no done cells" + (f"; {n_failed} failed" if n_failed else "")
    flags = collapsed(summary.get("disagreement_mean", pd.Series(float("nan"), summary.index)),
                      summary["M"])  # fmt: skip
    summary = without_ensemble_only(summary)
    available = {c.key: c for c in leaderboard_columns(summary)}
    cols: list[Column] = [available[k] for k in columns if k in available]
    cols += [c for k, c in available.items() if k.endswith("/msp/auroc")][:1]
    cols += conformal_coverage(available)
    ident = ["dataset", "backbone", "method", "M", "hparams", "n"]
    if summary["variant"].astype(bool).any():
        ident.insert(5, "variant")
    hparams, narrowed = differing_hparams(list(summary["method"]), list(summary["hparams"]))
    methods = [f"{m} {COLLAPSED}" if flag else m for m, flag in zip(summary["method"], flags)]
    if "limit" in summary:  # a row scored on a subset of the test set, marked
        methods = [m if limit_text(v) == "" else f"{m} {LIMITED}"
                   for m, v in zip(methods, summary["limit"])]  # fmt: skip
    texts = {
        "M": [m_text(m) for m in summary["M"]],
        "n": [str(int(n)) for n in summary["n"]],
        "method": [_clip(m) for m in methods],
        "hparams": [_clip(h) for h in hparams],
    }
    table = [_Column(k, texts.get(k) or [_clip(v) for v in summary[k]], k in ("M", "n"), k)
             for k in ident]  # fmt: skip
    for c in cols:
        means, spreads = summary[f"{c.key}_mean"], summary[f"{c.key}_std"]
        cells = [cell_text(m, s, None, c.kind).replace(" ± ", "±") for m, s in zip(means, spreads)]
        table.append(_Column(_header(c), cells, True, c.key, _rank(c.key)))
    limit = width or table_width()
    table, above, dropped = _fit(table, limit)
    widths = [c.width for c in table]

    def line(cells: Sequence[str]) -> str:
        out = [t.rjust(w) if c.numeric else t.ljust(w) for t, w, c in zip(cells, widths, table)]
        return "  ".join(out).rstrip()

    lines = [line([c.header for c in table]), "  ".join("-" * w for w in widths)]
    lines += [line(row) for row in zip(*(c.cells for c in table))]
    footer = f"every row: {', '.join(above)}; " if above else ""
    footer += "mean±std over seeds; % columns are ×100"
    if flags.any():
        footer += (f"; {COLLAPSED}: members disagree on < {100 * COLLAPSE_DISAGREEMENT:g}% of "
                   "test images, one model")  # fmt: skip
    if narrowed:
        footer += "; hparams: only what differs within a method"
    if dropped:
        footer += (f"; left out to fit {limit} characters: {', '.join(dropped)} (COLUMNS=<more> "
                   "widens the table; harness report writes every column)")  # fmt: skip
    if note := limits_note(summary):
        footer += f"; {LIMITED}: {note}"
    if n_failed:
        footer += f"; {n_failed} failed cell{'s' if n_failed != 1 else ''} not shown"
    wrap = textwrap.wrap(footer, limit, break_long_words=False, break_on_hyphens=False)
    return "\n".join([*lines, *wrap])


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
