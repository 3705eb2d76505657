"""The executor protocol, its options, and what every executor shares (manifest, pending cells).

An executor takes a suite's pending cells and makes each of them leave a record in the results
folder, by calling :func:`harness.executors.ranks.run_one` (the engine's
:func:`harness.engine.runner.run_cell`, or the ranks of a multi-process cell) somewhere: in this
process, in local worker processes, or in Slurm array tasks. It never prints the leaderboard and
never imports the CLI: the CLI picks one by name (:data:`harness.executors.EXECUTORS`), runs it,
and prints the summary.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from harness.contract import SUITE_FILE, Cell, DamagedRecord, build_manifest, set_aside
from harness.contract.manifest import read_manifest_file
from harness.contract.record import read_record
from harness.storage.records import atomic_write_text
from harness.storage.tracker_options import TrackerOptions


@dataclass(frozen=True)
class ExecutorOptions:
    """Everything an executor may be configured with (each uses the fields it needs).

    Attributes:
        workers: Local worker processes (None: one per core, at most one per cell).
        threads: torch intra-op threads per process (None: torch's default, or cores ÷ workers).
        profile: Slurm cluster profile YAML (None: the built-in default profile).
        slurm_overrides: ``KEY=VALUE`` overrides of profile entries.
        wait: Slurm: wait for the job array to finish.
        progress: Show progress bars, and a line per running cell beneath the bar over cells
            (harness.executors.live).
        gpus: Local: the GPUs to place cells on (``CUDA_VISIBLE_DEVICES`` ids; None: every
            visible one).
        cells_per_gpu: Local: cells running at once on each GPU.
        trackers: The experiment trackers every cell logs to, with the user's tags and where
            they log; handed to each cell's process as an argument (a worker's task, a Slurm
            task's payload), never through the environment.
    """

    workers: int | None = None
    threads: int | None = None
    profile: str | None = None
    slurm_overrides: tuple[str, ...] = ()
    wait: bool = False
    progress: bool = True
    gpus: tuple[str, ...] | None = None
    cells_per_gpu: int = 1
    trackers: TrackerOptions = field(default_factory=TrackerOptions)


@dataclass
class RunOutcome:
    """What a run leaves for the CLI to report: the executor never prints.

    Attributes:
        finished: every cell has its record now (done or failed); False when the cells were
            handed to a scheduler and may still be running.
        records: each cell's record as the run left it (or ``{"cell_id", "status": "leased",
            "lease"}`` for a cell another live process holds), in the order of the cells; empty
            when ``finished`` is False.
        messages: lines for the CLI to print after the run (a job id, where to follow it).
        halted: a fault of the machine (a full file system) stopped the run before every cell
            had started; the CLI exits non-zero (harness.executors.faults).
    """

    finished: bool
    records: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    halted: bool = False


class Executor(Protocol):
    """Runs cells so that each leaves ``<results_dir>/<cell_id>/record.json``.

    Class attributes:
        name: what ``--executor`` calls it.
        reads: the :class:`ExecutorOptions` fields it uses; the CLI refuses a flag that sets
            any other (it would be ignored without a word). An executor that reads
            ``trackers`` passes ``options.trackers`` to :func:`harness.executors.ranks.run_one`
            for every cell.
        runs_here: cells run on this machine, so the CLI checks their data here first.
    """

    name: str
    reads: ClassVar[tuple[str, ...]]
    runs_here: ClassVar[bool]

    def __init__(self, options: ExecutorOptions) -> None:
        """Check ``options`` (raising with one line per problem) before any cell runs."""
        ...

    def describe(self, n_cells: int) -> str:
        """One line saying how ``n_cells`` cells will run (printed by the CLI before running)."""
        ...

    def run(
        self, cells: list[Cell], results_dir: Path, data_root: Path | None, force: bool
    ) -> RunOutcome:
        """Run or submit ``cells``; ``force`` redoes finished ones from scratch (here or in
        the scheduler's tasks). ``data_root`` None: each cell's process resolves its own
        (``$HARNESS_DATA_ROOT``, else the user cache)."""
        ...


def write_manifest(suite, results_dir: Path, only: tuple[str, ...] = ()) -> None:
    """Record which cells ``suite`` expects (merged with earlier runs of other versions), so
    ``harness status`` and ``harness report`` can list the cells that never started, with the
    command line's overrides (``suite.overrides``) and ``--only`` filters."""
    path = Path(results_dir) / SUITE_FILE
    try:
        old = read_manifest_file(path) if path.exists() else None
    except ValueError as exc:  # damaged: kept aside, and a new one holds this run's cells
        old = None
        print(f"warning: {exc}; moved to {set_aside(path).name}", file=sys.stderr)
    overrides = getattr(suite, "overrides", ())
    manifest = build_manifest(suite.name, str(suite.source), suite.cells(), old, overrides, only)
    atomic_write_text(path, json.dumps(manifest, indent=1) + "\n")


def pending(cells: list[Cell], results_dir: Path, force: bool = False) -> list[Cell]:
    """Cells without a finished record (all of them with ``force``). A damaged record is named
    in one line on stderr and its cell is pending: the run that takes the cell sets the file
    aside first (:func:`harness.storage.records.record_or_set_aside`)."""
    if force:
        return list(cells)
    out = []
    for c in cells:
        try:
            rec = read_record(Path(results_dir) / c.cell_id)
        except DamagedRecord as exc:
            print(f"warning: {exc}; the cell is redone (the file is kept aside)", file=sys.stderr)
            rec = None
        if not (rec and rec.get("status") == "done"):
            out.append(c)
    return out
