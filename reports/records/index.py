"""Reading a results folder once (:func:`scan`), through the record index: the flattened rows of
a results folder, kept beside it, re-read per change. This is the reporter's one on-disk cache.
The scan has two views (:class:`Scan`): the reporter's :class:`Results` (:func:`load_results`)
and the documented tidy frame of :func:`harness.api.load_results`.

``load_rows(results_dir, cell_dirs)`` stats every ``<cell>/record.json``; a record whose relative
path, size and modification time (ns) match an
entry of ``.report-index.npz`` is taken from there, every other one is read, checked
(:func:`harness.contract.read_record`) and flattened (:func:`reports.records.results.record_row`).
So a report of 10,000 records of which 10 changed parses 10 JSON files; the index is then
rewritten whole (a fraction of a second at that size, simpler than keeping a delta).

The index is a cache, never a source: a NumPy ``.npz`` archive read with ``allow_pickle=False``
(no code in it can run), whose header names this format, its version and a hash of the code that
flattens records. An archive that cannot be read, names another format or code, or whose columns
disagree in length is ignored and rebuilt. Records modified within two seconds of the index's
write are stored but re-read next time (a rewrite within the file system's timestamp granularity,
with the same size, would otherwise go unseen). Invalid records are never stored: they are read,
and named, on every report.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.contract import RECORD_FILE, RecordError, read_record
from reports.records.results import Problem, Results, record_row, results_from_rows, rows_frame
from reports.records.tidy import tidy_cells

INDEX_FILE = ".report-index.npz"
FORMAT = "harness-report-index"
VERSION = 5  # 5: no delta file
_RACY_NS = 2_000_000_000  # mtimes this close to the write are re-read next time
_KEY = ("_path", "_size", "_mtime")


def file_key(path: Path | str) -> tuple[int, int] | None:
    """(size, mtime in ns) of ``path`` itself (a symlink is not followed), or None if absent:
    what says a file changed since the record index last read it."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def code_stamp() -> str:
    """Hash of the modules that decide what a row holds: another version rebuilds the index."""
    from harness.contract import record as contract_record

    here = Path(__file__).parent
    h = hashlib.sha1()
    for path in (here / "flatten.py", here / "results.py", Path(__file__),
                 Path(contract_record.__file__)):  # fmt: skip
        h.update(path.read_bytes())
    return h.hexdigest()


_NUMERIC = {"float64": "f", "int64": "i", "bool": "b"}  # dtype → the array holding its columns


def _json_array(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)


def _encode(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Columns → a few arrays (one member each of the archive: each member costs a header parse
    to read, and 160 of them were half the index's reading): the float, int and bool columns
    each stacked in one 2-D array, text as each row's code (int32, stacked) among its column's
    distinct values (one JSON list of lists), anything else as a JSON list of its own."""
    stacks: dict[str, list[np.ndarray]] = {"f": [], "i": [], "b": [], "s": []}
    uniques_of: list[list[Any]] = []
    arrays: dict[str, np.ndarray] = {}
    columns = []
    for i, name in enumerate(frame.columns):
        col = frame[name]
        dtype = str(col.dtype)
        kind = _NUMERIC.get(dtype) or ("s" if dtype == "str" else "o")
        if kind == "s":  # each distinct text once (most repeat: method, device, …), codes
            codes, uniques = pd.factorize(col)  # (-1: missing)
            stacks["s"].append(codes.astype(np.int32))
            uniques_of.append(uniques.tolist())
        elif kind != "o":
            stacks[kind].append(col.to_numpy(dtype=dtype))
        else:
            values = [None if v is pd.NA else v for v in col.tolist()]
            text = json.dumps(values, default=lambda o: o.item() if hasattr(o, "item") else str(o))
            arrays[f"o{i}"] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        columns.append([str(name), dtype, kind, len(stacks[kind]) - 1 if kind != "o" else i])
    for kind, parts in stacks.items():
        if parts:
            arrays[kind] = np.stack(parts)  # (columns × rows): each column contiguous
    arrays["u"] = _json_array(uniques_of)
    header = {"format": FORMAT, "version": VERSION, "code": code_stamp(), "columns": columns,
              "rows": len(frame), "written_ns": time.time_ns()}  # fmt: skip
    arrays["header"] = _json_array(header)
    return arrays


def _column(data: Any, stacks: dict[str, np.ndarray], uniques: list, spec: list) -> pd.Series:
    """One stored column (``spec``: its name, dtype, kind and place)."""
    _, dtype, kind, at = spec
    if kind in ("f", "i", "b"):
        if str(stacks[kind].dtype) != dtype:
            raise ValueError(f"{kind} holds {stacks[kind].dtype}, not {dtype}")
        return pd.Series(stacks[kind][at], dtype=dtype)
    if kind == "s":  # codes out of range: IndexError, not an index
        values = pd.array(uniques[at], dtype="str")
        return pd.Series(values.take(stacks["s"][at].astype(np.intp), allow_fill=True))
    return pd.Series(json.loads(bytes(data[f"o{at}"])), dtype=dtype)


def _decode(path: Path) -> pd.DataFrame | None:
    """The stored rows (less those modified too near the write to trust), or None for anything
    that is not an index this code wrote."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            if (header.get("format"), header.get("version")) != (FORMAT, VERSION):
                return None
            if header.get("code") != code_stamp():
                return None
            n = int(header["rows"])
            racy = int(header["written_ns"]) - _RACY_NS
            stacks = {k: data[k] for k in ("f", "i", "b", "s") if k in data.files}
            uniques = json.loads(bytes(data["u"]))
            columns = {}
            for spec in header["columns"]:
                values = _column(data, stacks, uniques, spec)
                if len(values) != n:
                    return None
                columns[spec[0]] = values
    except Exception:
        return None
    frame = pd.DataFrame(columns)
    if not set(_KEY) <= set(frame.columns) or frame["_path"].duplicated().any():
        return None
    return frame[frame["_mtime"].astype("int64") < racy]


def _read(cell_dir: Path, problems: list[Problem]) -> dict[str, Any] | None:
    """The record of a cell folder (read and checked, :func:`harness.contract.read_record`), or
    None with its problem (missing, invalid) noted."""
    try:
        rec = read_record(cell_dir)
        if rec is None:
            reason = "no record.json in its folder: pending, running, or killed before writing"
            problems.append(Problem(cell_dir.name, "missing", reason))
            return None
    except (OSError, ValueError, RecordError) as e:  # a DamagedRecord is a RecordError
        problems.append(Problem(cell_dir.name, "invalid", f"{type(e).__name__}: {e}"))
        return None
    return rec


def load_rows(
    results_dir: Path, cell_dirs: Sequence[Path | str], *, index: bool = True
) -> tuple[pd.DataFrame, list[Problem]]:
    """The rows of every usable record of ``cell_dirs`` in their order, and the problems; with
    ``index``, unchanged records come from :data:`INDEX_FILE` and the index is rewritten when
    anything changed (module docstring)."""
    path = results_dir / INDEX_FILE
    cached = _decode(path) if index and path.is_file() else None
    known: dict[str, tuple[int, int, int]] = {}
    if cached is not None:
        keys = zip(
            cached["_path"], cached["_size"].astype("int64"), cached["_mtime"].astype("int64")
        )
        known = {p: (int(s), int(m), i) for i, (p, s, m) in enumerate(keys)}
    problems: list[Problem] = []
    parts: list[tuple[str, Any]] = []  # ("index", position) or ("read", row), in folder order
    base = os.path.join(os.fspath(results_dir), "")
    # Records are trees (no reference cycles): the collector's passes over the ~100 objects of
    # each of 10,000 records would add a fifth to the reading, so it waits until they are read.
    enabled = gc.isenabled()
    gc.disable()
    try:
        for cell_dir in cell_dirs:
            where = os.fspath(cell_dir)  # strings: 10,000 Path operations add up
            if where.startswith(base):
                rel = f"{where[len(base) :]}/{RECORD_FILE}"
            else:
                rel = f"{Path(cell_dir).relative_to(results_dir)}/{RECORD_FILE}"
            st = file_key(os.path.join(where, RECORD_FILE))
            hit = known.get(rel)
            if hit is not None and st == hit[:2]:
                parts.append(("index", hit[2]))
                continue
            rec = _read(Path(cell_dir), problems)
            if rec is not None:
                row = record_row(rec)
                row["_path"], row["_size"], row["_mtime"] = rel, *(st or (-1, -1))
                parts.append(("read", row))
    finally:
        if enabled:
            gc.enable()
    fresh = [row for kind, row in parts if kind == "read"]
    kept = [at for kind, at in parts if kind == "index"]
    frames = [] if cached is None or not kept else [cached.iloc[kept]]
    if fresh or not frames:
        frames.append(rows_frame(fresh))
    rows = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    # Back to the folder order: ``rows`` holds the kept rows first, then the read ones.
    from_index, read = iter(range(len(kept))), iter(range(len(kept), len(kept) + len(fresh)))
    order = [next(from_index) if kind == "index" else next(read) for kind, _ in parts]
    rows = rows.iloc[order].reset_index(drop=True) if order else rows.reset_index(drop=True)
    if index and (fresh or cached is None or len(kept) != len(cached)):
        _write(path, rows)
    return rows, problems


def _write(path: Path, rows: pd.DataFrame) -> None:
    """Write the index atomically; a folder that cannot take it just goes without one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **_encode(rows))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        tmp.unlink(missing_ok=True)


#: Folders a run writes beside its cells that are not cells: the MLflow file store of
#: ``--logger mlflow`` without a tracking server (``harness.storage.trackers``).
NOT_CELLS = frozenset({"mlruns"})


def _cell_dirs(results_dir: Path, ignore: Iterable[Path]) -> list[str]:
    """The cell folders of a suite's results folder (or of each suite folder of a results root),
    each folder's in name order, as paths in text (10,000 Path objects add up); hidden folders,
    ``_``-prefixed ones and :data:`NOT_CELLS` are not cells."""
    ignore = {p.resolve() for p in ignore}

    names = {p.name for p in ignore}  # resolve only what could be ignored: one stat a folder

    def subdirs(d: Path | str) -> list[str]:
        with os.scandir(d) as entries:
            found = [
                (e.name, e.path)
                for e in entries
                if e.is_dir() and not e.name.startswith((".", "_")) and e.name not in NOT_CELLS
                and (e.name not in names or Path(e.path).resolve() not in ignore)
            ]  # fmt: skip
        return [path for _, path in sorted(found)]  # one folder: by name, as Paths compare

    if any(results_dir.glob(f"*/{RECORD_FILE}")) or not any(results_dir.glob(f"*/*/{RECORD_FILE}")):
        return subdirs(results_dir)
    return [cell for suite in subdirs(results_dir) for cell in subdirs(suite)]  # results root


@dataclass(eq=False)
class Scan:
    """One reading of a results folder's records (:func:`scan`), and the two views over it.

    - :meth:`results`: the reporter's :class:`~reports.records.results.Results` — the wide
      per-cell frame (every flattened column, ``single+TS`` as a configuration of its own), the
      per-configuration summary, the problems and provenance: what the page, ``cells.csv``, the
      terminal table and :func:`harness.api.paired` read.
    - :meth:`tidy`: the documented one-row-per-cell frame of docs/results.md
      (:func:`reports.records.tidy.tidy_cells`, selected and renamed from the wide frame, the
      configuration from each row's ``_config``): what :func:`harness.api.load_results` and
      :func:`harness.api.leaderboard` return.

    Attributes:
        source: the folder read.
        rows: the flattened rows (:func:`reports.records.results.record_row`, ``_`` columns
            included) of every usable record, in folder order.
        problems: the cells without a usable record (missing, invalid).
    """

    source: str
    rows: pd.DataFrame
    problems: list[Problem]
    _results: Results | None = field(default=None, repr=False)

    def results(self, expected: Iterable[Any] | None = None) -> Results:
        """The reporter's view; ``expected`` adds cells that have no folder at all (missing).
        Built once per scan when nothing is expected."""
        if expected is not None:
            return results_from_rows(self.rows, expected=expected, problems=list(self.problems),
                                     source=self.source)  # fmt: skip
        if self._results is None:
            self._results = results_from_rows(
                self.rows, problems=list(self.problems), source=self.source
            )
        return self._results

    def configs(self) -> dict[tuple[str, str], tuple[dict, list]]:
        """Per ``(suite, cell_id)``: the cell's config and the hyper-parameters it set away
        from their defaults (each row's ``_config`` and ``_shown``)."""
        if not len(self.rows):
            return {}
        rows = self.rows
        return {
            (str(suite), str(cid)): (json.loads(cfg), json.loads(shown))
            for suite, cid, cfg, shown in zip(
                rows["suite"], rows["cell_id"], rows["_config"], rows["_shown"], strict=True
            )
        }

    def tidy(self, *, calibrated: bool = False) -> pd.DataFrame:
        """The API's view: :func:`reports.records.tidy.tidy_cells` of :meth:`results`' cells
        (with ``calibrated``, a temperature-scaled row after each recalibrated cell)."""
        return tidy_cells(self.results().cells, self.configs(), calibrated=calibrated)


def scan(results_dir: Path | str, ignore: Iterable[Path] = (), *, index: bool = False) -> Scan:
    """Read a suite's results folder (or a folder of suite folders) once: the flattened rows of
    every usable record and the problems, for both views (:class:`Scan`). With ``index``,
    unchanged records come from ``.report-index.npz`` beside the results (module docstring).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        what = "is a file, not a results folder" if results_dir.exists() else "does not exist"
        raise FileNotFoundError(f"results folder {results_dir} {what}")
    rows, problems = load_rows(results_dir, _cell_dirs(results_dir, ignore), index=index)
    return Scan(str(results_dir), rows, problems)


def load_results(
    results_dir: Path | str,
    expected: Iterable[Any] | None = None,
    ignore: Iterable[Path] = (),
    *,
    index: bool = False,
) -> Results:
    """The reporter's view of a results folder (``scan(...).results(expected)``): its
    :class:`Results`, the page's input. Not :func:`harness.api.load_results`, which is the tidy
    view of the same scan (:meth:`Scan.tidy`).

    A cell folder without ``record.json`` is listed as missing (pending, running or killed), an
    unreadable or invalid record as invalid; ``expected`` adds cells that have no folder at all.
    With ``index``, the flattened rows are kept in ``.report-index.npz`` beside the results and
    only records whose path, size or mtime changed are read again (:mod:`reports.records.index`).
    """
    return scan(results_dir, ignore, index=index).results(expected)


def load_frame(results_dir: Path | str) -> pd.DataFrame:
    """The per-cell frame (done and failed cells) of a results folder; see :func:`load_results`."""
    return load_results(results_dir).cells
