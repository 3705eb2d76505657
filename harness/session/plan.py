"""A dry run's plan: each cell ``run`` or ``skip``, and why (pending, failed and retried, done,
redone with ``force``, leased by another live process, not selected by ``--only``). Reads the
records and leases; writes nothing, checks no data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.session.result import PlannedCell


def _verdict(
    cell: Any, chosen: set, leases: dict, results: Path | None, force: bool
) -> tuple[str, str, str]:
    """(``run`` or ``skip``, the kind of reason the summary counts, why) for one cell."""
    from harness.contract import DamagedRecord, read_record
    from harness.storage.lease import describe

    if cell.cell_id not in chosen:
        return "skip", "not selected by --only", "not selected by --only"
    if cell.cell_id in leases:
        return (
            "skip",
            "leased by another live process",
            f"leased by {describe(leases[cell.cell_id])}",
        )
    try:
        rec = read_record(results / cell.cell_id) if results is not None else None
    except DamagedRecord as exc:
        why = f"damaged record.json, set aside and redone: {exc.reason}"
        return "run", "damaged record.json, set aside and redone", why
    status = (rec or {}).get("status")
    if status == "done":
        return ("run", *["done, redone (--force)"] * 2) if force else ("skip", "done", "done")
    if status == "failed":
        err = (rec or {}).get("error") or {}
        where = f" in {err['phase']}" if err.get("phase") else ""
        return "run", "failed, retried", f"failed{where} ({err.get('type', '?')}), retried"
    return "run", "pending", "pending"


def plan_cells(all_cells: list, selected: list, results: Path, force: bool) -> list[PlannedCell]:
    """Every cell of ``all_cells`` with its verdict: ``selected`` are those ``--only`` keeps;
    ``results`` the suite's results folder (absent: every selected cell is pending)."""
    from harness.storage.lease import live_leases

    chosen = {c.cell_id for c in selected}
    results = Path(results)
    leases = live_leases(results) if results.is_dir() else {}
    where = results if results.is_dir() else None
    return [
        PlannedCell(c, *_verdict(c, chosen, leases, where, force))  # type: ignore[arg-type]
        for c in all_cells
    ]
