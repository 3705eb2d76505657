"""``harness upgrade RESULTS``: add to finished records what this harness records and an older
one did not, without re-running anything.

Two things, each only where a record lacks it:

- the diagnostic declarations of each record's method (``diagnostics.declared``, written by the
  engine since methods declare their diagnostics). A record without them is reported with a
  generic fallback (every numeric key of its last epoch, under its own name, no figure); after
  ``harness upgrade`` it is reported as a new one is: the method's labels, first/last epoch and
  figures (σN-Ens's k_eff against τ);
- the near/far groups of its OOD sets (``evaluation.ood_groups``, written by the engine since
  datasets declare them when they register): the reporter's near- and far-OOD means read them.

Nothing measured changes: metrics, history and the per-epoch values stay as they are; each
rewritten record is validated and replaced atomically. The reporter cannot do this itself: it
never imports the registries (the methods import torch), so the CLI does it once, here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.config.includes import SuiteError


def missing_declarations(rec: dict[str, Any]) -> bool:
    """True when a record's ``diagnostics`` section has no ``declared`` list (a record of a model
    evaluated from outside the harness has no method to declare them)."""
    section = rec.get("diagnostics")
    if isinstance(section, dict) and section.get("external"):
        return False
    return not (isinstance(section, dict) and isinstance(section.get("declared"), list))


def missing_ood_groups(rec: dict[str, Any]) -> dict[str, str]:
    """The near/far groups the record's dataset declares for the OOD sets it evaluated, when its
    ``evaluation`` holds none; ``{}`` when it has them or there are none to add.

    Raises:
        UnknownNameError: the record's dataset is not registered.
    """
    from harness.registry import DATASETS

    evaluation = rec.get("evaluation") if isinstance(rec.get("evaluation"), dict) else {}
    ood = (rec.get("metrics") or {}).get("ood") or {}
    if "ood_groups" in evaluation or not ood:
        return {}
    declared = DATASETS.get(str((rec.get("config") or {}).get("dataset", ""))).ood_groups
    return {s: declared[s] for s in ood if s in declared}


def upgraded(rec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``rec`` with what it lacks added, and what was added (``declarations``, ``OOD groups``).

    Raises:
        UnknownNameError: its method or dataset is not registered.
    """
    from harness.registry import METHODS

    out, added = dict(rec), []
    if missing_declarations(rec):
        method = str((rec.get("config") or {}).get("method", ""))
        declared = [d.to_json() for d in METHODS.get(method).diagnostics]
        section = rec.get("diagnostics") if isinstance(rec.get("diagnostics"), dict) else {}
        out["diagnostics"] = {**section, "declared": declared}
        added.append("declarations")
    if groups := missing_ood_groups(rec):
        out["evaluation"] = {**(rec.get("evaluation") or {}), "ood_groups": groups}
        added.append("OOD groups")
    return out, added


def cmd_upgrade(args) -> int:
    """Add what each record under ``args.results_dir`` lacks (:func:`upgraded`); print what was
    done. Returns 0, or 1 when a record was damaged or its method or dataset is not registered
    (those records are left untouched)."""
    from harness.contract.record import RECORD_FILE, DamagedRecord, read_record
    from harness.registry.core import UnknownNameError
    from harness.storage.records import write_record

    root = Path(args.results_dir)
    if not root.is_dir():
        raise SuiteError([f"{root}: no such results folder"])
    counts = {"declarations": 0, "OOD groups": 0}
    current = 0
    problems: list[str] = []
    for path in sorted(root.rglob(RECORD_FILE)):
        try:
            rec = read_record(path.parent)
        except DamagedRecord as exc:
            problems.append(str(exc))
            continue
        if rec is None:
            continue
        try:
            new, added = upgraded(rec)
        except UnknownNameError as exc:
            problems.append(f"{path}: {exc} (--plugin MODULE?)")
            continue
        if not added:
            current += 1
            continue
        if not args.dry_run:
            write_record(path.parent, new)
        for what in added:
            counts[what] += 1
    verb = "would add" if args.dry_run else "added"
    print(
        f"{root}: {verb} diagnostic declarations to {counts['declarations']} record(s) and "
        f"OOD groups to {counts['OOD groups']}; {current} already had what they need; "
        f"{len(problems)} left untouched"
    )
    for line in problems:
        print(f"  {line}")
    return 1 if problems else 0
