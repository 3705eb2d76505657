"""The user's cache: answers that cost seconds to compute and change only with the installation
(the ``harness ls`` listing, which corruption transforms this machine can build).

Each kind of answer is one JSON or text file under :func:`cache_root` ``/<kind>/``, named by a
digest of everything it was computed from; a changed input gives a new name, so a stale answer
is never read, and the file of the old key is removed when the new one is written. A cache that
cannot be read or written is skipped (the answer is computed), never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.contract.env import CACHE_DIR

#: ``$HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``)/implicit-ensemble-harness.
CACHE_ENV = CACHE_DIR.name


def cache_root() -> Path:
    """The folder holding every kind of cached answer."""
    if (folder := CACHE_DIR.read(None)) is not None:
        return folder
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "implicit-ensemble-harness"


def digest(parts: Any) -> str:
    """A short stable digest of JSON-able ``parts`` (the inputs of an answer)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def read_text(kind: str, key: str, suffix: str = ".txt") -> str | None:
    """The cached answer of ``kind`` for ``key``, or None."""
    try:
        return (cache_root() / kind / f"{key}{suffix}").read_text()
    except (OSError, UnicodeDecodeError):
        return None


def store_text(kind: str, key: str, text: str, suffix: str = ".txt") -> None:
    """Keep ``text`` as the only cached answer of ``kind`` (other keys' files are removed)."""
    from harness.storage.safe_files import atomic_write

    path = cache_root() / kind / f"{key}{suffix}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob(f"*{suffix}"):
            if old != path:
                old.unlink(missing_ok=True)
        atomic_write(path, lambda f: f.write(text))
    except OSError:  # a read-only home: answer without a cache
        pass


def cached_json(kind: str, parts: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``'s JSON-able answer, read from the cache when ``parts`` are unchanged."""
    key = digest(parts)
    text = read_text(kind, key, ".json")
    if text is not None:
        try:
            return json.loads(text)
        except ValueError:  # a damaged file: computed again and replaced
            pass
    answer = compute()
    store_text(kind, key, json.dumps(answer, sort_keys=True), ".json")
    return answer
