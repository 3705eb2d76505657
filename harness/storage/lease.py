"""Per-cell leases: a cell is trained by at most one process at a time, wherever it runs.

The cell runner takes the lease, so it holds for every executor (in-process, local workers, Slurm
array tasks) and for any mix of them sharing a results folder, e.g. a local re-run while the
Slurm array is still going, or the same array submitted twice.

Primitive: the lease is the file ``<cell>/lease.json``, created with ``open(O_CREAT | O_EXCL)``,
holding its owner ``{host, pid, slurm_job_id, started, token}``. Exclusive create is atomic on
local file systems, on NFSv3/v4 (the client sends an exclusive CREATE that the server decides)
and on Lustre and GPFS, which is why it is the classic lock-file primitive of mail spools on NFS.
``flock``/``fcntl`` locks are not used: depending on the NFS version, mount options (``nolock``,
``local_lock``) and Lustre's ``flock``/``localflock`` settings they are silently node-local or
unsupported, so two nodes could both "hold" the lock.

Liveness: a thread refreshes the file's mtime every ``HEARTBEAT_S`` while the owner runs.
A lease is stale, and taken over, when its owner is gone: on the same host, its pid no longer
exists; from any host, its heartbeat is older than ``$HARNESS_LEASE_TIMEOUT_S`` (default 600 s,
far above NFS attribute caching and NTP-level clock skew; the age is the reader's clock minus
the mtime, which on NFS is the server's time).
Two processes that both find a stale lease serialise the takeover through a second exclusive
file (``lease.json.break``): only the one holding it removes the stale lease, after checking it
is still the same (same token), so a fresh lease is never broken by a slow competitor.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.env import LEASE_HEARTBEAT_S, LEASE_TIMEOUT_S
from harness.storage.space import naming_full_disk

LEASE_FILE = "lease.json"
BREAK_SUFFIX = ".break"
HEARTBEAT_S = LEASE_HEARTBEAT_S  # $HARNESS_LEASE_TIMEOUT_S must be above it (contract.env)
DEFAULT_TIMEOUT_S = 600.0
BREAK_STALE_S = 60.0  # a breaker file is held for milliseconds; older means its holder died


def lease_timeout_s() -> float:
    """Heartbeat age after which a lease from another host counts as abandoned."""
    return LEASE_TIMEOUT_S.read(DEFAULT_TIMEOUT_S)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def describe(owner: dict[str, Any]) -> str:
    """``host:pid (job N)`` for messages and ``harness status``."""
    job = f" (job {owner['slurm_job_id']})" if owner.get("slurm_job_id") else ""
    return f"{owner.get('host', '?')}:{owner.get('pid', '?')}{job}"


def read_owner(cell_dir: Path) -> dict[str, Any] | None:
    """The lease's owner, with ``heartbeat_age_s`` added; None when the cell is not leased."""
    path = Path(cell_dir) / LEASE_FILE
    try:
        text, age = path.read_text(), time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:  # created but not yet written: a lease being taken right now
        owner = {}
    return {**owner, "heartbeat_age_s": age}


def is_stale(owner: dict[str, Any]) -> bool:
    """Whether the lease's owner is gone (see the module docstring)."""
    if not owner.get("host"):  # empty file: its creator died between create and write
        return owner["heartbeat_age_s"] > BREAK_STALE_S
    if owner["heartbeat_age_s"] > lease_timeout_s():
        return True  # from any host; on this one it also covers a pid reused by another process
    if owner["host"] == socket.gethostname() and isinstance(owner.get("pid"), int):
        return not pid_alive(owner["pid"])
    return False


class LeaseHeld(RuntimeError):
    """Another live process holds the cell's lease."""

    def __init__(self, owner: dict[str, Any]) -> None:
        super().__init__(f"leased by {describe(owner)}")
        self.owner = owner


@dataclass
class Lease:
    """A held lease; release it with :meth:`release` (or use it as a context manager)."""

    path: Path
    owner: dict[str, Any]
    _stop: threading.Event
    _thread: threading.Thread

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file, if it is still ours."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            if json.loads(self.path.read_text()).get("token") == self.owner["token"]:
                self.path.unlink()
        except (FileNotFoundError, json.JSONDecodeError):
            pass

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _heartbeat(path: Path, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            os.utime(path)  # times=None: NFS sets the server's time, no client clock involved
        except FileNotFoundError:
            return  # broken by someone who judged us dead: nothing left to refresh


def _create(path: Path, owner: dict[str, Any]) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        return False
    try:
        with naming_full_disk(path), os.fdopen(fd, "w") as f:
            json.dump(owner, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)  # an empty lease of ours would hold the cell for a while
        raise
    return True


def _break_stale(path: Path, seen: dict[str, Any]) -> None:
    """Remove the stale lease ``seen`` unless someone else is doing it or has replaced it."""
    breaker = path.with_name(path.name + BREAK_SUFFIX)
    try:
        fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        try:
            if time.time() - breaker.stat().st_mtime > BREAK_STALE_S:
                breaker.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        return
    os.close(fd)
    try:
        now = read_owner(path.parent)
        if now is not None and now.get("token") == seen.get("token") and is_stale(now):
            path.unlink(missing_ok=True)
    finally:
        breaker.unlink(missing_ok=True)


def acquire(cell_dir: Path, heartbeat_s: float = HEARTBEAT_S, attempts: int = 5) -> Lease:
    """Take the cell's lease, taking over a stale one.

    Raises:
        LeaseHeld: a live process holds it (its owner is on the exception).
    """
    cell_dir = Path(cell_dir)
    cell_dir.mkdir(parents=True, exist_ok=True)
    path = cell_dir / LEASE_FILE
    owner = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": slurm_job_id(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "token": uuid.uuid4().hex,
    }
    for _ in range(attempts):
        if _create(path, owner):
            stop = threading.Event()
            thread = threading.Thread(
                target=_heartbeat, args=(path, stop, heartbeat_s), daemon=True, name="lease"
            )
            thread.start()
            return Lease(path, owner, stop, thread)
        seen = read_owner(cell_dir)
        if seen is None:
            continue  # released between our create and our read: try again
        if not is_stale(seen):
            raise LeaseHeld(seen)
        _break_stale(path, seen)
        time.sleep(0.05)
    seen = read_owner(cell_dir) or {}
    raise LeaseHeld(seen)


def slurm_job_id() -> str | None:
    """``ARRAY_TASK`` form inside an array task, the job id in a plain job, None outside."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def live_leases(results_dir: Path) -> dict[str, dict[str, Any]]:
    """cell id → owner of every lease under a results folder whose owner is not gone."""
    out = {}
    for path in sorted(Path(results_dir).glob(f"*/{LEASE_FILE}")):
        owner = read_owner(path.parent)
        if owner is not None and not is_stale(owner):
            out[path.parent.name] = owner
    return out
