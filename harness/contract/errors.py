"""Errors the contract layer raises and every layer above catches (stdlib only)."""

from __future__ import annotations

from pathlib import Path


class DamagedFile(ValueError):
    """A file the harness reads is unusable. ``path`` is the file and ``reason`` one line saying
    what is wrong with it; ``str()`` is the line a command prints: ``<path>: <reason>``."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


class UsageError(ValueError):
    """An option a user can fix contradicts the data it is applied to (``harness report
    --reference X`` on results without a done ``X`` cell, say): the command prints ``str()`` as
    one line and exits with status 2, like any other input error."""
