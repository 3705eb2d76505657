"""``harness upgrade RESULTS``: add to finished records what this harness records and an older
one did not, without re-running anything.

Today that is one thing: the diagnostic declarations of each record's method
(``diagnostics.declared``, written by the engine since methods declare their diagnostics). A
record without them is reported with a generic fallback (every numeric key of its last epoch,
under its own name, no figure); after ``harness upgrade`` it is reported as a new one is: the
method's labels, first/last epoch and figures (σN-Ens's k_eff against τ). Nothing measured
changes: metrics, history and the per-epoch values stay as they are; each rewritten record is
validated and replaced atomically. The reporter cannot do this itself: it never imports the
method registry (the methods import torch), so the CLI does it once, here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.config.includes import SuiteError


def missing_declarations(rec: dict[str, Any]) -> bool:
    """True when a record's ``diagnostics`` section has no ``declared`` list."""
    section = rec.get("diagnostics")
    return not (isinstance(section, dict) and isinstance(section.get("declared"), list))


def cmd_upgrade(args) -> int:
    """Add the registered methods' diagnostic declarations to every record under
    ``args.results_dir`` that has none; print what was done. Returns 0, or 1 when a record was
    damaged or its method is not registered (those records are left untouched)."""
    from harness.contract.record import RECORD_FILE, DamagedRecord, read_record
    from harness.registry import METHODS
    from harness.registry.core import UnknownNameError
    from harness.storage.records import write_record

    root = Path(args.results_dir)
    if not root.is_dir():
        raise SuiteError([f"{root}: no such results folder"])
    upgraded = current = 0
    problems: list[str] = []
    for path in sorted(root.rglob(RECORD_FILE)):
        try:
            rec = read_record(path.parent)
        except DamagedRecord as exc:
            problems.append(str(exc))
            continue
        if rec is None or not missing_declarations(rec):
            current += rec is not None
            continue
        method = str((rec.get("config") or {}).get("method", ""))
        try:
            declared = [d.to_json() for d in METHODS.get(method).diagnostics]
        except UnknownNameError:
            problems.append(f"{path}: method {method!r} is not registered (--plugin MODULE?)")
            continue
        section = rec.get("diagnostics") if isinstance(rec.get("diagnostics"), dict) else {}
        rec["diagnostics"] = {**section, "declared": declared}
        if not args.dry_run:
            write_record(path.parent, rec)
        upgraded += 1
    verb = "would add" if args.dry_run else "added"
    print(
        f"{root}: {verb} diagnostic declarations to {upgraded} record(s); "
        f"{current} already had them; {len(problems)} left untouched"
    )
    for line in problems:
        print(f"  {line}")
    return 1 if problems else 0
