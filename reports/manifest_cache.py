"""The results folder's manifest (``suite.json``), parsed once per process while it is unchanged.

A 10,000-cell suite's manifest is about 18 MB of JSON (every cell's configuration), and a report
asks it twice: for the expected cells (:func:`reports.terminal.expected_of`) and for the suite
file beside which published values are looked for (:func:`reports.published.find_published`).
The parse is kept keyed by the file's path, size and modification time (ns), so a rewritten
manifest is read again. Callers only read the mapping; they never change it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.contract import SUITE_FILE, read_manifest
from harness.contract.done_index import file_key


@functools.lru_cache(maxsize=4)
def _parsed(folder: str, key: tuple[int, int]) -> Mapping[str, Any]:
    return read_manifest(Path(folder))


def manifest_of(results_dir: Path | str) -> Mapping[str, Any]:
    """:func:`harness.contract.read_manifest` of ``results_dir``, parsed once while the file's
    size and mtime stay the same (raises as it does: ``FileNotFoundError``, ``DamagedFile``)."""
    folder = Path(results_dir)
    key = file_key(folder / SUITE_FILE)
    if key is None:
        return read_manifest(folder)  # raises FileNotFoundError with its message
    return _parsed(str(folder.resolve()), key)
