"""Faults of the machine in a cell, in words: memory that ran out and a file system that filled.

A cell's failure is recorded with the exception's type and message (harness.engine.runner). For
these two the exception's own text helps nobody: a CUDA out-of-memory error lists allocator
statistics, a CPU one the bytes of one allocation, and a full disk under ``torch.save`` surfaces
as ``RuntimeError: [enforce fail at inline_container.cc:…] unexpected pos``. :func:`cell_error`
writes one line instead — the cell, its batch sizes, the peak memory measured and what to change
for memory; the path and the space left for a full disk (harness.storage.space) — which the
record keeps, ``harness status`` and the run's summary show, and the executors read
(``error.type`` ``OutOfSpace``: stop starting cells).

Also how the runner records a failure on a full disk (:func:`record_failure`,
:func:`write_record_if_room`, :func:`write_if_room`, :func:`lease_failure`: when a file does not
fit, the executor still gets the failure, in memory) and the record the local executor writes
for a cell that kept killing its worker (:func:`record_killed_cell`).
"""

from __future__ import annotations

import logging
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from harness.contract import Cell
from harness.storage.space import OUT_OF_SPACE, OutOfSpace, out_of_space, out_of_space_cause

log = logging.getLogger("harness")

#: Phrases of the allocators' out-of-memory errors that are not ``torch.OutOfMemoryError``
#: (CPU: c10's DefaultCPUAllocator; MPS and older CUDA paths raise a plain RuntimeError).
_OOM_PHRASES = ("out of memory", "can't allocate memory", "not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says an allocation failed (CUDA, CPU or Python)."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(p in text for p in _OOM_PHRASES)


def peak_memory(device: torch.device) -> str:
    """The peak the cell's process reached: allocated CUDA memory on a GPU (what the model and
    its activations took), else the process's peak resident memory."""
    if device.type == "cuda" and torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        return f"peak {peak:,.0f} MiB allocated of {total:,.0f} MiB on {device}"
    # ru_maxrss: KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mib = rss / 2**20 if sys.platform == "darwin" else rss / 2**10
    return f"peak {mib:,.0f} MiB resident in this process (CPU)"


def out_of_memory_message(cell: Cell, phase: str, device: torch.device) -> str:
    """One line: where memory ran out, the batch sizes, the peak measured, what to change
    (the knob of the phase first: ``batch_size`` in training, ``eval_batch_size`` after)."""
    r = cell.recipe
    knobs = ["recipe.batch_size", "recipe.eval_batch_size"]
    if phase == "evaluate":
        knobs.reverse()
    spread = (
        f"or spread it over more GPUs with recipe.processes (now {r.processes})"
        if device.type == "cuda"
        else "or run fewer cells at once (--workers)"
    )
    return (
        f"out of memory in {phase} of cell {cell.cell_id} ({cell.label}): batch_size "
        f"{r.batch_size}, eval_batch_size {r.eval_batch_size}, processes {r.processes}; "
        f"{peak_memory(device)}; lower {' or '.join(knobs)}, {spread}"
    )


def release_memory(device: torch.device) -> None:
    """Return the cached blocks of a failed cell to the device, so that the next cell in this
    process starts with the memory it would have in a fresh one (an out-of-memory error, unlike
    an illegal address, leaves the CUDA context usable)."""
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def full_disk_error(exc: BaseException, where: Path) -> OutOfSpace | None:
    """``exc`` as :class:`OutOfSpace` when a full disk or quota caused it: as raised by the
    storage writers (which name their file), else naming the file the OS error names, else
    ``where`` (the cell's folder); None for any other error."""
    if isinstance(exc, OutOfSpace):
        return exc
    cause = out_of_space_cause(exc)
    if cause is None:
        return None
    return out_of_space(cause.filename or where, cause)


def cell_error(
    exc: BaseException, cell: Cell, cell_dir: Path, phase: str, device: torch.device
) -> dict[str, Any]:
    """The ``error`` object of a failed cell's record: ``type``, ``message`` (one line for the
    faults above, the exception's text otherwise), ``traceback``, ``data_missing``, ``phase``."""
    from harness.data._machinery.base import DataMissingError

    kind, message = type(exc).__name__, str(exc)
    if full := full_disk_error(exc, cell_dir):
        kind, message = OUT_OF_SPACE, str(full)
    elif is_out_of_memory(exc):
        kind, message = "OutOfMemoryError", out_of_memory_message(cell, phase, device)
        release_memory(device)
    return {
        "type": kind,
        "message": message,
        "traceback": traceback.format_exc(limit=20)[-4000:],
        "data_missing": isinstance(exc, DataMissingError),
        "phase": phase,
    }


def record_failure(
    rec: dict[str, Any],
    exc: BaseException,
    cell: Cell,
    cell_dir: Path,
    phase: str,
    device: torch.device,
) -> None:
    """Mark ``rec`` failed with :func:`cell_error`, log it in one line and in ``events.jsonl``
    (unless the disk is too full for that line: the record says why)."""
    from harness.storage.checkpoint import log_event

    rec["status"] = "failed"
    rec["error"] = error = cell_error(exc, cell, cell_dir, phase, device)
    try:
        log_event(cell_dir, "failed", phase=phase, error=error["type"])
    except OutOfSpace as full:
        log.info("%s", full)
    log.warning("cell %s failed: %s: %s", cell.label, error["type"], error["message"])


def _unwritten(rec: dict[str, Any], exc: OutOfSpace, phase: str) -> dict[str, Any]:
    """``rec`` as the failure of a cell whose record could not be written (kept in memory for
    the executor, which stops the run on it; nothing on disk changes)."""
    error = {"type": OUT_OF_SPACE, "message": str(exc), "traceback": "", "data_missing": False,
             "phase": phase}  # fmt: skip
    return {**rec, "status": "failed", "metrics": {}, "error": error}


def write_record_if_room(
    cell: Cell, cell_dir: Path, rec: dict[str, Any], phase: str
) -> dict[str, Any]:
    """Write the cell's record and return it; when not even it fits, return its out-of-space
    failure instead. The cell is then left without a record, and a re-run resumes it: from
    ``final.pt`` when training was over, else from the last whole checkpoint."""
    from harness.storage.records import write_record

    try:
        write_record(cell_dir, rec)
        return rec
    except OutOfSpace as exc:
        log.warning("cell %s failed: %s: %s (no record written)", cell.label, OUT_OF_SPACE, exc)
        return _unwritten(rec, exc, "evaluate" if rec["status"] == "done" else phase)


def write_if_room(path: Path, text: str) -> OutOfSpace | None:
    """Write ``text`` and a newline to ``path`` atomically; the full disk's error if it did not
    fit (for the caller to record once it may), else None."""
    from harness.storage.records import atomic_write_text

    try:
        atomic_write_text(path, text + "\n")
    except OutOfSpace as exc:
        return exc
    return None


def lease_failure(cell: Cell, exc: OutOfSpace) -> dict[str, Any]:
    """The in-memory failed record of a cell that could not even take its lease."""
    from harness.contract import new_record
    from harness.engine.build import now
    from harness.engine.environment import environment, resolve_device

    rec = new_record(cell, environment(resolve_device(cell.recipe.device)), now())
    rec["finished_at"] = now()
    log.warning("cell %s failed: %s: %s (no record written)", cell.label, OUT_OF_SPACE, exc)
    return _unwritten(rec, exc, phase="setup")


def record_killed_cell(cell: Cell, results_dir: Path, message: str) -> dict[str, Any]:
    """Write the failed record of a cell whose worker processes kept being killed (by the
    executor, in its own process: the worker died without a word). The phase is where the cell's
    files say it was: evaluation once ``trained.json`` exists, training once it started.

    Returns:
        The record (also in ``<results_dir>/<cell_id>/record.json`` when there is room for it).
    """
    from harness.contract import new_record
    from harness.engine.build import now
    from harness.engine.environment import environment, resolve_device
    from harness.registry import resolved
    from harness.storage.checkpoint import log_event, read_events
    from harness.storage.records import write_record

    cell_dir = Path(results_dir) / cell.cell_id
    events = [e["event"] for e in read_events(cell_dir)]
    phase = (
        "evaluate"
        if (cell_dir / "trained.json").exists()
        else "train"
        if "train" in events
        else "setup"
    )
    cell = resolved(cell)
    rec = new_record(cell, environment(resolve_device(cell.recipe.device)), now())
    rec["status"], rec["finished_at"] = "failed", now()
    rec["error"] = {"type": "WorkerKilled", "message": message, "traceback": "",
                    "data_missing": False, "phase": phase}  # fmt: skip
    try:
        write_record(cell_dir, rec)
        log_event(cell_dir, "failed", phase=phase, error="WorkerKilled")
    except OutOfSpace as exc:  # the executor's report names the cell; a re-run retries it
        log.warning("cell %s: no record written: %s", cell.label, exc)
    return rec
