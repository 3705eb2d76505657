"""Ctrl-C for worker-process executors: no new cell starts, running cells stop at a safe point.

A worker of a ``ProcessPoolExecutor`` that raises ``KeyboardInterrupt`` inside a call reports it
and then takes the next call already queued to it, so a plain pool keeps starting cells after
Ctrl-C until it drains. Here a worker's first SIGINT raises ``KeyboardInterrupt`` (the cell stops
where it is: every file is written atomically and its temporary file removed, the lease is
released) and marks the worker as stopping, so any queued cell refuses to start; later SIGINTs
(the terminal's and the parent's both arrive) are ignored so that they cannot interrupt that
cleanup. The parent cancels what is still queued, forwards SIGINT to workers that did not get
the terminal's (``kill -INT`` of the parent alone), and kills the ones that do not stop in time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

STOP_GRACE_S = 20.0  # a cell reaches its safe point in well under a second; this is a backstop

_stopping = False


def _on_sigint(signum: int, frame: Any) -> None:
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise KeyboardInterrupt


def install_worker_handler() -> None:
    """Pool initializer: SIGINT raises KeyboardInterrupt once, then marks the worker stopping."""
    signal.signal(signal.SIGINT, _on_sigint)


def check_not_stopping() -> None:
    """Raise KeyboardInterrupt in a worker that was interrupted: no new cell starts."""
    if _stopping:
        raise KeyboardInterrupt("interrupted: no new cell starts")


@contextlib.contextmanager
def deferred_sigint() -> Iterator[threading.Event]:
    """In the parent: SIGINT sets the yielded event instead of raising ``KeyboardInterrupt``
    wherever the main thread happens to be, and the caller checks it at a safe point.

    A ``KeyboardInterrupt`` raised inside ``concurrent.futures.wait`` can land between acquiring
    a future's condition lock and the ``try`` that releases it; the pool's manager thread then
    blocks on that lock for good and the interpreter hangs at exit joining it (a loaded CI
    machine saw the parent neither exit nor print for 60 s after ``kill -INT``). Outside the
    main thread (where handlers cannot be installed) this yields an event nothing sets.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


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
