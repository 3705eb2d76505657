"""What a report shows, computed once (:class:`Results`), and the cells without a usable record
(:class:`Problem`: failed, invalid, missing, duplicate)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from reports.flatten import describe_config
from reports.summary import MCE_BASELINE, aggregate, relative_corruption_error


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
    for k, v in want.items():
        if k not in have:
            return False
        if isinstance(v, Mapping) and isinstance(have[k], Mapping):
            if not _config_matches(v, have[k]):
                return False
        elif v != have[k]:
            return False
    return True


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
