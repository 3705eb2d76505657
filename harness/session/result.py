"""What a run or a validation did, as data: the command line renders it, the Python face hands it
back (``harness.api.RunResult``, ``harness.api.Validation``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from harness.config.suite import Suite
    from harness.contract import Cell

#: The error types a user fixes rather than the harness (a cell failed on its data or weights,
#: or on a plugin metric that raised or returned no number): the run's exit status is then 2,
#: as for the same problem found before the run.
USER_ERRORS = ("MetricError",)


@dataclass(frozen=True)
class CellFailure:
    """A cell of the run whose record is ``failed``.

    Attributes:
        cell_id: the cell's folder under the results folder.
        label: ``dataset/backbone/method(M=…,…)/seed…``.
        type: the error's type (``DivergenceError``, ``OutOfMemoryError``, ``MetricError``…).
        message: the record's one-line reason.
        phase: where it failed (``setup``, ``train``, ``eval``…; None when the record says not).
        data_missing: it failed on its data or weight files (missing, damaged).
    """

    cell_id: str
    label: str
    type: str
    message: str
    phase: str | None = None
    data_missing: bool = False

    @property
    def users_to_fix(self) -> bool:
        """The data, a weights file or a plugin metric: the user's to fix (exit status 2)."""
        return self.data_missing or self.type in USER_ERRORS

    @classmethod
    def of(cls, record: Mapping[str, Any], label: str) -> CellFailure:
        """The failure a failed record states."""
        err = record.get("error") or {}
        return cls(
            cell_id=str(record.get("cell_id", "")),
            label=label,
            type=str(err.get("type", "?")),
            message=str(err.get("message", "")),
            phase=err.get("phase") or None,
            data_missing=bool(err.get("data_missing")),
        )


@dataclass(frozen=True)
class SkippedCell:
    """A selected cell the run did not train.

    Attributes:
        cell_id, label: the cell.
        kind: ``done`` (a finished record was there, or another live process that held the
            cell finished it before this run returned; ``force`` redoes it) or ``leased``
            (another live process still holds it).
        reason: the line that says so (``done``, ``done by host:pid``, ``leased by host:pid``).
    """

    cell_id: str
    label: str
    kind: Literal["done", "leased"]
    reason: str


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a dry run's plan.

    Attributes:
        cell: the cell (``cell_id``, ``label``).
        verdict: ``run`` or ``skip``.
        kind: the reason as counted in a summary (``pending``, ``done``, ``failed, retried``,
            ``not selected by --only``, ``leased by another live process``…).
        why: the reason in full (which process holds the lease, where a cell failed).
    """

    cell: Any
    verdict: Literal["run", "skip"]
    kind: str
    why: str


@dataclass(frozen=True)
class RunStart:
    """A run about to hand its cells to the executor (what ``on_start`` receives).

    Attributes:
        suite: the suite's name.
        results_dir: ``<results>/<suite name>``; read it with :func:`harness.api.load_results`.
        cells: the suite's cells this run is about (after ``only``).
        todo: those handed to the executor (not finished, or every one with ``force``).
        executor: one line saying how they run (the executor's ``describe``; empty for a dry
            run).
    """

    suite: str
    results_dir: Path
    cells: list[Cell]
    todo: list[Cell]
    executor: str = ""


@dataclass(frozen=True)
class RunResult(RunStart):
    """What :func:`harness.session.run_suite` did (also :func:`harness.api.run`'s answer).

    Attributes:
        done: ids of the cells this run finished (their records are ``done``).
        skipped: cells not trained: finished before, or held by another live process.
        failed: cells whose record is ``failed``, each with its reason.
        finished: every cell handed over has its record now; False when they were handed to a
            scheduler (``harness status`` follows them).
        halted: a full file system stopped the run before every cell had started (those are
            left pending).
        messages: the executor's lines (a job id, a killed worker, a full disk).
        seconds: the executor's wall time.
        plan: a dry run's plan (every cell of the suite, selected or not); None for a run.
    """

    done: list[str] = field(default_factory=list)
    skipped: list[SkippedCell] = field(default_factory=list)
    failed: list[CellFailure] = field(default_factory=list)
    finished: bool = True
    halted: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0
    plan: list[PlannedCell] | None = None

    @property
    def exit_code(self) -> int:
        """``harness run``'s status: 0 every cell done, or handed to a scheduler, or a dry run;
        2 a cell failed on its data, its weights or a plugin metric (the user's to fix); 1
        another cell failed, a full disk stopped the run, or another live process still holds
        a cell (the grid is not complete when this run returns: a script that reports next
        would report a partial grid)."""
        if self.plan is not None or not self.finished:
            return 0
        if any(f.users_to_fix for f in self.failed):
            return 2
        return max(int(bool(self.failed)), int(self.halted), int(bool(self.leased)))

    @property
    def leased(self) -> list[SkippedCell]:
        """The cells another live process held when this run reached them (not trained here)."""
        return [s for s in self.skipped if s.kind == "leased"]

    @property
    def pending(self) -> list[str]:
        """Ids of the cells of this run that have no record yet (handed to a scheduler, or
        not started after a full disk stopped the run)."""
        seen = {*self.done, *(s.cell_id for s in self.skipped), *(f.cell_id for f in self.failed)}
        return [c.cell_id for c in self.cells if c.cell_id not in seen]

    @property
    def leaderboard(self) -> Path:
        """Where ``harness report`` (or :func:`harness.api.leaderboard`'s page) writes the
        leaderboard of this folder: ``<results_dir>/leaderboard.html``. The run writes none."""
        return self.results_dir / "leaderboard.html"


@dataclass(frozen=True)
class Validation:
    """A suite that passed every check (:func:`harness.session.validate_suite`).

    Attributes:
        suite: the suite's name (its results go to ``<results>/<suite>``).
        cells: the cells it expands to (after ``only``): ``cell.cell_id``, ``cell.label``,
            ``cell.config()``.
        left_out: ``(method, why)`` for each method ``methods: [all]`` leaves out.
        grid_cells: the cells of the whole grid (``only`` not applied).
        definition: the validated suite itself (its grid, recipe and evaluation blocks).
    """

    suite: str
    cells: list[Cell]
    left_out: list[tuple[str, str]] = field(default_factory=list)
    grid_cells: int = 0
    definition: Suite | None = field(default=None, repr=False, compare=False)
