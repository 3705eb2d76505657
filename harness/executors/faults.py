"""What an executor does when the machine fails its cells: a full file system stops the run, a
killed worker is replaced and its cell retried once.

- **Out of space** (``error.type`` ``OutOfSpace`` in a cell's record, harness.storage.space): every
  cell started after it would fail the same way, on a cluster after hours of training, so no new
  cell starts; the cells already running finish (or fail) on their own, and the run ends with one
  line saying how many cells were left pending and that running the same command again resumes
  them.
- **A killed worker** (SIGKILL from the kernel's out-of-memory killer, or any signal): the local
  executor starts a new worker on the same devices and retries the cell once, from its last
  checkpoint; a cell that kills its worker :data:`KILLS_ALLOWED` times is failed with a record
  naming the signal, never retried a third time, and the grid goes on.
- **A worker that re-ran the script**: workers are started with the spawn method, which imports
  the main script again in each; a script that calls ``harness.api.run`` at import (not under
  ``if __name__ == "__main__":``) would start the run again inside every worker. The worker
  notices while it is being started (:func:`refuse_run_in_starting_worker`) and exits with
  :data:`MAIN_REIMPORTED_EXIT`; the executor stops at the first such exit with one line saying so
  (:class:`MainReimported`), records nothing and retries nothing: it is not the cell's fault.

The executors report through :class:`MachineFaults`, whose lines the CLI prints after the run.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.executors.base import RunOutcome
from harness.executors.devices import ExecutorError
from harness.storage.space import OUT_OF_SPACE, OutOfSpace, is_out_of_space_error

#: Worker deaths a cell may cause before it is failed instead of retried.
KILLS_ALLOWED = 2

#: ``error.type`` of the failures the machine caused (a full file system, memory that ran out,
#: a killed worker): their message is the whole story, ``harness status`` shows no traceback.
MACHINE_FAULTS = frozenset({OUT_OF_SPACE, "OutOfMemoryError", "WorkerKilled"})

#: The exit status of a worker that was asked to run a suite while it was still being started
#: (EX_CONFIG of sysexits.h: the program is set up wrongly), told apart from a kill by it.
MAIN_REIMPORTED_EXIT = 78


def refuse_run_in_starting_worker() -> None:
    """Exit with :data:`MAIN_REIMPORTED_EXIT` in a process that multiprocessing is still
    starting (its ``_inheriting``: the spawn method is importing the parent's main script again):
    the run was called at the script's import, and would otherwise train cells here, or fail
    later with multiprocessing's bootstrapping error. Quietly: the parent says why, once."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise SystemExit(MAIN_REIMPORTED_EXIT)


class MainReimported(ExecutorError):
    """The workers exited while starting because the main script starts the run at import."""

    def __init__(self) -> None:
        main = sys.modules.get("__main__")
        where = getattr(main, "__file__", None) or getattr(main, "__name__", "__main__")
        super().__init__(
            f"{where} calls harness.api.run when it is imported, and every worker process "
            "imports it again (workers are started with the spawn method), so the workers "
            'exited before running any cell: put the call under `if __name__ == "__main__":` '
            "and run the script again (no cell was run or recorded)"
        )


def signal_name(exitcode: int | None) -> str:
    """``-9`` → ``SIGKILL`` (a process's exit code is minus the signal that ended it)."""
    if exitcode is None:
        return "an unknown cause"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def kill_hint(sig: str) -> str:
    """Why a worker may have died that way."""
    if sig == "SIGKILL":
        return "the kernel's out-of-memory killer sends SIGKILL when the machine runs out of memory"
    return "the worker did not exit on its own"


@dataclass
class MachineFaults:
    """Faults of the machine seen while running one list of cells.

    Attributes:
        messages: lines for the CLI to print after the run (kills, the stop).
        stopped_by: the record of the first out-of-space failure: once set, no cell starts.
        kills: cell id → how many workers it has killed.
    """

    messages: list[str] = field(default_factory=list)
    stopped_by: dict[str, Any] | None = None
    kills: Counter = field(default_factory=Counter)

    def note(self, record: dict[str, Any]) -> bool:
        """Look at a finished cell's record; True when no further cell may start."""
        if self.stopped_by is None and is_out_of_space_error(record.get("error")):
            self.stopped_by = record
        return self.stopped_by is not None

    @property
    def stopped(self) -> bool:
        """A full file system stopped the run."""
        return self.stopped_by is not None

    def worker_killed(
        self, cell_id: str, label: str, pid: int | None, exitcode: int | None
    ) -> bool:
        """Count a worker's death while it ran ``cell_id``; True when the cell may be retried."""
        self.kills[cell_id] += 1
        sig = signal_name(exitcode)
        who = f"its worker process (pid {pid})" if pid else "its worker process"
        if self.kills[cell_id] < KILLS_ALLOWED:
            self.messages.append(
                f"cell {cell_id} ({label}): {who} was killed by {sig} ({kill_hint(sig)}); "
                "a new worker took its place and retried the cell from its last checkpoint"
            )
            return True
        return False

    def kill_failure(self, cell_id: str, label: str, exitcode: int | None) -> str:
        """The one line of a cell failed after killing :data:`KILLS_ALLOWED` workers (also its
        record's error message)."""
        sig = signal_name(exitcode)
        line = (
            f"cell {cell_id} ({label}) killed its worker process {self.kills[cell_id]} times "
            f"(last by {sig}: {kill_hint(sig)}); failed, not retried again: lower its memory "
            "(recipe.batch_size, recipe.eval_batch_size) or run fewer cells at once (--workers), "
            "then run the same command again"
        )
        self.messages.append(line)
        return line

    def stop_line(self, pending: int) -> str | None:
        """The line that ends a run a full file system stopped (None when none did)."""
        if self.stopped_by is None:
            return None
        error = self.stopped_by["error"]
        left = (
            f"{pending} cell{'s' if pending != 1 else ''} left pending (not started)"
            if pending
            else "no cell left pending"
        )
        return (
            f"stopped starting cells after cell {self.stopped_by['cell_id']} failed: "
            f"{error['message']}; {left}; free space (or raise the quota) and run the same "
            "command again: finished cells are kept, started ones resume from their last "
            "checkpoint"
        )


def raised_failure(cell_id: str, exc: OutOfSpace) -> dict[str, Any]:
    """The in-memory failed record of a cell whose run raised :class:`OutOfSpace` instead of
    recording it (a write outside the cell's recorded phases: nothing was written)."""
    error = {"type": OUT_OF_SPACE, "message": str(exc), "traceback": "", "data_missing": False,
             "phase": "setup"}  # fmt: skip
    return {"cell_id": cell_id, "status": "failed", "error": error}


def outcome_after(faults: MachineFaults, records: list[dict[str, Any]], n_cells: int) -> RunOutcome:
    """The outcome of a run of ``n_cells`` cells here: every record, the fault lines, and
    ``halted`` when a full file system stopped it (the cells without a record are pending)."""
    messages = list(faults.messages)
    if line := faults.stop_line(n_cells - len(records)):
        messages.append(line)
    return RunOutcome(finished=True, records=records, messages=messages, halted=faults.stopped)
