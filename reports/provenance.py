"""Provenance and metric conventions of a set of records, for the report's last sections."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any


def provenance(records: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Where and with what the results were produced: suite, environment, run span, per value."""

    def counted(values: Iterable[Any]) -> list[str]:
        counts = Counter(str(v) for v in values if v not in (None, ""))
        return [f"{v} ({n} cells)" if len(counts) > 1 else v for v, n in counts.most_common()]

    envs = [r.get("environment") or {} for r in records]
    keys = ["git_commit", "python", "torch", "torch_uncertainty", "platform", "device", "cpu"]
    keys += [*sorted({k for e in envs for k in e} - {*keys, "hostname"}), "hostname"]
    out = {"suite": counted(r.get("suite") for r in records)}
    out.update({k: counted(e.get(k) for e in envs) for k in keys})
    started = [str(r["started_at"]) for r in records if r.get("started_at")]
    finished = [str(r["finished_at"]) for r in records if r.get("finished_at")]
    if started and finished:
        out["runs"] = [f"{min(started)} → {max(finished)}"]
    out["report generated"] = [datetime.now(timezone.utc).isoformat(timespec="seconds")]
    return {k: v for k, v in out.items() if v}


def conventions(records: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The metric conventions the records state, each distinct text once, by key."""
    out: dict[str, dict[str, None]] = {}
    for r in records:
        for k, v in (r.get("conventions") or {}).items():
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            out.setdefault(str(k), {})[text] = None
    return {k: list(v) for k, v in out.items()}
