"""The record index: the flattened rows of a results folder, kept beside it, re-read per change.

``load_rows(results_dir, cell_dirs, index=True)`` stats every ``<cell>/record.json``; a record
whose relative path, size and modification time (ns) match an entry of ``.report-index.npz`` is
taken from there, every other one is read and checked (:func:`harness.contract.read_record`) and
flattened (:func:`reports.rows.record_row`). So a report of 10,000 records of which 10 changed
parses 10 JSON files. The rows read since the index was last written whole go to a small delta
beside it (``.report-index-delta.npz``, the same format, naming the index it extends by the time
that index was written): a report of 10 changed records writes 10 rows, not 10,000 (rewriting the
whole index was a tenth of a warm report). The index is written whole again when it has none, when
the delta would pass :data:`DELTA_MAX` rows or a tenth of the index, or when the rows' columns or
types differ from the index's (a record with a new column, say). The delta holds the rows read as
they stand among all the rows (the types of all, not of those few alone), so index and delta
decode to the rows, columns and types a whole rewrite would have stored.

The index is a cache, never a source: it is a NumPy ``.npz`` archive read with
``allow_pickle=False`` (no code in it can run), whose header names this format, its version and
a hash of the code that flattens records; an archive that cannot be read, names another format
or code, or whose columns disagree in length is ignored and rebuilt (a delta that is not for this
index, or whose columns differ from it, is ignored: its records are read again). Records modified
within two seconds of the write of the index (or delta) holding them are stored but re-read next
time (a rewrite within the file system's timestamp granularity, with the same size, would
otherwise go unseen). Invalid records are never
stored: they are read, and named, on every report.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.contract import RECORD_FILE, RecordError, fastjson, read_record
from harness.contract.done_index import file_key
from reports import forked
from reports.results import Problem
from reports.rows import record_row, rows_frame

INDEX_FILE = ".report-index.npz"
DELTA_FILE = ".report-index-delta.npz"
FORMAT = "harness-report-index"
VERSION = 4  # 2: a delta beside the index; 3: text as distinct values and codes; 4: stacked
DELTA_MAX = 2000  # rows in the delta at most (and a tenth of the index's)
_RACY_NS = 2_000_000_000  # mtimes this close to the write are re-read next time
_KEY = ("_path", "_size", "_mtime")
_CODE = ("flatten.py", "rows.py", "record_extras.py", "ood_groups.py", "record_index.py",
         "calibrated.py")  # fmt: skip


def code_stamp() -> str:
    """Hash of the modules that decide what a row holds: another version rebuilds the index."""
    from harness.contract import record as contract_record

    h = hashlib.sha1()
    here = Path(__file__).parent
    for path in [*(here / name for name in _CODE), Path(contract_record.__file__)]:
        h.update(path.read_bytes())
    return h.hexdigest()


_NUMERIC = {"float64": "f", "int64": "i", "bool": "b"}  # dtype → the array holding its columns


def _json_array(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)


def _encode(frame: pd.DataFrame, base: int | None = None) -> dict[str, np.ndarray]:
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
              "rows": len(frame), "written_ns": time.time_ns(), "base": base}  # fmt: skip
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
    return pd.Series(fastjson.loads(bytes(data[f"o{at}"])), dtype=dtype)


def _decode(path: Path, base: int | None = None) -> tuple[pd.DataFrame, int] | None:
    """(the stored rows, the time they were written), or None for anything that is not an index
    this code wrote (``base``: a delta of the index written then)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            if (header.get("format"), header.get("version")) != (FORMAT, VERSION):
                return None
            if header.get("code") != code_stamp() or header.get("base") != base:
                return None
            n = int(header["rows"])
            racy = int(header["written_ns"]) - _RACY_NS
            stacks = {k: data[k] for k in ("f", "i", "b", "s") if k in data.files}
            uniques = fastjson.loads(bytes(data["u"]))
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
    return frame[frame["_mtime"].astype("int64") < racy], int(header["written_ns"])


def _same_columns(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    return list(a.columns) == list(b.columns) and list(a.dtypes) == list(b.dtypes)


def _cached(results_dir: Path) -> tuple[pd.DataFrame, int, pd.DataFrame | None] | None:
    """(the index's rows with its delta's over them, when it was written, the delta's rows), or
    None without a usable index."""
    stored = _decode(results_dir / INDEX_FILE)
    if stored is None:
        return None
    base, written = stored
    delta_path = results_dir / DELTA_FILE
    delta = _decode(delta_path, written) if delta_path.is_file() else None
    if delta is None or not _same_columns(base, delta[0]):
        return base, written, None
    rows = pd.concat([base, delta[0]], ignore_index=True)
    return rows.drop_duplicates("_path", keep="last"), written, delta[0]


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
    results_dir: Path,
    cell_dirs: Sequence[Path | str],
    *,
    index: bool = True,
    parallel: bool = False,
) -> tuple[pd.DataFrame, list[Problem]]:
    """The rows of every usable record of ``cell_dirs`` in their order, and the problems; with
    ``parallel``, forked workers share the reading when there are many (:func:`_read_rows`)."""
    stored = _cached(results_dir) if index and (results_dir / INDEX_FILE).is_file() else None
    cached = None if stored is None else stored[0]
    known = {} if cached is None else dict(zip(cached["_path"], range(len(cached)), strict=True))
    keep, todo, order = [], [], []  # positions into cached, records to read, (source, position)
    sizes = [] if cached is None else cached["_size"].astype("int64").tolist()
    mtimes = [] if cached is None else cached["_mtime"].astype("int64").tolist()
    base = os.path.join(os.fspath(results_dir), "")
    for cell_dir in cell_dirs:
        # Strings, not Path operations: 10,000 of them were a tenth of a warm report.
        where = os.fspath(cell_dir)
        if where.startswith(base):
            rel = f"{where[len(base) :]}/{RECORD_FILE}"
        else:
            rel = str(Path(cell_dir).relative_to(results_dir) / RECORD_FILE)
        st = file_key(os.path.join(where, RECORD_FILE))
        at = known.get(rel)
        if at is not None and st is not None and st == (sizes[at], mtimes[at]):
            order.append((0, len(keep)))
            keep.append(at)
        else:
            order.append((1, len(todo)))
            todo.append((Path(cell_dir), rel, st))
    read, problems = _read_rows(todo, parallel)
    fresh = [row for row in read if row is not None]
    # Positions among the rows read that are usable (unusable ones leave the order).
    usable = np.cumsum([row is not None for row in read]) - 1 if read else []
    order = [
        (s, p if s == 0 else int(usable[p])) for s, p in order if s == 0 or read[p] is not None
    ]
    parts = [] if cached is None else [cached.iloc[keep]]
    new = rows_frame(fresh) if fresh or not parts else None
    if new is not None:
        parts.append(new)
    rows = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    rows = rows.iloc[[p if s == 0 else len(keep) + p for s, p in order]].reset_index(drop=True)
    if index and (fresh or cached is None or len(keep) != len(cached)):
        # The rows read this time as they stand in ``rows`` (its columns and types: what a
        # whole rewrite would store), not as ``new`` (the types of those rows alone).
        at = [i for i, (source, _) in enumerate(order) if source == 1]
        _store(results_dir, rows, stored, rows.iloc[at] if fresh else None)
    return rows, problems


#: Records to read before a forked worker shares the reading (below, forking costs more).
PARALLEL_MIN = 500

_ToRead = list[tuple[Path, str, "tuple[int, int] | None"]]  # (cell folder, relative path, key)


def _read_rows(todo: _ToRead, parallel: bool) -> tuple[list[dict[str, Any] | None], list[Problem]]:
    """The row of each record of ``todo`` (None where unusable) and the problems, in order; with
    ``parallel`` and 2 × :data:`PARALLEL_MIN` or more, forked workers read all but the first
    share of them while this process reads that (one share per core; :mod:`reports.forked`: a
    failed worker's share is read here)."""
    parts = min(forked.cores(), len(todo) // PARALLEL_MIN) if parallel else 1
    if parts < 2:
        return _read_chunk(todo)
    bounds = [len(todo) * i // parts for i in range(parts + 1)]
    with forked.pool(parts - 1, shared=todo) as executor:
        shares = list(pairwise(bounds))[1:]  # the first is this process's
        futures = [forked.start(executor, _read_shared, a, b) for a, b in shares]
        rows, problems = _read_chunk(todo[: bounds[1]])
        for future, (a, b) in zip(futures, shares, strict=True):
            more, more_problems = forked.collect(future, _read_chunk, todo[a:b])
            rows += more
            problems += more_problems
    return rows, problems


def _read_shared(start: int, stop: int) -> tuple[list[dict[str, Any] | None], list[Problem]]:
    """:func:`_read_chunk` in a forked worker, of the list it inherited, ``start:stop``."""
    return _read_chunk(forked.shared()[start:stop])


def _read_chunk(todo: _ToRead) -> tuple[list[dict[str, Any] | None], list[Problem]]:
    problems: list[Problem] = []
    rows: list[dict[str, Any] | None] = []
    # Records are trees (no reference cycles), and the collector's passes over the ~100 objects
    # each of 10,000 of them adds up to a fifth of the reading: it waits until they are read.
    enabled = gc.isenabled()
    gc.disable()
    try:
        for cell_dir, rel, st in todo:
            rec = _read(cell_dir, problems)
            row = None if rec is None else record_row(rec)
            if row is not None:
                row["_path"], row["_size"], row["_mtime"] = rel, *(st or (-1, -1))
            rows.append(row)
    finally:
        if enabled:
            gc.enable()
    return rows, problems


def _store(
    results_dir: Path,
    rows: pd.DataFrame,
    stored: tuple[pd.DataFrame, int, pd.DataFrame | None] | None,
    fresh: pd.DataFrame | None,
) -> None:
    """The rows read this time added to the delta, or every row written as the index (see the
    module docstring for when)."""
    if stored is not None and fresh is not None:
        merged, written, delta = stored
        frames = [fresh] if delta is None else [delta, fresh]
        new = pd.concat(frames, ignore_index=True) if len(frames) > 1 else fresh
        new = new.drop_duplicates("_path", keep="last")
        small = len(new) <= min(DELTA_MAX, len(merged) // 10)
        if small and _same_columns(merged, rows):  # (a delta has the index's: _cached)
            _write(results_dir / DELTA_FILE, new, written)
            return
    if _write(results_dir / INDEX_FILE, rows):
        (results_dir / DELTA_FILE).unlink(missing_ok=True)


def _write(path: Path, rows: pd.DataFrame, base: int | None = None) -> bool:
    """Write the index (or its delta) atomically; a folder that cannot take it just goes without
    one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **_encode(rows, base))
        os.replace(tmp, path)
        return True
    except (OSError, TypeError, ValueError):
        tmp.unlink(missing_ok=True)
        return False
