"""Records → one table of flattened rows → :class:`reports.results.Results`, without the records.

Everything a report needs from a record is put in its row once (:func:`record_row`): the
leaderboard columns (:func:`reports.flatten.flatten_record`) and, under names starting with
``_``, what the report computes across records — the flattened config (``_cfg/<dotted key>``,
for the ``variant`` column), the environment (``_env/<key>``) and conventions (``_conv/<key>``)
for provenance, the problem line of a failed cell, and the config as JSON (read only when an
expected cell is given by config rather than id). So :func:`results_from_rows` works the same on
rows just flattened and on rows kept in the record index (:mod:`reports.record_index`), and a
warm report does no per-record JSON work. The ``_`` columns never reach ``cells.csv``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd

from reports import flatten as agg
from reports import results as res
from reports import summary as summ
from reports.calibrated import with_posthoc_rows
from reports.columns import ID_COLUMNS
from reports.provenance import provenance

CFG, ENV, CONV = "_cfg/", "_env/", "_conv/"
IDENTITY = ["dataset", "backbone", "method", "M", "hparams"]
_ENV_FIRST = ["git_commit", "python", "torch", "torch_uncertainty", "platform", "device", "cpu"]


def record_row(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened row of one validated record, with the ``_`` columns described above."""
    row = agg.flatten_record(rec)
    cfg = rec.get("config") or {}
    for k, v in agg._flatten(agg._config_rest(cfg)).items():
        row[CFG + k] = v
    for k, v in (rec.get("environment") or {}).items():
        row[ENV + str(k)] = None if v in (None, "") else str(v)
    for k, v in (rec.get("conventions") or {}).items():
        row[CONV + str(k)] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    err = rec.get("error") or {}
    row["_reason"] = f"{err.get('type', 'Error')}: {err.get('message', '')}".strip()
    row["_desc"] = agg.describe_config(rec)
    row["_suite"] = str(rec.get("suite"))
    row["_config"] = json.dumps(cfg, sort_keys=True, default=str)
    return row


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The table of :func:`record_row` rows (an empty one with the identity columns)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=[*ID_COLUMNS, "acc", "nll", "ece"])
    return frame


def _flat_config(rows: pd.DataFrame) -> pd.DataFrame:
    cfg_cols = [c for c in rows.columns if c.startswith(CFG)]
    return rows[cfg_cols].astype(object).where(rows[cfg_cols].notna(), "<absent>")


def variant_of(rows: pd.DataFrame) -> list[str]:
    """Dotted config keys (besides the identity and seed) that differ inside one identity group
    (a key a record lacks counts as the value ``<absent>``)."""
    flat = _flat_config(rows)
    if flat.columns.empty or rows.empty:
        return []
    keys = rows[IDENTITY].astype(object).where(rows[IDENTITY].notna(), "<nan>").astype(str)
    counts = flat.groupby([keys[k] for k in IDENTITY], sort=False).nunique()
    return sorted(c[len(CFG) :] for c in flat.columns if (counts[c] > 1).any())


def _with_variant(rows: pd.DataFrame) -> pd.DataFrame:
    """Fill ``variant``: the config keys that differ inside one identity group, as text."""
    variant = variant_of(rows)
    if variant:
        flat = _flat_config(rows)
        parts = [f"{k}=" + flat[CFG + k].astype(str) for k in variant]
        text = parts[0]
        for p in parts[1:]:
            text = text + ", " + p
        rows = rows.assign(variant=text.to_numpy())
    return rows


def _texts(column: pd.Series | None) -> list[str]:
    """The non-empty texts of ``column`` (None: none)."""
    if column is None:
        return []
    if column.dtype == "str":
        return column[column.notna() & (column != "")].to_numpy(dtype=object).tolist()
    return [s for s in column if isinstance(s, str) and s]


def _provenance(rows: pd.DataFrame) -> dict[str, list[str]]:
    """:func:`reports.provenance.provenance` from the rows' ``_env`` and time columns."""

    def counted(values: pd.Series) -> list[str]:
        """Each distinct text, most frequent first (ties: first seen), with its count when
        there are several."""
        if values.dtype == "str":  # the usual case, at C speed (10,000 rows × 15 columns)
            values = values[values.notna() & (values != "")]
            codes, uniques = pd.factorize(values)
            n = np.bincount(codes, minlength=len(uniques))
            pairs = [(uniques[i], int(n[i])) for i in np.argsort(-n, kind="stable")]
        else:
            found = Counter(str(v) for v in values if v is not None and v == v and v != "")
            pairs = found.most_common()  # (a stable sort: ties in the order first seen)
        return [f"{v} ({k} cells)" if len(pairs) > 1 else v for v, k in pairs]

    env = [c[len(ENV) :] for c in rows.columns if c.startswith(ENV)]
    keys = [*_ENV_FIRST, *sorted(set(env) - {*_ENV_FIRST, "hostname"}), "hostname"]
    out = {"suite": counted(rows["_suite"]) if "_suite" in rows else []}
    for k in keys:
        out[k] = counted(rows[ENV + k]) if ENV + k in rows else []
    started, finished = _texts(rows.get("started_at")), _texts(rows.get("finished_at"))
    if started and finished:
        out["runs"] = [f"{min(started)} → {max(finished)}"]
    out["report generated"] = [datetime.now(timezone.utc).isoformat(timespec="seconds")]
    return {k: v for k, v in out.items() if v}


def _conventions(rows: pd.DataFrame) -> dict[str, list[str]]:
    cols = [c for c in rows.columns if c.startswith(CONV)]
    return {c[len(CONV) :]: [v for v in pd.unique(rows[c].dropna())] for c in cols}


def _expected_configs(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Stand-ins for the records in :func:`reports.results.missing_cells` (id and config)."""
    configs = rows["_config"] if "_config" in rows else [None] * len(rows)
    return [
        {"cell_id": cid, "config": json.loads(cfg) if isinstance(cfg, str) else {}}
        for cid, cfg in zip(rows["cell_id"], configs, strict=True)
    ]


def results_from_rows(
    rows: pd.DataFrame,
    expected: Iterable[Any] | None = None,
    problems: Iterable[res.Problem] = (),
    source: str = "",
) -> res.Results:
    """:class:`reports.results.Results` from a :func:`rows_frame` table (records in order)."""
    problems = list(problems)
    rows = _with_variant(rows.reset_index(drop=True))
    cells = rows[[c for c in rows.columns if not c.startswith("_")]]
    cells, duplicates = summ.drop_duplicate_seeds(cells)
    cells = with_posthoc_rows(cells)  # single+TS: a configuration of its own
    cells = summ.relative_corruption_error(cells, summ.MCE_BASELINE)
    for dropped, kept in duplicates:
        reason = f"same configuration and seed as the newer record {kept}, which is counted"
        problems.append(res.Problem(dropped, "duplicate", reason))
    if len(rows):
        failed = rows[rows["status"] == "failed"]
        for cid, reason, desc, tb in zip(
            failed["cell_id"], failed["_reason"], failed["_desc"], failed["error_traceback"],
            strict=True,
        ):  # fmt: skip
            problems.append(res.Problem(str(cid), "failed", reason, desc, str(tb)))
    if expected is not None:
        expected = list(expected)
        ids_only = all(res._expected_entry(e)[0] is not None for e in expected)
        records = (
            [{"cell_id": c} for c in rows.get("cell_id", [])]
            if ids_only
            else _expected_configs(rows)
        )
        problems += res.missing_cells(expected, records, known=[p.cell_id for p in problems])
    suites = sorted(set(rows["_suite"])) if "_suite" in rows else []
    return res.Results(
        cells=cells,
        summary=summ.aggregate(cells),
        problems=problems,
        provenance=_provenance(rows) if len(rows) else provenance([]),
        conventions=_conventions(rows),
        source=source,
        suites=suites,
    )
