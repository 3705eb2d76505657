"""A full file system, named: out-of-space errors (``ENOSPC``, ``EDQUOT``) turned into one line that
says which file could not be written, that the file system is full, and how much space is left.

The operating system's own message (``[Errno 28] No space left on device``) names no path, and
``torch.save`` into a file object hides it further: the writer's ``OSError`` becomes the
``__context__`` of a ``RuntimeError: [enforce fail at inline_container.cc:…] unexpected pos``
raised while the zip archive is closed. :func:`out_of_space_cause` finds the ``OSError`` under
such wrappers; the writers of this package (:func:`harness.storage.safe_files.atomic_write`,
the progress rows, the events line) raise :class:`OutOfSpace` with their own path through
:func:`naming_full_disk`; the executors read :data:`OUT_OF_SPACE` in a failed record's
``error.type`` and stop starting cells. No torch: records import it.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The errnos of a full disk and of an exceeded quota (EDQUOT is absent on some platforms).
FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e)

#: ``error.type`` of a cell that failed because its file system is full (see OutOfSpace).
OUT_OF_SPACE = "OutOfSpace"


class OutOfSpace(OSError):
    """A write failed because the file system (or the user's quota on it) is full.

    An ``OSError`` with the path as ``filename`` and the reason as ``strerror``, so that every
    handler of file-system errors prints it as ``<path>: <reason>``; build it with
    :func:`out_of_space`.
    """

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def out_of_space_cause(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` of a full disk or exceeded quota in ``exc`` or the exceptions it was
    raised from or while handling (``__cause__``, ``__context__``), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def nearest_existing(path: str | os.PathLike) -> Path:
    """``path`` or its closest ancestor that exists (the file system a new file would be on)."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer can still use on the file system of ``path`` (or of its
    nearest existing ancestor); None when the file system cannot say."""
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


def human_bytes(n: float) -> str:
    """``1536`` → ``1.5 KiB``: binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def space_left(path: str | os.PathLike) -> str:
    """``3.2 KiB free of 3.0 MiB`` for the file system of ``path``, or ``free space unknown``."""
    try:
        usage = shutil.disk_usage(nearest_existing(path))
    except OSError:
        return "free space unknown"
    return f"{human_bytes(usage.free)} free of {human_bytes(usage.total)}"


def out_of_space(path: str | os.PathLike, cause: OSError) -> OutOfSpace:
    """The :class:`OutOfSpace` for a failed write of ``path`` (not the temporary file the write
    went through): ``<path>: no space left on device: the file system is full (<free> of
    <total>)``, or ``…: disk quota exceeded`` for ``EDQUOT``."""
    if cause.errno == errno.ENOSPC:
        why = f"no space left on device: the file system is full ({space_left(path)})"
    else:
        why = f"no space left: the disk quota is exceeded ({space_left(path)} on the device)"
    return OutOfSpace(cause.errno, why, str(path))


@contextmanager
def naming_full_disk(path: str | os.PathLike) -> Iterator[None]:
    """Turn a full-disk error raised inside the block into :class:`OutOfSpace` naming ``path``
    (chained to the original, which ``--debug`` shows); any other error passes unchanged."""
    try:
        yield
    except OutOfSpace:
        raise
    except BaseException as exc:
        cause = out_of_space_cause(exc)
        if cause is None:
            raise
        raise out_of_space(path, cause) from exc


def is_out_of_space_error(error: dict | None) -> bool:
    """Whether a record's ``error`` object is a full file system's (:data:`OUT_OF_SPACE`)."""
    return bool(error) and error.get("type") == OUT_OF_SPACE
