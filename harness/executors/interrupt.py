"""Stopping worker-process executors: Ctrl-C and SIGTERM stop a run at a safe point, and a
worker never outlives its parent.

A worker of a ``ProcessPoolExecutor`` that raises ``KeyboardInterrupt`` inside a call reports it
and then takes the next call already queued to it, so a plain pool keeps starting cells after
Ctrl-C until it drains. Here a worker's first SIGINT or SIGTERM raises ``KeyboardInterrupt`` in
its running cell (the cell stops where it is: every file is written atomically and its temporary
file removed, the lease is released, the epoch checkpoints stay for the next run) and marks the
worker as stopping, so any queued cell refuses to start; later signals (the terminal's, the
process group's and the parent's all arrive) are ignored so that they cannot interrupt that
cleanup. The parent treats SIGTERM (what ``kill``, ``timeout``, Slurm and systemd send) as
SIGINT: it cancels what is still queued, forwards SIGINT to workers that did not get the signal
(``kill`` of the parent alone), kills the ones that do not stop in time, and raises
:class:`Terminated` (a ``KeyboardInterrupt``) where SIGINT raises ``KeyboardInterrupt``.

A worker whose parent dies (SIGKILL, a crash) stops too: on Linux the kernel sends it SIGTERM at
once (``prctl(PR_SET_PDEATHSIG)``), and everywhere a thread notices ``os.getppid()`` change. A
worker in a cell then stops it as above and exits instead of reporting to nobody (a pool worker
would wait forever on a pipe it holds both ends of); an idle one exits at once; one still running
after :data:`STOP_GRACE_S` is ended outright: atomic writes keep every file whole, and the lease
of a dead process on this host is stale at once (harness.storage.lease), so the next run takes
its cell over from the last epoch checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

STOP_GRACE_S = 20.0  # a cell reaches its safe point in well under a second; this is a backstop
PARENT_POLL_S = 0.25  # how often a worker looks for its parent where the kernel cannot tell it
#: The stop signals: SIGINT (Ctrl-C) and SIGTERM (kill, timeout, Slurm, systemd), treated alike.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_stopping = False  # a stop signal arrived: the running cell was interrupted, none starts
_in_cell = False  # this worker is running a cell (a lease held, files being written)
_parent_pid: int | None = None  # the executor's process, in a worker that watches it


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the run: raised where SIGINT raises ``KeyboardInterrupt`` (so whatever
    handles Ctrl-C handles it too); ``signum`` gives the conventional exit status, 128 + 15."""

    signum = int(signal.SIGTERM)


def interruption(signum: int) -> KeyboardInterrupt:
    """The exception that stops a run on signal ``signum``."""
    if signum == signal.SIGTERM:
        return Terminated("terminated (SIGTERM)")
    return KeyboardInterrupt()


def _on_stop_signal(signum: int, frame: Any) -> None:
    global _stopping
    if _stopping:
        return
    _stopping = True
    if _in_cell:
        raise interruption(signum)
    if parent_gone():  # idle, and no one left to hand it a cell or to read a result
        os._exit(128 + signum)
    # Idle under a live parent: it stops this worker through the pool, and a cell queued to
    # us meanwhile refuses to start (check_not_stopping).


def install_worker_handler() -> None:
    """Pool initializer: SIGINT or SIGTERM interrupts the running cell once, then marks the
    worker stopping; the worker stops when its parent dies (module docstring)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    parent = mp.parent_process()
    if parent is not None and parent.pid:
        follow_parent(parent.pid)


def follow_parent(pid: int) -> None:
    """Stop this process when process ``pid``, its parent, is gone."""
    global _parent_pid
    _parent_pid = pid
    _signal_on_parent_death(signal.SIGTERM)
    threading.Thread(target=_watch_parent, daemon=True, name="parent-watch").start()


def _signal_on_parent_death(signum: int) -> None:
    """Linux: have the kernel send ``signum`` the moment the parent exits. Strictly, when the
    parent's thread that started this process exits: the executor's thread, which outlives its
    pools. Elsewhere (or refused) the watcher thread alone notices, within PARENT_POLL_S."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # no libc or no prctl: the watcher
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def parent_gone() -> bool:
    """Whether this worker's parent has died (it was re-parented: init or a subreaper)."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def _watch_parent() -> None:
    while not parent_gone():
        time.sleep(PARENT_POLL_S)
    if not _in_cell:
        os._exit(128 + signal.SIGTERM)  # nothing held, nothing being written
    # The main thread stops the cell at its next bytecode (as after SIGTERM; ignored if the
    # kernel's signal got there first) and exits from running_cell; this is the backstop.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os._exit(128 + signal.SIGTERM)


def check_not_stopping() -> None:
    """Raise KeyboardInterrupt in a worker that was interrupted: no new cell starts."""
    if _stopping:
        raise KeyboardInterrupt("interrupted: no new cell starts")


@contextlib.contextmanager
def running_cell() -> Iterator[None]:
    """A worker's cell runs inside: a stop signal interrupts it only here (an idle worker has
    nothing to clean up), none starts after one, and a worker whose parent died while the cell
    ran exits once the cell has stopped instead of reporting to nobody."""
    global _in_cell
    _in_cell = True
    try:
        check_not_stopping()
        yield
    finally:
        _in_cell = False
        if parent_gone():
            os._exit(128 + signal.SIGTERM)


class StopRequest(threading.Event):
    """Set by a stop signal in the parent; ``signum`` is the first one that arrived."""

    signum: int | None = None

    def interruption(self) -> KeyboardInterrupt:
        """The exception to stop the run with (:class:`Terminated` after SIGTERM)."""
        return interruption(self.signum or signal.SIGINT)


@contextlib.contextmanager
def deferred_stop() -> Iterator[StopRequest]:
    """In the parent: SIGINT and SIGTERM set the yielded event instead of stopping the process
    wherever the main thread happens to be, and the caller checks it at a safe point.

    A ``KeyboardInterrupt`` raised inside ``concurrent.futures.wait`` can land between acquiring
    a future's condition lock and the ``try`` that releases it; the pool's manager thread then
    blocks on that lock for good and the interpreter hangs at exit joining it (a loaded CI
    machine saw the parent neither exit nor print for 60 s after ``kill -INT``). SIGTERM's
    default action ends the parent at once, leaving its workers to train on. Outside the main
    thread (where handlers cannot be installed) this yields an event nothing sets.
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum: int, frame: Any) -> None:
        stop.signum = stop.signum or signum
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: installed outside Python, cannot be restored
                signal.signal(sig, handler)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """In a process that runs cells itself: SIGTERM raises :class:`Terminated` where SIGINT
    raises ``KeyboardInterrupt``, so the cell stops as on Ctrl-C (lease released, temporary
    files removed) instead of the process vanishing mid-write. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        raise interruption(signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def stop_pool(
    pool: ProcessPoolExecutor | Sequence[ProcessPoolExecutor], grace_s: float = STOP_GRACE_S
) -> None:
    """Cancel queued cells, interrupt running ones, wait up to ``grace_s``, then kill.

    ``pool`` may be several pools (the local executor keeps one per worker slot): all are
    interrupted first, then waited for within one grace period.

    Uses the pool's process table (``_processes``, stable since Python 3.3): the public API can
    cancel queued calls but neither interrupt nor kill running ones.
    """
    pools = [pool] if isinstance(pool, ProcessPoolExecutor) else list(pool)
    procs = [p for one in pools for p in (getattr(one, "_processes", None) or {}).values()]
    for one in pools:
        one.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive() and p.pid:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()  # stuck past the grace period: atomic writes keep every file whole
            p.join(5)


def kill_pool(pools: Sequence[ProcessPoolExecutor]) -> None:
    """Cancel queued cells and kill every worker at once: for workers that never ran a cell
    (nothing to stop at a safe point) and that a signal would only make print a traceback."""
    procs = [p for one in pools for p in (getattr(one, "_processes", None) or {}).values()]
    for one in pools:
        one.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
