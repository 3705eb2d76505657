"""The results folder's manifest (``suite.json``), parsed once per process while it is unchanged,
and what a report needs of it kept beside it.

A 10,000-cell suite's manifest is about 18 MB of JSON (every cell's configuration), and a report
asks it twice: for the expected cells (:func:`reports.terminal.expected_of`) and for the suite
file beside which published values are looked for (:func:`reports.published.find_published`).
The parse is kept keyed by the file's path, size and modification time (ns), so a rewritten
manifest is read again. Callers only read the mapping; they never change it.

Of those 18 MB a report uses the suite file's path and each expected cell's id and label (half
a MB): :func:`manifest_digest` keeps them in ``.report-manifest.json`` beside the manifest, under
its size and modification time, so the next report reads that instead (parsing the manifest was a
tenth of a report of 10 changed records among 10,000). The digest is a cache, never a source:
one that cannot be read, names another format, another manifest or holds anything but strings is
ignored and rewritten; it is written only for a manifest modified more than two seconds before
(a rewrite within the file system's timestamp granularity, with the same size, would otherwise
go unseen).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.contract import SUITE_FILE, fastjson, read_manifest
from harness.contract.done_index import file_key
from harness.contract.manifest import expected_cells

DIGEST_FILE = ".report-manifest.json"
FORMAT = "harness-report-manifest/1"
_RACY_NS = 2_000_000_000  # a manifest modified this recently is not digested


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


def _digest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    from reports.flatten import describe_config

    source = manifest.get("source")
    expected = [
        [c["cell_id"], c["label"] or describe_config(c["config"])] for c in expected_cells(manifest)
    ]
    return {"source": None if source is None else str(source), "expected": expected}


def _valid(data: Any, key: tuple[int, int]) -> bool:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return False
    if data.get("manifest") != list(key) or not isinstance(data.get("expected"), list):
        return False
    if not (data.get("source") is None or isinstance(data["source"], str)):
        return False
    return all(
        isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)
        for e in data["expected"]
    )


def manifest_digest(results_dir: Path | str, *, keep: bool = True) -> dict[str, Any]:
    """``{"source": the suite file or None, "expected": [[cell id, label], …]}`` of the
    manifest's current cells (the label: the manifest's, else the configuration described).

    With ``keep``, read from and kept in :data:`DIGEST_FILE` (module docstring). Raises as
    :func:`manifest_of`: ``FileNotFoundError`` without a manifest, ``DamagedFile``."""
    folder = Path(results_dir)
    key = file_key(folder / SUITE_FILE)
    if key is None or not keep:
        return _digest(manifest_of(folder))
    path = folder / DIGEST_FILE
    try:
        data = fastjson.loads(path.read_bytes())
        if _valid(data, key):
            return {"source": data["source"], "expected": data["expected"]}
    except (OSError, ValueError):
        pass
    digest = _digest(manifest_of(folder))
    if time.time_ns() - key[1] > _RACY_NS:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            data = {"format": FORMAT, "manifest": list(key), **digest}
            tmp.write_bytes(fastjson.dumps(data))
            os.replace(tmp, path)
        except OSError:  # a folder that cannot take it goes without
            tmp.unlink(missing_ok=True)
    return digest
