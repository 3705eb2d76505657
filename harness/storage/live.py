"""A working cell's heartbeat: ``<cell>/live.json``, what it is doing right now.

``progress.csv`` gains a row per finished epoch; an epoch of a large model takes minutes, and an
evaluation of a large test set too. While a process works on a cell (whichever executor started
it: this process, a local worker, a Slurm task), it keeps ``live.json`` up to date: the phase
(``train`` or ``evaluate``), epoch n/E, step s/S, the running loss and the ETA of training, or the
evaluation's pass and batch i/n. The file is rewritten at each epoch's start and end and
otherwise at most every :data:`HEARTBEAT_S` seconds (:data:`SLURM_HEARTBEAT_S` in a Slurm task),
atomically (a temporary file renamed over it; no fsync: a heartbeat lost in a crash is worth
nothing); a step costs one clock read. The process that starts the cell's work removes an
earlier attempt's file first and its own once the record is written: the file exists while a
process works on the cell, as ``lease.json`` does.

Readers: the executors' per-cell lines beneath the bar over cells (:mod:`harness.executors.live`)
and ``harness status`` (:func:`harness.storage.progress.progress_summary`), which take the file's
age from its modification time (on NFS the server's clock, as the lease's heartbeat).

Standard library only: ``harness status`` reads it without torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LIVE_FILE = "live.json"
#: Seconds between two heartbeats written within an epoch or an evaluation pass.
HEARTBEAT_S = 2.0
#: The same in a Slurm task, whose cell folder is on the cluster's shared file system: an array
#: of a thousand tasks renames a thousand files every this many seconds on its server.
SLURM_HEARTBEAT_S = 10.0


def heartbeat_s(executor: str) -> float:
    """Seconds between two heartbeats of a cell run by ``executor``
    (:func:`harness.storage.progress.executor_name`)."""
    return SLURM_HEARTBEAT_S if executor == "slurm" else HEARTBEAT_S


def duration(seconds: float) -> str:
    """``3m10s``, ``1h05m``: a remaining time as the progress lines show it."""
    s = round(max(seconds, 0.0))
    h, rest = divmod(s, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


class Heartbeat:
    """Writes ``live.json`` for one cell. Created by the process holding the cell's lease, which
    removes an earlier attempt's file here.

    Training calls :meth:`training` once, :meth:`begin_epoch` and :meth:`end_epoch` around each
    epoch, and hands the heartbeat to the training loop as a progress bar: :meth:`update` (one
    step) and :meth:`set_postfix` (``loss=``) are the calls it makes. The evaluation calls
    :meth:`evaluating` per pass and per batch.

    Args:
        cell_dir: the cell's folder.
        every_s: seconds between two writes within an epoch or a pass.
        clock: a monotonic clock (for the ETA and the write interval).
    """

    def __init__(
        self,
        cell_dir: Path,
        every_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(cell_dir) / LIVE_FILE
        self.every_s = every_s
        self._clock = clock
        self._last = -float("inf")
        self.state: dict[str, Any] = {"phase": "setup"}
        self.epochs = self.steps = self.epoch = self.step = 0
        self.loss: float | None = None
        self._t0, self._first = clock(), 0  # when, and at which global step, training started
        self.finish()  # an earlier attempt's: never shown as this one's

    def training(self, start_epoch: int, epochs: int, steps: int) -> None:
        """Training starts after ``start_epoch`` finished epochs, of ``epochs`` of ``steps``."""
        self.epochs, self.steps, self.epoch = epochs, steps, start_epoch
        self._t0, self._first = self._clock(), start_epoch * steps

    def begin_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` (0-based) starts: written now."""
        self.epoch, self.step, self.loss = epoch, 0, None
        self._write(self._training_state())

    def update(self, n: int = 1) -> None:
        """``n`` more training steps (the training loop's bar call): written when
        :attr:`every_s` has passed since the last write."""
        self.step += n
        if self._clock() - self._last >= self.every_s:
            self._write(self._training_state())

    def set_postfix(self, loss: Any = None, **_: Any) -> None:
        """The running loss (the training loop's bar call, at each host read of its losses)."""
        if loss is not None:
            with contextlib.suppress(TypeError, ValueError):
                self.loss = float(loss)

    def end_epoch(self, loss: float | None = None) -> None:
        """The epoch's steps are over (``loss``: its mean): written now."""
        self.step = self.steps
        if loss is not None:
            self.loss = float(loss)
        self._write(self._training_state())

    def evaluating(
        self, label: str, batch: int, batches: int | None, done: int, total: int
    ) -> None:
        """The evaluation is in pass ``label`` (``done`` of ``total`` passes over), ``batch``
        batches of ``batches`` (None: unknown) into it; written when :attr:`every_s` has passed,
        and at once when the evaluation starts."""
        state = {"phase": "evaluate", "pass": label, "batch": batch, "batches": batches,
                 "passes_done": done, "passes": total}  # fmt: skip
        if self.state.get("phase") != "evaluate" or self._clock() - self._last >= self.every_s:
            self._write(state)
        else:
            self.state = state  # the latest, for the next write

    def finish(self) -> None:
        """The record is written: the file goes (nothing works on the cell any more)."""
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)

    def _training_state(self) -> dict[str, Any]:
        done = self.epoch * self.steps + self.step - self._first
        left = self.epochs * self.steps - (self.epoch * self.steps + self.step)
        eta = (self._clock() - self._t0) / done * left if done > 0 else None
        return {"phase": "train", "epoch": self.epoch + 1, "epochs": self.epochs,
                "step": self.step, "steps": self.steps, "loss": self.loss,
                "eta_s": eta}  # fmt: skip

    def _write(self, state: dict[str, Any]) -> None:
        """Replace the file (never half written); a failure to write is not the cell's: the
        next heartbeat tries again, the files that matter (progress.csv, the checkpoint) say
        when the disk is full."""
        self.state, self._last = state, self._clock()
        tmp = self.path.with_name(f".{LIVE_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def read_live(cell_dir: Path) -> dict[str, Any] | None:
    """The cell's heartbeat with ``age_s`` (seconds since it was written) added; None without
    one (no process works on the cell, or it has not written yet) or when unreadable."""
    path = Path(cell_dir) / LIVE_FILE
    try:
        text, age = path.read_text(), time.time() - path.stat().st_mtime
        state = json.loads(text)
    except (OSError, ValueError):
        return None
    return {**state, "age_s": max(age, 0.0)} if isinstance(state, dict) else None


def live_parts(state: dict[str, Any]) -> list[str]:
    """What a heartbeat says, in parts: ``["epoch 5/12", "step 120/312", "loss 0.412",
    "ETA 3m10s"]`` while training (the ETA less the heartbeat's age), ``["evaluating: clean
    3/10 batches (pass 1/7)"]`` while evaluating, ``[]`` otherwise."""
    if state.get("phase") == "train":
        parts = [f"epoch {state.get('epoch', '?')}/{state.get('epochs', '?')}",
                 f"step {state.get('step', '?')}/{state.get('steps', '?')}"]  # fmt: skip
        if isinstance(state.get("loss"), int | float):
            parts.append(f"loss {state['loss']:.3f}")
        eta = state.get("eta_s")
        if isinstance(eta, int | float):
            parts.append(f"ETA {duration(eta - state.get('age_s', 0.0))}")
        return parts
    if state.get("phase") == "evaluate":
        batches, total = state.get("batches"), state.get("passes")
        of = f"/{batches}" if batches else ""
        text = f"evaluating: {state.get('pass') or 'metrics'} {state.get('batch', 0)}{of} batches"
        if total:
            text += f" (pass {min(state.get('passes_done', 0) + 1, total)}/{total})"
        return [text]
    return []
