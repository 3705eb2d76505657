"""Live training progress of a cell: ``progress.csv`` (always) and TensorBoard events (on request).

While a cell trains, each finished epoch appends one row to ``<cell>/progress.csv`` and flushes
it, so ``tail -f``, a spreadsheet, pandas or ``harness status`` see the epoch as soon as it ends
(``record.json`` carries the history only once the cell is over). The columns are
:data:`COLUMNS` followed by the method's scalar diagnostics of the first epoch written, prefixed
``diag_`` (σN-Ens: τ, λ, L_div, the gradient ratio...; nested per-layer values are left to the
record). A resumed cell keeps the rows up to the epoch it resumes after and drops any later one
(written after the checkpoint it resumes from), so the file never holds an epoch twice.

``progress.json`` says who trains the cell (executor, device, epochs); ``harness status`` reads
it with the CSV, the cell's lease and its heartbeat (``live.json``: the step within the epoch,
or the evaluation's batch, :mod:`harness.storage.live`).

The same numbers go to the trackers the run asked for (:mod:`harness.storage.loggers`; e.g.
``harness run --tensorboard`` writes them with ``torch.utils.tensorboard.SummaryWriter`` into
``<cell>/tensorboard/``; view them with ``tensorboard --logdir results/<suite>``), under the
trackers' metric names (:data:`harness.storage.loggers.EPOCH_METRICS`). The runner hands this
log the cell's trackers; nothing here reads the environment for them.
"""

from __future__ import annotations

import contextlib
import csv
import json
import multiprocessing
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.storage.records import atomic_write_text
from harness.storage.space import OutOfSpace, naming_full_disk

if TYPE_CHECKING:
    from harness.storage.loggers import CellTrackers

PROGRESS_CSV = "progress.csv"
PROGRESS_JSON = "progress.json"

# Fixed columns, in this order; validation columns stay empty when the recipe holds out nothing.
COLUMNS = (
    "epoch",
    "train_loss",
    "train_reg",
    "train_acc",
    "lr",
    "val_acc",
    "val_nll",
    "val_ece",
    "images_per_s",
    "epoch_s",
    "elapsed_s",
)

__all__ = [
    "COLUMNS",
    "PROGRESS_CSV",
    "ProgressLog",
    "epoch_images",
    "eta_s",
    "executor_name",
    "progress_summary",
    "read_progress",
]


def executor_name() -> str:
    """How this process runs cells: ``slurm`` (array task), ``local`` (a worker process of the
    local executor) or ``inprocess`` (the ``harness run`` process itself)."""
    # submitit marks its tasks; an `salloc` shell running `harness run` is not a Slurm task.
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm" or os.environ.get("SLURM_ARRAY_TASK_ID"):
        return "slurm"
    return "local" if multiprocessing.parent_process() is not None else "inprocess"


def device_label(device: str) -> str:
    """``cuda:0 NVIDIA H200 (GPU 2)``: the device's name (as the record's ``cost.device`` has
    it) and, when this process sees only some GPUs (a local worker bound to one, a Slurm
    allocation), which ones ``CUDA_VISIBLE_DEVICES`` names."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if device.startswith("cuda") and visible:
        return f"{device} (GPU {visible})"
    return device


def flat_scalars(diagnostics: Mapping[str, Any]) -> dict[str, float]:
    """The top-level numeric entries of a method's diagnostics, as ``diag_<name>`` floats."""
    return {
        f"diag_{k}": float(v)
        for k, v in diagnostics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def epoch_images(loader: Any, steps: int) -> int:
    """Images a training epoch of ``steps`` steps fed: every image, or the full batches only
    when the loader drops the last one, times the loader's streams (M for methods whose members
    see independent batches)."""
    n = len(loader.labels)
    per_stream = (
        steps * loader.batch_size if loader.drop_last else min(n, steps * loader.batch_size)
    )
    return per_stream * loader.streams


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _epoch_at_most(row: Mapping[str, str], epoch: int) -> bool:
    n = _number(row.get("epoch"))
    return n is not None and n <= epoch


def read_progress(cell_dir: Path) -> list[dict[str, float | None]]:
    """The rows of a cell's ``progress.csv`` (numbers, None where empty); [] without a file.

    A last line cut short (read while being written) is left out.
    """
    path = Path(cell_dir) / PROGRESS_CSV
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]
    rows = []
    for raw in csv.DictReader(lines):
        row = {k: _number(v) for k, v in raw.items() if k is not None}
        if row.get("epoch") is not None:
            rows.append(row)
    return rows


def eta_s(rows: list[Mapping[str, Any]], epochs: int, since_last_s: float = 0.0) -> float | None:
    """Seconds of training left: the mean epoch time of ``rows`` times the epochs still to run,
    less the time already spent in the current epoch (``since_last_s``), never below 0.

    Returns None before the first epoch has finished (no epoch time to go by).
    """
    times = [r["epoch_s"] for r in rows if r.get("epoch_s") is not None]
    if not times:
        return None
    left = epochs - int(rows[-1]["epoch"])
    if left <= 0:
        return 0.0
    return max(sum(times) / len(times) * left - since_last_s, 0.0)


class ProgressLog:
    """Appends one row per finished epoch to ``progress.csv`` and hands it to the loggers asked
    for (:mod:`harness.storage.loggers`: TensorBoard, Weights & Biases offline, MLflow).

    Args:
        cell_dir: the cell's folder.
        resume_epoch: epochs already trained (the checkpoint's); rows after it are dropped.
        epochs: the recipe's epochs (for ``progress.json``).
        device: the device the cell trains on, e.g. ``cpu`` or ``cuda:1``.
        tensorboard: write TensorBoard events too (the same as ``"tensorboard"`` in
            ``loggers``).
        loggers: tracker names to open here (default: none).
        trackers: trackers opened by the caller, who also finishes them (the runner, which sends
            them the record's final metrics); default: open ``loggers`` here, close them in
            :meth:`close`.
    """

    def __init__(
        self,
        cell_dir: Path,
        resume_epoch: int,
        epochs: int,
        device: str,
        tensorboard: bool = False,
        loggers: Sequence[str] = (),
        trackers: CellTrackers | None = None,
    ) -> None:
        from harness.storage.loggers import CellTrackers

        self.path = Path(cell_dir) / PROGRESS_CSV
        self.fields: list[str] | None = None
        kept = self._truncate(resume_epoch)
        info = {
            "executor": executor_name(),
            "device": device_label(device),
            "epochs": epochs,
            "resumed_after": resume_epoch,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_text(Path(cell_dir) / PROGRESS_JSON, json.dumps(info) + "\n")
        self._file = self.path.open("a", newline="")
        self._writer: csv.DictWriter | None = None
        if self.fields is not None:
            self._writer = csv.DictWriter(self._file, self.fields, extrasaction="ignore")
        self.rows_kept = kept
        # Trackers handed in belong to the caller (the runner sends them the record after the
        # evaluation); without them this log opens its own and closes them with the file.
        self._owns_trackers = trackers is None
        if trackers is None:
            names = [*loggers, *(["tensorboard"] if tensorboard else [])]
            trackers = CellTrackers(Path(cell_dir), list(dict.fromkeys(names)))
        self.trackers = trackers
        trackers.start(resume_epoch)

    def _truncate(self, resume_epoch: int) -> int:
        """Keep the rows of epochs <= ``resume_epoch`` (atomically); returns how many."""
        if not self.path.exists():
            return 0
        with self.path.open(newline="") as f:
            reader = csv.DictReader(f)
            header, raw = reader.fieldnames, list(reader)
        keep = [r for r in raw if _epoch_at_most(r, resume_epoch)]
        if not keep or not header:
            self.path.unlink()  # a fresh start: the next row writes a new header
            return 0
        self.fields = list(header)
        lines = _Lines()
        writer = csv.DictWriter(lines, self.fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(keep)
        atomic_write_text(self.path, "".join(lines.parts))
        return len(keep)

    def write(
        self,
        row: Mapping[str, Any],
        diagnostics: Mapping[str, Any] | None = None,
        images: int | None = None,
    ) -> dict[str, Any]:
        """Append one epoch: ``row`` holds ``epoch`` and the history keys (train_loss, lr,
        val_acc, ``time_s``: the epoch's seconds, ``elapsed_s``...), ``images`` the images seen
        in the epoch (for images/s). Returns the row as written."""
        out: dict[str, Any] = {k: row[k] for k in COLUMNS if k in row}
        epoch_s = row.get("epoch_s", row.get("time_s"))
        out["epoch_s"] = epoch_s
        if images is not None and epoch_s:
            out["images_per_s"] = images / epoch_s
        out.update(flat_scalars(diagnostics or {}))
        if self._writer is None:
            self.fields = [*COLUMNS, *sorted(k for k in out if k not in COLUMNS)]
            self._writer = csv.DictWriter(self._file, self.fields, extrasaction="ignore")
            self._writer.writeheader()
        try:
            with naming_full_disk(self.path):
                self._writer.writerow(out)
                self._file.flush()  # visible to readers now, not when the buffer fills
        except OutOfSpace:
            # Drop the unwritten row with the file: closing flushes again, and a later close
            # (or the garbage collector's) would print the same error without a path.
            with contextlib.suppress(OSError):
                self._file.close()
            raise
        if self.trackers.runs:
            from harness.storage.loggers import epoch_metrics

            self.trackers.log(int(out["epoch"]), epoch_metrics(out))
        return out

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._owns_trackers:
            self.trackers.finish(None)


class _Lines:
    """A write() target that collects the csv module's output for one atomic write."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)


def progress_summary(cell_dir: Path, running: bool) -> str:
    """``<executor> <device>, epoch n/E, val acc 0.812, ETA 3m05s`` for ``harness status``.

    The accuracy is the last validation accuracy, or the training accuracy when the recipe holds
    out no validation split. The ETA (running cells only) is the mean epoch time times the
    epochs left, less the time since the last row. A running cell whose process keeps its
    heartbeat (``live.json``, :mod:`harness.storage.live`) shows what it says instead: the epoch
    under way, its step and running loss, the ETA from the steps so far
    (``epoch 5/12, step 120/312, loss 0.412, val acc 0.812, ETA 3m10s``), or the evaluation's
    pass and batch (``evaluating: clean 3/10 batches (pass 2/7)``). Empty when the cell never
    started training and has no heartbeat.
    """
    from harness.storage.lease import lease_timeout_s
    from harness.storage.live import duration, live_parts, read_live

    cell_dir = Path(cell_dir)
    try:
        info = json.loads((cell_dir / PROGRESS_JSON).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        info = None
    live = read_live(cell_dir) if running else None
    if live is not None and live["age_s"] > lease_timeout_s():
        live = None  # left by a process that is gone: the files on disk say more
    if info is None and live is None:
        return ""
    rows = read_progress(cell_dir)
    info = info or {}
    epochs = int(info.get("epochs") or 0)
    parts = [f"{info.get('executor', '?')} {info.get('device', '?')}"] if info else []
    shown = live_parts(live) if live is not None else []
    training = bool(shown) and live.get("phase") == "train"
    if training:
        parts += shown[:-1] if shown[-1].startswith("ETA") else shown
    else:
        parts.append(f"epoch {int(rows[-1]['epoch']) if rows else 0}/{epochs}")
    if rows:
        last = rows[-1]
        if last.get("val_acc") is not None:
            parts.append(f"val acc {last['val_acc']:.3f}")
        elif last.get("train_acc") is not None:
            parts.append(f"train acc {last['train_acc']:.3f}")
    if training:
        parts += [p for p in shown if p.startswith("ETA")] or ["ETA ?"]
    elif shown:  # evaluating
        parts += shown
    elif running:
        try:
            since = time.time() - (cell_dir / PROGRESS_CSV).stat().st_mtime
        except FileNotFoundError:
            since = 0.0
        eta = eta_s(rows, epochs, since)
        parts.append("ETA ?" if eta is None else f"ETA {duration(eta)}")
    return ", ".join(parts)
