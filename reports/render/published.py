"""Published vs measured: a paper's numbers next to ours, with the difference.

A published-values file is a CSV with the header ``dataset,backbone,method,M,hparams,metric,value,
source``: ``hparams`` is ``k=v;k=v`` (empty: the method's defaults), ``metric`` a leaderboard
column (``acc``, ``nll``, ``ece``, ``cAcc``, ...) and ``value`` in the record's units (fractions for
accuracies and ECE, as ``metrics.clean.acc``). ``harness report --published FILE`` reads one;
without it the report looks for ``<suite-stem>.published.csv`` next to the suite file that the
results folder's ``suite.json`` names (``harness run`` writes it).

A published row matches every configuration with the same dataset, backbone, method and M whose
hyper-parameters equal the row's (numbers compared as numbers, ``0.001`` = ``1e-3``); a row with
empty ``hparams`` matches the configurations shown without hyper-parameters. Rows that match
nothing are kept, with an empty measured value, so a missing run is visible.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pandas as pd

from reports.columns import (
    CORRUPTION,
    COST,
    Column,
    format_number,
    iter_rows,
    m_text,
    quality_columns,
)
from reports.records.results import Results
from reports.render.page import ReportOptions, cell_text, interval_words
from reports.render.paired import format_delta

HEADER = ("dataset", "backbone", "method", "M", "hparams", "metric", "value", "source")
COLUMNS = (
    "dataset",
    "backbone",
    "method",
    "M",
    "hparams",
    "variant",
    "metric",
    "published",
    "measured_mean",
    "measured_spread",
    "measured_n",
    "difference",
    "source",
)


def read_published(path: Path | str) -> pd.DataFrame:
    """The rows of a published-values CSV, checked: one-line errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"published values file {path} does not exist")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != HEADER:
            raise ValueError(f"{path}: header must be {','.join(HEADER)}, got {reader.fieldnames}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                m, value = int(row["M"]), float(row["value"])
            except ValueError as e:
                raise ValueError(
                    f"{path}:{line}: M must be an integer, value a number ({e})"
                ) from e
            rows.append(
                {**row, "M": m, "value": value, "hp": parse_hparams(row["hparams"], path, line)}
            )
    return pd.DataFrame(rows, columns=[*HEADER, "hp"])


def parse_hparams(text: str, path: Path | None = None, line: int = 0) -> dict[str, str]:
    """``"lam=0.1;tau=0.5"`` → ``{"lam": "0.1", "tau": "0.5"}``; empty text → ``{}``."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            where = f"{path}:{line}: " if path else ""
            raise ValueError(f"{where}hparams must be k=v;k=v, got {text!r}")
        out[key.strip()] = value.strip()
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _matches(row: pd.Series, pub: pd.Series) -> bool:
    if (str(row["dataset"]), str(row["backbone"]), str(row["method"])) != (
        pub["dataset"],
        pub["backbone"],
        pub["method"],
    ):
        return False
    if pd.isna(row["M"]) or int(row["M"]) != pub["M"]:
        return False
    if not pub["hp"]:
        return str(row["hparams"]) == ""
    return all(f"hp_{k}" in row and _same(row[f"hp_{k}"], v) for k, v in pub["hp"].items())


def compare(results: Results, published: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    """One row per published value × matching configuration (see the module docstring).

    ``measured_spread`` is the std or the 95% CI half-width (``options.interval``);
    ``difference`` = measured mean − published.
    """
    summary = results.summary
    rows = []
    summary_rows = [r for _, r in iter_rows(summary)]
    for _, pub in published.iterrows():
        metric = pub["metric"]
        hits = [r for r in summary_rows if _matches(r, pub)]
        for r in hits or [None]:
            mean = r.get(f"{metric}_mean", math.nan) if r is not None else math.nan
            rows.append(
                {
                    "dataset": pub["dataset"],
                    "backbone": pub["backbone"],
                    "method": pub["method"],
                    "M": pub["M"],
                    "hparams": pub["hparams"],
                    "variant": str(r["variant"]) if r is not None else "",
                    "metric": metric,
                    "published": pub["value"],
                    "measured_mean": mean,
                    "measured_spread": r.get(f"{metric}_{options.interval}", math.nan)
                    if r is not None
                    else math.nan,
                    "measured_n": r.get(f"{metric}_n", 0) if r is not None else 0,
                    "difference": mean - pub["value"],
                    "source": pub["source"],
                }
            )
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out.attrs["interval"] = options.interval
    return out


def find_published(results_dir: Path | str) -> Path | None:
    """``<suite-stem>.published.csv`` beside the suite named in ``suite.json``, if it exists."""
    from reports.render.terminal import manifest_of

    try:
        source = manifest_of(results_dir).get("source")
    except (OSError, ValueError, AttributeError):  # absent or damaged (DamagedFile: ValueError)
        return None
    if not source:
        return None
    suite = Path(str(source))
    candidate = suite.with_name(f"{suite.stem}.published.csv")
    return candidate if candidate.is_file() else None


def _kind(metric: str) -> Column:
    known = {c.key: c for c in (*quality_columns(), *COST, *CORRUPTION)}
    return known.get(metric, Column(metric, metric, "", "f3"))


def published_context(compared: pd.DataFrame | None) -> dict[str, Any] | None:
    """Rows for the page's ``table#published-table`` (None: no published values)."""
    if compared is None or not len(compared):
        return None
    rows = []
    for _, r in compared.iterrows():
        col = _kind(r["metric"])
        unit = " pp" if col.kind == "pct" else ""
        measured = cell_text(r["measured_mean"], r["measured_spread"], None, col.kind)
        rows.append(
            {
                "ident": [r["dataset"], r["backbone"], r["method"], m_text(r["M"]), r["hparams"]],
                "metric": r["metric"],
                "label": col.label,
                "published": format_number(r["published"], col.kind),
                "measured": measured,
                "n": int(r["measured_n"]) if r["measured_n"] else "",
                "difference": format_delta(r["difference"], col.kind) + unit
                if not pd.isna(r["difference"])
                else "–",
                "value": "" if pd.isna(r["difference"]) else repr(float(r["difference"])),
                "source": r["source"],
            }
        )
    return {"rows": rows, "interval": interval_words(compared.attrs.get("interval", "std"))}
