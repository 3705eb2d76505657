"""Records → one table of flattened rows → :class:`Results`: what a report shows, computed once.

``load_results(results_dir)`` reads every cell folder (through the record index,
:mod:`reports.records.index`, when asked), keeps what validates, and lists every cell without a
usable record (:class:`Problem`: failed, invalid, missing, duplicate) with its reason, so a folder
with failed or unfinished cells still reports. ``records_to_frame`` flattens records to one row per
cell; :func:`reports.stats.summary.aggregate` gives mean, std and n per configuration.

Everything a report needs from a record is put in its row once (:func:`record_row`): the
leaderboard columns (:func:`reports.records.flatten.flatten_record`) and, under names starting
with ``_``, what the report computes across records — the flattened config (``_cfg/<dotted
key>``, for the ``variant`` column: config fields that differ inside one group, so cells that are
not seeds of one configuration are never averaged), the environment (``_env/<key>``) and
conventions (``_conv/<key>``) for provenance, the problem line of a failed cell, the config as
JSON and the names of the hyper-parameters the cell set away from their defaults (``_shown``, for
:mod:`reports.records.tidy`). So :func:`results_from_rows` works the same on rows just flattened
and on rows kept in the index. The ``_`` columns never reach ``cells.csv``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np
import pandas as pd

from harness.contract.record import shown_of
from reports.columns import ID_COLUMNS, LIMIT_COLUMN
from reports.records.flatten import (
    _config_rest,
    _flatten,
    describe_config,
    flatten_record,
    with_posthoc_rows,
)
from reports.stats.summary import (
    MCE_BASELINE,
    aggregate,
    drop_duplicate_seeds,
    relative_corruption_error,
)


@dataclass
class Problem:
    """A cell without a usable record: failed, invalid, missing, or a duplicate (same
    configuration and seed as a newer record, which is the one counted), and why."""

    cell_id: str
    status: Literal["failed", "invalid", "missing", "duplicate"]
    reason: str
    config: str = ""
    detail: str = ""


@dataclass
class Results:
    """Everything a report shows, computed once."""

    cells: pd.DataFrame
    summary: pd.DataFrame
    problems: list[Problem]
    provenance: dict[str, list[str]]
    conventions: dict[str, list[str]]
    source: str = ""
    suites: list[str] = field(default_factory=list)
    mce_baseline: str | None = MCE_BASELINE  # the method the mCE column is relative to

    def with_mce_baseline(self, baseline: str | None) -> Results:
        """These results with the mCE recomputed against ``baseline`` (None: no mCE column)."""
        cells = relative_corruption_error(self.cells, baseline)
        return dataclasses.replace(
            self, cells=cells, summary=aggregate(cells), mce_baseline=baseline
        )

    @property
    def n_done(self) -> int:
        return int((self.cells["status"] == "done").sum()) if len(self.cells) else 0


def _config_matches(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    """Every key of ``want`` is in ``have`` with its value (mappings compared key by key)."""
    return all(
        k in have
        and (_config_matches(v, have[k]) if isinstance(v, Mapping) and isinstance(have[k], Mapping)
             else v == have[k])
        for k, v in want.items()
    )  # fmt: skip


def _expected_entry(item: Any) -> tuple[str | None, Mapping[str, Any] | None]:
    if isinstance(item, str):
        return item, None
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        cell_id, cfg = getattr(item, "cell_id", None), getattr(item, "config", None)
        if cell_id is None and cfg is None:
            cfg = dataclasses.asdict(item)
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            cfg = dataclasses.asdict(cfg)
        return cell_id, cfg
    if isinstance(item, Mapping):
        if "cell_id" in item or "config" in item:
            return item.get("cell_id"), item.get("config")
        return None, item
    cell_id, cfg = getattr(item, "cell_id", None), getattr(item, "config", None)
    if cell_id is None and not isinstance(cfg, Mapping):
        raise TypeError(
            f"expected cell {item!r}: give a cell id, a mapping with 'cell_id' or 'config', "
            "a config mapping, or an object with a cell_id attribute"
        )
    return cell_id, cfg


def missing_cells(
    expected: Iterable[Any], records: Iterable[Mapping[str, Any]], known: Iterable[str] = ()
) -> list[Problem]:
    """Expected cells (ids, configs or objects with ``cell_id``/``config``) with no record."""
    records = list(records)
    ids = {str(r.get("cell_id")) for r in records} | set(known)
    out = []
    for item in expected:
        cell_id, cfg = _expected_entry(item)
        label = item.get("label") if isinstance(item, Mapping) else None
        desc = label or (describe_config(cfg) if isinstance(cfg, Mapping) else "")
        if cell_id is not None:
            if str(cell_id) in ids:
                continue
        elif any(_config_matches(cfg, r.get("config") or {}) for r in records):
            continue
        ident = str(cell_id) if cell_id is not None else "(no id)"
        out.append(Problem(ident, "missing", "expected cell has no record (not run yet?)", desc))
    return out


CFG, ENV, CONV = "_cfg/", "_env/", "_conv/"
IDENTITY = ["dataset", "backbone", "method", "M", "hparams"]
_ENV_FIRST = ["git_commit", "python", "torch", "torch_uncertainty", "platform", "device", "cpu"]


def record_row(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened row of one validated record, with the ``_`` columns described above."""
    row = flatten_record(rec)
    cfg = rec.get("config") or {}
    for k, v in _flatten(_config_rest(cfg)).items():
        row[CFG + k] = v
    if limit := evaluation_limit(rec):  # a subset's cells are never seeds of a full-set one's
        row[LIMIT] = row[LIMIT_COLUMN] = limit
    for k, v in (rec.get("environment") or {}).items():
        row[ENV + str(k)] = None if v in (None, "") else str(v)
    for k, v in (rec.get("conventions") or {}).items():
        row[CONV + str(k)] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    err = rec.get("error") or {}
    row["_reason"] = f"{err.get('type', 'Error')}: {err.get('message', '')}".strip()
    row["_desc"] = describe_config(rec)
    row["_suite"] = str(rec.get("suite"))
    row["_config"] = json.dumps(cfg, sort_keys=True, default=str)
    # The names of the hyper-parameters the cell set away from their defaults: which ones the
    # tidy table gives a column of their own (reports.records.tidy).
    row["_shown"] = json.dumps(sorted(shown_of(rec)))
    return row


#: The flattened-config copy of ``evaluation.limit``: part of the variant.
LIMIT = CFG + "evaluation.limit"


def evaluation_limit(rec: Mapping[str, Any]) -> int | None:
    """The ``evaluation.limit`` a record was scored with (None: the whole test set)."""
    limit = (rec.get("evaluation") or {}).get("limit")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


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
        parts = [f"{k}=" + _variant_text(k, flat[CFG + k]) for k in variant]
        rows = rows.assign(variant=parts[0].str.cat(parts[1:], sep=", ").to_numpy())
    return rows


def _variant_text(key: str, values: pd.Series) -> pd.Series:
    """A variant key's values as text (a whole-set evaluation's absent limit reads ``full``)."""
    if CFG + key == LIMIT:
        return values.map(lambda v: "full" if v == "<absent>" else str(int(v)))
    return values.astype(str)


def _texts(column: pd.Series | None) -> list[str]:
    """The non-empty texts of ``column`` (None: none)."""
    if column is None:
        return []
    if column.dtype == "str":
        return column[column.notna() & (column != "")].to_numpy(dtype=object).tolist()
    return [s for s in column if isinstance(s, str) and s]


def _provenance(rows: pd.DataFrame) -> dict[str, list[str]]:
    """:func:`reports.records.results.provenance` from the rows' ``_env`` and time columns."""

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
    """Stand-ins for the records in :func:`reports.records.results.missing_cells` (id and
    config)."""
    configs = rows["_config"] if "_config" in rows else [None] * len(rows)
    return [
        {"cell_id": cid, "config": json.loads(cfg) if isinstance(cfg, str) else {}}
        for cid, cfg in zip(rows["cell_id"], configs, strict=True)
    ]


def results_from_rows(
    rows: pd.DataFrame,
    expected: Iterable[Any] | None = None,
    problems: Iterable[Problem] = (),
    source: str = "",
) -> Results:
    """:class:`reports.records.results.Results` from a :func:`rows_frame` table (records in
    order)."""
    problems = list(problems)
    rows = _with_variant(rows.reset_index(drop=True))
    cells = rows[[c for c in rows.columns if not c.startswith("_")]]
    cells, duplicates = drop_duplicate_seeds(cells)
    cells = with_posthoc_rows(cells)  # single+TS: a configuration of its own
    cells = relative_corruption_error(cells, MCE_BASELINE)
    for dropped, kept in duplicates:
        reason = f"same configuration and seed as the newer record {kept}, which is counted"
        problems.append(Problem(dropped, "duplicate", reason))
    if len(rows):
        failed = rows[rows["status"] == "failed"]
        for cid, reason, desc, tb in zip(
            failed["cell_id"], failed["_reason"], failed["_desc"], failed["error_traceback"],
            strict=True,
        ):  # fmt: skip
            problems.append(Problem(str(cid), "failed", reason, desc, str(tb)))
    if expected is not None:
        expected = list(expected)
        ids_only = all(_expected_entry(e)[0] is not None for e in expected)
        records = (
            [{"cell_id": c} for c in rows.get("cell_id", [])]
            if ids_only
            else _expected_configs(rows)
        )
        problems += missing_cells(expected, records, known=[p.cell_id for p in problems])
    suites = sorted(set(rows["_suite"])) if "_suite" in rows else []
    return Results(
        cells=cells,
        summary=aggregate(cells),
        problems=problems,
        provenance=_provenance(rows),
        conventions=_conventions(rows),
        source=source,
        suites=suites,
    )


def records_to_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per cell (done and failed), identity columns first."""
    rows = _with_variant(rows_frame([record_row(r) for r in records]))
    return rows[[c for c in rows.columns if not c.startswith("_")]]


def from_records(
    records: Iterable[Mapping[str, Any]],
    expected: Iterable[Any] | None = None,
    problems: Iterable[Problem] = (),
    source: str = "",
) -> Results:
    """:class:`Results` from records already read (each must validate); the same path as a
    results folder's rows (:func:`reports.records.results.results_from_rows`)."""
    rows = rows_frame([record_row(r) for r in records])
    return results_from_rows(rows, expected=expected, problems=problems, source=source)
