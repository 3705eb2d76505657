"""A report's work spread over forked processes, where that is safe: at study scale (10,000
records) reading the records and drawing the figures are most of a cold report, and neither needs
the other's results, so on a machine with two or more free cores they run beside the tables.

Forked (not spawned) workers start in milliseconds and inherit what the parent has already built
(the records' rows, the cells frame) without pickling it: :func:`pool` hands them ``shared``
through a module global set before the fork. Only their results come back, pickled.

No fork where it is unsafe or useless (:func:`can_fork`): not POSIX, one core, another thread
alive in this process (a thread holding a lock at the fork leaves the child's copy locked
forever), or torch loaded (its thread pools are not Python's threads). Callers then do the work
here, in order; a worker that fails or dies is never trusted with the result either — the caller
redoes that part in this process (:func:`collect`), and a pool that cannot start (a fork
refused, no semaphores in a sandbox) leaves all of it here. Workers ignore Ctrl-C (the report
stops them) and are killed with the report (``PR_SET_PDEATHSIG`` on Linux): a report killed by
the OOM killer leaves none behind holding its memory. The standard library's
:class:`concurrent.futures.ProcessPoolExecutor` does the process management: with the fork start
method it forks every worker, at the first job, before starting its own manager thread.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

#: What the workers of the current :func:`pool` inherit (set in the parent before forking).
_SHARED: Any = None


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether forking workers is safe and useful here (see the module docstring)."""
    if os.environ.get("HARNESS_REPORT_SERIAL"):  # the escape hatch, and how tests compare
        return False
    if not hasattr(os, "fork") or "torch" in sys.modules or threading.active_count() != 1:
        return False
    return cores() >= 2


def shared() -> Any:
    """In a worker: the ``shared`` object its :func:`pool` was opened with."""
    return _SHARED


def _worker_setup(parent: int) -> None:
    """In each worker, first: die with the report (a report killed by the OOM killer or SIGKILL
    must not leave workers holding a copy of its memory), and leave Ctrl-C to the report, which
    stops them (their tracebacks would bury its message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: killed when the report exits
        except (OSError, AttributeError):  # no prctl: the check below still catches a dead one
            pass
    if os.getppid() != parent:  # the report died before the signal was asked for
        os._exit(1)


def _ready() -> None:
    """A job that does nothing: its answer says every worker was forked."""


@contextmanager
def pool(workers: int, shared: Any = None) -> Iterator[ProcessPoolExecutor | None]:
    """``workers`` forked processes that inherit ``shared`` (:func:`shared`), or None where
    :func:`can_fork` says no or they could not be started (no fork possible now, no semaphores:
    the caller does the work itself). Leaving the block waits for them."""
    global _SHARED
    if workers < 1 or _SHARED is not None or not can_fork():  # (one pool at a time)
        yield None
        return
    _SHARED = shared
    # The workers' garbage collections would walk every object the parent holds (the records'
    # rows), writing to each one's header and so copying every page of them: frozen, they skip.
    gc.freeze()
    executor = None
    try:
        executor = _started(workers)
        yield executor
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        _SHARED = None
        gc.unfreeze()


def _started(workers: int) -> ProcessPoolExecutor | None:
    """A pool of ``workers`` forked processes, all started; None if they could not be (a fork
    refused, no semaphores): the caller then works alone."""
    executor = None
    try:
        for stream in (sys.stdout, sys.stderr):  # buffered text would be the workers' to write too
            if stream is not None:
                stream.flush()
        executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_worker_setup,
            initargs=(os.getpid(),),
        )
        executor.submit(_ready).result()  # every worker is forked at the first job: here
        return executor
    except Exception:
        if executor is not None:
            _stop(executor)
        return None


def _stop(executor: ProcessPoolExecutor) -> None:
    """Stop a pool whose start failed part-way (its manager thread may not exist to do it)."""
    for process in list(getattr(executor, "_processes", {}).values()):
        process.kill()
        process.join()
    executor.shutdown(wait=False, cancel_futures=True)


def start(
    executor: ProcessPoolExecutor | None, fn: Callable[..., Any], *args: Any
) -> Future | None:
    """``fn(*args)`` submitted to ``executor``, or None when there is none (or it refused)."""
    if executor is None:
        return None
    try:
        return executor.submit(fn, *args)
    except Exception:  # a pool broken by a dead worker: the caller does it
        return None


def collect(future: Future | None, fn: Callable[..., Any], *args: Any) -> Any:
    """The result of ``future``; ``fn(*args)`` here instead when there is no future or its worker
    failed in any way (an exception, killed, a broken pool)."""
    if future is not None:
        try:
            return future.result()
        except Exception:  # whatever went wrong there, this process redoes it
            pass
    return fn(*args)
