"""File-writing helpers shared by the atomic writers (records, checkpoints): the umask-honouring
mode, and the two empty seams the crash-safety tests fill (``tests/fixtures/write_faults.py``).
No torch: records import it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from harness.storage.space import naming_full_disk


def current_umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status`` on Linux ≥ 4.7);
    elsewhere set-and-restore, which is racy only against threads creating files meanwhile."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | Path) -> None:
    """Give ``path`` the mode a plain ``open(path, "w")`` would: 0666 minus the umask.

    ``mkstemp`` creates its files 0600 whatever the umask; renamed into place they would make
    records private to their writer on a shared results folder.
    """
    os.chmod(path, 0o666 & ~current_umask())


def fault_hook(path: Path, f: IO) -> None:
    """Called inside every atomic write of ``path``, once the data is flushed to the temporary
    file ``f`` and before it is synced and renamed: a seam that does nothing here. The
    crash-safety tests replace it (``tests/fixtures/write_faults.py``, by monkeypatch or as a
    ``--plugin`` module in the processes they start) to sleep, tear the write and SIGKILL, or
    fail it as a full disk does; the package itself has no switch that fakes a fault."""


def fault_hold(path: Path) -> None:
    """Called after every atomic write of ``path`` has replaced the file: a seam that does
    nothing here (the tests hold a cell at an epoch boundary with it, see :func:`fault_hook`)."""


def atomic_write(path: Path, write: Callable[[IO], None], binary: bool = False) -> None:
    """Write ``path`` through ``write(f)`` so that readers see either the old or the new file,
    whole: a unique temporary file (``mkstemp``, so two writers never share one), fsync,
    ``os.replace``. The file gets the mode a plain ``open(path, "w")`` gives under the current
    umask. On any failure, Ctrl-C included, the temporary file is removed and ``path`` is left
    as it was; a full disk or exceeded quota raises
    :class:`harness.storage.space.OutOfSpace` naming ``path``.
    """
    with naming_full_disk(path):  # a full disk names this path, not the temporary file's
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb" if binary else "w") as f:
                write(f)
                f.flush()
                fault_hook(path, f)
                os.fsync(f.fileno())  # a full disk may only show here (NFS, delayed allocation)
            honour_umask(tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)  # the old file stays whole: never half replaced
            raise
    fault_hold(path)


def weights_file_problem(path: str | Path) -> str | None:
    """What makes ``path`` unusable as a ``torch.save`` file, from its first and last bytes only
    (cheap enough for ``harness validate``), or None when it looks whole.

    ``torch.save`` writes a zip archive (``PK``; truncation loses its central directory, at the
    end) or, before PyTorch 1.6, a pickle (protocol byte ``0x80``); safetensors files start with
    an 8-byte little-endian header length.
    """
    import zipfile

    path = Path(path).expanduser()
    if not path.exists():
        return "no such file"
    if not path.is_file():
        return "is not a regular file"
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if path.suffix == ".safetensors":
        header = int.from_bytes(head, "little") if len(head) == 8 else -1
        return None if 0 < header <= size - 8 else "is not a whole safetensors file"
    if head.startswith(b"PK"):
        if zipfile.is_zipfile(path):
            return None
        return f"is a truncated or damaged zip archive ({size} bytes, no central directory)"
    if head[:1] == b"\x80":
        return None
    shown = head[:8].decode("ascii", "replace").encode("unicode_escape").decode()
    return f"is not a PyTorch weights file (torch.save); it starts with {shown!r}"
