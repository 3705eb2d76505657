"""The per-image outcomes file beside a record (``outcomes.npz``): its name and fields, the one
definition the engine (which writes it, :mod:`harness.metrics.outcomes`) and the reporter (which
reads it, :mod:`reports.records.outcomes`) share, and the check both read it through.

NumPy's compressed archive (``.npz``) of plain arrays, no pickled objects, one value per test
image in the split's order; the raw ensemble mean's arrays under their field names, the
pool-then-calibrate prediction's under ``ts/<field>`` (``correct`` only once: a temperature does
not change the top label). 10,000 test images take about 220 KB (float32 noise does not
compress).

:func:`check_outcomes` tells an absent file (a record from before outcomes were kept: None) from
a damaged one (:class:`DamagedOutcomes`: truncated, not an archive, a field missing, of another
dtype or shape, or a length other than the record's test set). It reads the archive with the
standard library alone (``zipfile`` and the ``.npy`` header, a Python literal), because this
layer imports no third-party package; the NumPy readers on top of it are
:func:`harness.metrics.outcomes.read_outcomes` (engine) and
:func:`reports.records.outcomes.read_outcomes` (reporter).
"""

from __future__ import annotations

import ast
import io
import math
import struct
import sys
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.errors import DamagedFile

#: The file beside ``record.json``.
OUTCOMES_FILE = "outcomes.npz"

#: The per-image quantities of one view and their NumPy dtypes: ``correct`` (argmax of p̄ equals
#: the label), ``nll`` (−log max(p̄[y], 1e-12), nats), ``brier`` (Σ_k (p̄_k − 1[k = y])²),
#: ``confidence`` (max_k p̄_k).
FIELDS = {"correct": "bool", "nll": "float32", "brier": "float32", "confidence": "float32"}

#: The calibrated view's fields: every field but ``correct``, under ``ts/``; a file has all of
#: them or none (a cell evaluated without post-hoc calibration).
TS_FIELDS = tuple(f"ts/{k}" for k in FIELDS if k != "correct")

#: A dtype name of :data:`FIELDS` → the ``descr`` strings a ``.npy`` header gives it (either
#: byte order: NumPy writes the machine's own).
_DESCR = {"bool": ("|b1",), "float32": ("<f4", ">f4")}
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


class DamagedOutcomes(DamagedFile):
    """An ``outcomes.npz`` that is there but unusable; ``str()`` is ``<path>: <reason>``, the
    reason ending with how to write it again."""

    def __init__(self, path: str | Path, reason: str) -> None:
        where = Path(path).parent.parent
        super().__init__(
            path,
            f"{reason}; `harness evaluate {where} --add-only` writes it again from the cell's "
            "weights",
        )


@dataclass(frozen=True)
class OutcomesFile:
    """A checked ``outcomes.npz``: ``data`` its bytes (read once; decode them with
    ``numpy.load(io.BytesIO(data), allow_pickle=False)``), ``n_images`` the length N of every
    array and ``fields`` their names (``"correct"``, ``"ts/nll"`` …)."""

    path: Path
    data: bytes
    n_images: int
    fields: tuple[str, ...]


def record_image_count(record: Mapping[str, Any]) -> int | None:
    """The number of test images a record's clean metrics were computed on: the sum of its
    15 reliability bins' counts (``metrics.clean.reliability.count``, every test image falls in
    one bin); None when the record does not say (an older record, a failed cell)."""
    try:
        counts = record["metrics"]["clean"]["reliability"]["count"]
    except (KeyError, TypeError):
        return None
    if not isinstance(counts, list) or not counts:
        return None
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return None
    total = sum(counts)
    return total or None  # a done cell scored at least one image: 0 says nothing


def _npy_header(blob: bytes) -> dict[str, Any]:
    """The header dict of a ``.npy`` member (``descr``, ``fortran_order``, ``shape``), checked
    against the length of its data; ValueError naming what is wrong."""
    if not blob.startswith(_NPY_MAGIC) or len(blob) < 10:
        raise ValueError("not a .npy array")
    major = blob[6]
    if major == 1:
        (size,), start = struct.unpack("<H", blob[8:10]), 10
    elif major in (2, 3):
        (size,), start = struct.unpack("<I", blob[8:12]), 12
    else:
        raise ValueError(f".npy format version {major} unknown")
    text = blob[start : start + size].decode("utf-8" if major == 3 else "latin-1")
    header = ast.literal_eval(text)  # a dict of literals, as numpy.lib.format reads it
    if not isinstance(header, dict) or not {"descr", "shape"} <= set(header):
        raise ValueError("its .npy header names no dtype or shape")
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"its .npy header gives the shape {shape!r}")
    descr = header["descr"]
    itemsize = int(descr[2:]) if isinstance(descr, str) and descr[2:].isdigit() else None
    count = 1
    for n in shape:
        count *= n
    if itemsize is not None and len(blob) - start - size != count * itemsize:
        raise ValueError(f"holds {len(blob) - start - size} data bytes for shape {shape}")
    return header


def _members(
    path: Path, data: bytes, blobs: dict[str, bytes] | None = None
) -> dict[str, dict[str, Any]]:
    """Field name → ``.npy`` header of every member of the archive ``data``; each member is read
    whole (its CRC checked), and kept in ``blobs`` when given. DamagedOutcomes when the bytes
    are not a sound archive of arrays."""
    if not data:
        raise DamagedOutcomes(path, "empty file (0 bytes)")
    if not data.startswith(_ZIP_MAGIC):
        raise DamagedOutcomes(path, f"not a NumPy .npz archive (no zip header; {len(data)} bytes)")
    headers: dict[str, dict[str, Any]] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if not name.endswith(".npy"):
                    raise DamagedOutcomes(path, f"member {name!r} is not an array (.npy)")
                try:
                    blob = archive.read(name)
                    headers[name.removesuffix(".npy")] = _npy_header(blob)
                    if blobs is not None:
                        blobs[name.removesuffix(".npy")] = blob
                except (
                    ValueError,
                    TypeError,
                    SyntaxError,
                    RecursionError,
                    MemoryError,
                    struct.error,
                ) as exc:
                    raise DamagedOutcomes(path, f"field {name[:-4]!r}: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise DamagedOutcomes(
            path, f"truncated or corrupt .npz archive ({len(data)} bytes: {exc})"
        ) from None
    return headers


def _problem(headers: Mapping[str, Mapping[str, Any]]) -> str | None:
    """What makes an archive's fields (name → ``.npy`` header) not an outcomes file, or None."""
    missing = [k for k in FIELDS if k not in headers]
    ts = [k for k in headers if k.startswith("ts/")]
    if ts:
        missing += [k for k in TS_FIELDS if k not in headers]
    if missing:
        return f"lacks the field(s) {', '.join(missing)}"
    lengths: dict[str, int] = {}
    for name, header in headers.items():
        shape, descr = header["shape"], header["descr"]
        if len(shape) != 1:
            return f"field {name!r} has the shape {shape}, not one value per image (N,)"
        dtype = FIELDS.get(name.removeprefix("ts/"))
        if dtype is not None and descr not in _DESCR[dtype]:
            return f"field {name!r} has the dtype {descr!r}, not {dtype}"
        lengths[name] = shape[0]
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{k} {n}" for k, n in lengths.items())
        return f"fields of unequal length ({listed}), not one value per test image each"
    if lengths["correct"] == 0:
        return "holds no images"
    return None


#: Each field's range (``nll`` is at most −log 1e-12, the clamp it is computed with; a Brier
#: score of K classes is at most 2), with a rounding margin.
_RANGES = {"correct": (0.0, 1.0), "nll": (0.0, 27.7), "brier": (0.0, 2.0), "confidence": (0.0, 1.0)}

#: How far a field's mean may be from the record's metric (the record's accuracy is rounded to
#: 4 decimals; NLL and Brier are float32 means against float64 ones) and still be its file.
_MEAN_TOL = {"acc": 5.1e-5, "nll": 1e-4, "brier": 1e-4}


def _values(blob: bytes, header: Mapping[str, Any]) -> list[float]:
    """The values of a checked 1-D ``.npy`` member (bool or float32), as Python floats.

    The standard library's ``array`` reads them: the contract layer imports no NumPy."""
    import array

    data = blob[len(blob) - header["shape"][0] * int(header["descr"][2:]) :]
    if header["descr"] == "|b1":
        return [float(b != 0) for b in data]
    values = array.array("f")
    values.frombytes(data)
    if (header["descr"][0] == ">") == (sys.byteorder == "little"):
        values.byteswap()
    return list(values)


def _value_problem(
    headers: Mapping[str, Mapping[str, Any]],
    blobs: Mapping[str, bytes],
    record: Mapping[str, Any] | None,
) -> str | None:
    """What makes well-formed outcomes untrue, or None: a value that is not finite or outside
    its field's range, or a mean that is not the record's metric (a file of another cell or
    run, or edited by hand) — the raw view against ``metrics.clean``, the ``ts/`` view against
    ``metrics.calibration.ts.clean``."""
    metrics = (record or {}).get("metrics") or {}
    calibrated = ((metrics.get("calibration") or {}).get("ts") or {}).get("clean") or {}
    views = {"": metrics.get("clean") or {}, "ts/": calibrated}
    for name, header in headers.items():
        values = _values(blobs[name], header)
        if not all(map(math.isfinite, values)):
            bad = sum(1 for v in values if not math.isfinite(v))
            return f"field {name!r} holds {bad} NaN or infinite values"
        base = name.removeprefix("ts/")
        lo, hi = _RANGES.get(base, (-math.inf, math.inf))
        if min(values) < lo - 1e-6 or max(values) > hi + 1e-6:
            return (f"field {name!r} holds values in [{min(values):.4g}, {max(values):.4g}], "
                    f"outside [{lo:g}, {hi:g}]")  # fmt: skip
        metric = {"correct": "acc", "nll": "nll", "brier": "brier"}.get(base)
        recorded = views["ts/" if name.startswith("ts/") else ""].get(metric or "")
        if metric and isinstance(recorded, int | float) and math.isfinite(recorded):
            mean = math.fsum(values) / len(values)
            tol = _MEAN_TOL[metric] * (1.0 if metric == "acc" else max(1.0, abs(recorded)))
            if abs(mean - recorded) > tol:
                where = "calibration.ts.clean" if name.startswith("ts/") else "clean"
                return (f"field {name!r} averages {mean:.6g}, but the record's "
                        f"metrics.{where}.{metric} is {recorded:.6g}: outcomes of another cell "
                        "or run")  # fmt: skip
    return None


def check_outcomes(
    cell_dir: Path, n_images: int | None = None, record: Mapping[str, Any] | None = None
) -> OutcomesFile | None:
    """The cell's ``outcomes.npz``, read once and checked (:class:`OutcomesFile`), or None when
    it has none.

    Args:
        cell_dir: the cell's folder (beside ``record.json``).
        n_images: the test set's size the file must hold (:func:`record_image_count` of the
            cell's record); None: any, as long as every field agrees.
        record: the cell's record: with it, every value must also be finite and in its
            field's range, and each field's mean the record's metric (``correct`` → ``acc``,
            ``nll``, ``brier``; the ``ts/`` view against the calibrated metrics).

    Raises:
        DamagedOutcomes: the file is there but not an archive of the fields of :data:`FIELDS`
            (and of the ``ts/`` view, all or none), each 1-D of its dtype and of one length N
            (and that length ``n_images``).
    """
    path = Path(cell_dir) / OUTCOMES_FILE
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        raise DamagedOutcomes(path, "not a file (a folder or a dangling link)")
    data = path.read_bytes()
    blobs: dict[str, bytes] = {}
    headers = _members(path, data, blobs)
    problem = _problem(headers)
    if problem:
        raise DamagedOutcomes(path, problem)
    count = headers["correct"]["shape"][0]
    if n_images is not None and count != n_images:
        raise DamagedOutcomes(
            path,
            f"holds {count} images, but the cell's record.json was scored on {n_images} "
            "(metrics.clean.reliability.count)",
        )
    if record is not None and (problem := _value_problem(headers, blobs, record)):
        raise DamagedOutcomes(path, problem)
    return OutcomesFile(path, data, count, tuple(headers))
