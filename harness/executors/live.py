"""One line per running cell beneath the bar over cells, whichever executor runs them.

Whatever process trains a cell (this one, a local worker, a Slurm task) keeps the cell's files
up to date: ``progress.csv`` gains a row per finished epoch (:mod:`harness.storage.progress`)
and ``live.json`` says every few seconds what the cell is doing, the epoch, step, running loss
and ETA, or the evaluation's pass and batch (:mod:`harness.storage.live`). The process that
runs the executor's loop reads them (the local executor's parent between its waits, the
in-process executor from a thread, ``--executor slurm --wait`` between its polls) and shows:

- on a terminal, one line per running cell, redrawn every :data:`REFRESH_S` seconds beneath the
  bar over cells::

      cells:  25%|██▌       | 1/4 [00:41<02:03, 41.2s/cell]
        a5adad digits/digits_cnn/single(M=1)/seed0  epoch 5/12  step 120/312  loss 0.412  ETA 3m10s
        b7c1e0 digits/digits_cnn/single(M=1)/seed1  evaluating: clean 3/10 batches (pass 1/5)

- elsewhere (a CI log, a file), one line per finished epoch of each cell, from its
  ``progress.csv`` (so none is missed however short the epoch), and one when its evaluation
  starts: never a line per step.

``$HARNESS_PROGRESS`` (:data:`harness.contract.env.PROGRESS`) picks ``live`` or ``epochs``
wherever the output goes, or ``off``; a run without progress bars (``harness run -q``, the
Python face's default) shows none.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.contract import Cell
from harness.contract.env import PROGRESS
from harness.storage.lease import LEASE_FILE
from harness.storage.live import LIVE_FILE, duration, live_parts, read_live
from harness.storage.progress import eta_s, read_progress

#: Seconds between two redraws of the live lines (and reads of the cells' files).
REFRESH_S = 0.5
#: Running cells shown on a terminal; more are counted on one last line.
MAX_LINES = 12


def line_mode(progress: bool, stream: Any = None) -> str | None:
    """``live``, ``epochs`` or None (no lines): None without progress bars or with
    ``HARNESS_PROGRESS=off``; ``auto`` (the default) is ``live`` when ``stream`` (standard
    error) is a terminal.

    Raises:
        EnvError: ``$HARNESS_PROGRESS`` holds another value.
    """
    if not progress:
        return None
    mode = PROGRESS.read("auto")
    if mode == "off":
        return None
    if mode == "auto":
        isatty = getattr(sys.stderr if stream is None else stream, "isatty", None)
        return "live" if callable(isatty) and isatty() else "epochs"
    return mode


def cell_prefix(cell: Cell) -> str:
    """``  a5adad digits_hard/digits_cnn/single(M=1)/seed0``: how each line names its cell."""
    return f"  {cell.cell_id[:6]} {cell.label}"


def epoch_line(cell: Cell, rows: list[dict[str, Any]], k: int) -> str:
    """The line of the ``k``-th row of ``rows`` (a cell's ``progress.csv``): epoch, mean loss,
    last accuracy, ETA from the mean epoch time."""
    row, epochs = rows[k], cell.recipe.epochs
    parts = [cell_prefix(cell), f"epoch {int(row['epoch'])}/{epochs}"]
    if row.get("train_loss") is not None:
        parts.append(f"loss {row['train_loss']:.3f}")
    if row.get("val_acc") is not None:
        parts.append(f"val acc {row['val_acc']:.3f}")
    elif row.get("train_acc") is not None:
        parts.append(f"train acc {row['train_acc']:.3f}")
    eta = eta_s(rows[: k + 1], epochs)
    if eta is not None and int(row["epoch"]) < epochs:
        parts.append(f"ETA {duration(eta)}")
    return "  ".join(parts)


def live_line(cell: Cell, cell_dir: Path) -> str:
    """The cell's live line: its heartbeat's epoch, step, loss and ETA or its evaluation's
    batch; ``starting`` before the first heartbeat."""
    state = read_live(cell_dir)
    parts = live_parts(state) if state is not None else []
    return "  ".join([cell_prefix(cell), *(parts or ["starting"])])


class CellLines:
    """The per-cell lines of one run (see the module docstring); thread-safe.

    The executor's loop calls :meth:`started` before a cell is handed to its process,
    :meth:`show` with the cells running whenever it wakes (redrawn at most every
    :data:`REFRESH_S`), :meth:`finished` once a cell is over, and :meth:`close` at the end.

    Args:
        results_dir: the suite's results folder (the cells' folders are in it).
        mode: ``live`` or ``epochs`` (:func:`line_mode`).
        write: where an ``epochs`` line goes (default: above the bars, on standard error).
    """

    def __init__(
        self, results_dir: Path, mode: str, write: Callable[[str], None] | None = None
    ) -> None:
        self.results_dir = Path(results_dir)
        self.mode = mode
        self._write = write or _write_line
        self._lock = threading.Lock()
        self._printed: dict[str, int] = {}  # cell id → epochs shown (epochs mode)
        self._over: set[str] = set()  # cells finished (a racing redraw leaves them alone)
        self._evaluating: set[str] = set()  # cells whose evaluation line was shown
        self._rows: dict[str, int] = {}  # cell id → its line (live mode)
        self._bars: list[Any] = []
        self._last = -float("inf")

    @classmethod
    def open(cls, results_dir: Path, progress: bool) -> CellLines | None:
        """The lines of a run with or without progress bars; None when none are shown."""
        mode = line_mode(progress)
        return None if mode is None else cls(results_dir, mode)

    def started(self, cell: Cell) -> None:
        """``cell`` is about to be handed to its process: the epochs already in its
        ``progress.csv`` (a resumed cell's) are not shown again."""
        with self._lock:
            rows = read_progress(self.results_dir / cell.cell_id)
            self._printed[cell.cell_id] = int(rows[-1]["epoch"]) if rows else 0
            self._evaluating.discard(cell.cell_id)
            self._over.discard(cell.cell_id)

    def show(self, cells: Sequence[Cell], working_only: bool = False) -> None:
        """Redraw the lines of the running ``cells`` (at most every :data:`REFRESH_S`).
        ``working_only``: skip cells no process works on yet (a scheduler's queued tasks:
        neither a lease nor a heartbeat)."""
        with self._lock:
            now = time.monotonic()
            if now - self._last < REFRESH_S:
                return
            self._last = now
            cells = [c for c in cells if c.cell_id not in self._over]
            if working_only:
                cells = [c for c in cells if self._working(c)]
            if self.mode == "live":
                self._draw(cells)
            else:
                for cell in cells:
                    self._new_epochs(cell)

    def finished(self, cell: Cell) -> None:
        """``cell`` is over: its last epochs' lines (``epochs`` mode) and its line freed."""
        with self._lock:
            if self.mode == "epochs" and cell.cell_id not in self._over:
                self._new_epochs(cell)
            self._over.add(cell.cell_id)
            self._rows.pop(cell.cell_id, None)

    def close(self) -> None:
        """Clear the live lines."""
        with self._lock:
            for bar in reversed(self._bars):
                bar.close()
            self._bars.clear()

    @contextlib.contextmanager
    def following(self, running: Callable[[], Sequence[Cell]]) -> Iterator[None]:
        """Redraw the lines of ``running()`` from a thread while the block runs (the in-process
        executor, whose one thread trains the cell), then :meth:`close` them."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(REFRESH_S / 2):
                self.show(running())

        thread = threading.Thread(target=loop, name="cell-lines", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            self.close()

    def _working(self, cell: Cell) -> bool:
        folder = self.results_dir / cell.cell_id
        return (folder / LIVE_FILE).exists() or (folder / LEASE_FILE).exists()

    def _new_epochs(self, cell: Cell) -> None:
        """``epochs`` mode: a line per epoch finished since the last, and one when the cell's
        evaluation is seen to start."""
        folder = self.results_dir / cell.cell_id
        rows = read_progress(folder)
        done = self._printed.get(cell.cell_id, 0)
        for k, row in enumerate(rows):
            if int(row["epoch"]) > done:
                self._write(epoch_line(cell, rows, k))
                done = int(row["epoch"])
        self._printed[cell.cell_id] = done
        state = read_live(folder)
        if state and state.get("phase") == "evaluate" and cell.cell_id not in self._evaluating:
            self._evaluating.add(cell.cell_id)
            self._write("  ".join([cell_prefix(cell), "evaluating"]))

    def _draw(self, cells: Sequence[Cell]) -> None:
        """``live`` mode: each running cell keeps its line while it runs; a free line is blank."""
        from tqdm.auto import tqdm

        ids = {c.cell_id for c in cells}
        for cid in [c for c in self._rows if c not in ids]:
            del self._rows[cid]
        for cell in cells:
            if cell.cell_id not in self._rows:
                used = set(self._rows.values())
                self._rows[cell.cell_id] = next(i for i in itertools.count() if i not in used)
        needed = max([r + 1 for r in self._rows.values()], default=0)
        texts = [""] * min(max(needed, len(self._bars)), MAX_LINES)
        room = MAX_LINES if len(cells) <= MAX_LINES else MAX_LINES - 1
        shown = 0
        for cell in cells:
            row = self._rows[cell.cell_id]
            if row < room:
                texts[row] = live_line(cell, self.results_dir / cell.cell_id)
                shown += 1
        if shown < len(cells):
            texts[-1] = f"  … and {len(cells) - shown} more cells running"
        while len(self._bars) < len(texts):
            self._bars.append(tqdm(total=0, bar_format="{desc}", position=len(self._bars) + 1,
                                   leave=False, file=sys.stderr))  # fmt: skip
        width = max(_columns() - 1, 20)
        for i, bar in enumerate(self._bars):
            text = texts[i] if i < len(texts) else ""
            bar.set_description_str(text[:width], refresh=True)  # wrapped, a line breaks the rest


def _columns() -> int:
    """The width of the terminal standard error writes to (standard output's, or 80, when it
    is none)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, ValueError, OSError):  # no fileno, or not a terminal
        return shutil.get_terminal_size().columns


def _write_line(text: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(text, file=sys.stderr)
