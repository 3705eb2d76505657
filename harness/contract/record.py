"""The result record: its keys, construction, validation, reading, and how to read its identity.

One JSON file per cell (``<results>/<cell_id>/record.json``), documented in ``docs/records.md``.
Schema 2 adds the cell's human ``label`` and ``hparams_shown`` (its hyper-parameters that differ
from the method's defaults), both computed by the engine when the cell runs, so a reporter never
needs the methods' code to name a configuration and a later change of a default never relabels
old results. Schema-1 records still read: their shown hyper-parameters are all of them.

Standard library and orjson (the reporter imports this module without torch). Atomic writing
lives with the engine in ``harness.storage.records``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.contract import fastjson
from harness.contract.config import Cell, cell_label, format_hparams, jsonable
from harness.contract.errors import DamagedFile

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
RECORD_FILE = "record.json"
STATUSES = ("done", "failed")

#: Metrics of the ensemble prediction on the clean test split (``metrics.clean``), in order: the
#: engine computes exactly these and the reporter reads exactly these.
ENSEMBLE_METRIC_KEYS = ("acc", "nll", "brier", "ece", "aece", "aurc", "disagreement", "mi", "kl")

#: How OOD metrics are to be read; stored in every result record and shown in reports.
OOD_CONVENTION = (
    "scores are higher for more in-distribution samples (msp = max p̄, entropy = −H(p̄), "
    "mi = −(H(p̄) − mean_m H(p_m)), p̄ = mean of member probabilities; energy = "
    "mean_m logsumexp_k z_m,k (negative free energy, T = 1), max_logit = mean_m max_k z_m,k, "
    "z_m = member m's logits, left out for a model that gives probabilities only); "
    "auroc = P(score_ID > score_OOD) + ½P(tie); aupr_in = average precision (step-wise, as "
    "scikit-learn) with ID positive; aupr_out = average precision with OOD positive on negated "
    "scores; fpr95 = OpenOOD/torch-uncertainty convention, OOD positive: fraction of ID samples "
    "rejected (flagged OOD) at the threshold that flags ≥ 95% of OOD samples; fpr95_id = "
    "Hendrycks & Gimpel convention, ID positive: fraction of OOD samples accepted at the "
    "threshold that keeps ≥ 95% of ID samples; both lower is better, tie-aware thresholds."
)

#: How every number of a record is to be read; stored verbatim in each record.
CONVENTIONS = {
    "ensemble": "prediction = mean of member softmax probabilities",
    "ece": "15 equal-width confidence bins, L1 (top-label); aece: 15 equal-mass bins",
    "brier": "sum over classes of squared error, mean over samples",
    "nll": "natural log, of the mean probability of the true class",
    "ood": OOD_CONVENTION,
    "throughput": "input images per second seen by the whole ensemble, after warm-up, "
    "device-synchronised; cost.shared_device is true when other cells ran on the same device "
    "at the same time (throughput measured under contention)",
    "flops": "eval-mode FLOPs of the whole ensemble per input image (torch.utils.flop_counter)",
}

# key → (required from schema version, allowed types). The one definition of the top level.
TOP_LEVEL: dict[str, tuple[int, tuple[type, ...]]] = {
    "schema_version": (1, (int,)),
    "suite": (1, (str,)),
    "cell_id": (1, (str,)),
    "label": (2, (str,)),
    "hparams_shown": (2, (dict,)),
    "status": (1, (str,)),
    "config": (1, (dict,)),
    "evaluation": (1, (dict,)),
    "metrics": (1, (dict,)),
    "cost": (1, (dict,)),
    "history": (1, (list,)),
    "diagnostics": (1, (dict,)),
    "timings": (1, (dict,)),
    "environment": (1, (dict,)),
    "conventions": (1, (dict,)),
    "error": (1, (dict, type(None))),
    "started_at": (1, (str,)),
    "finished_at": (1, (str,)),
}


class RecordError(ValueError):
    """A record does not follow the schema."""


def new_record(cell: Cell, environment: Mapping[str, Any], started_at: str) -> dict[str, Any]:
    """A schema-2 record for ``cell`` before it runs: identity, label and empty result sections.

    ``cell.defaults`` must hold the method's current hyper-parameter defaults (the engine fills
    them in), so that ``label`` and ``hparams_shown`` name what the run actually used.
    The runner fills ``status``, ``metrics``, ``cost``, ... and ``finished_at``.
    """
    return {
        "schema_version": SCHEMA_VERSION,
        "suite": cell.suite,
        "cell_id": cell.cell_id,
        "label": cell.label,
        "hparams_shown": cell.shown_hparams(),
        "config": cell.config(),
        "evaluation": cell.to_json()["evaluation"],
        "metrics": {},
        "cost": {},
        "history": [],
        "diagnostics": {},
        "timings": {},
        "environment": jsonable(dict(environment)),
        "conventions": dict(CONVENTIONS),
        "error": None,
        "started_at": started_at,
    }


def _check_json_values(obj: Any, path: str) -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        return  # NaN/inf are legal metric values (a diverged run); JSON writes them as NaN.
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise RecordError(f"{path}: key {k!r} is not a string")
            _check_json_values(v, f"{path}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _check_json_values(v, f"{path}[{i}]")
    elif not isinstance(obj, str | int | float | bool | type(None)):
        raise RecordError(f"{path}: value of type {type(obj).__name__} is not JSON")


def validate_record(rec: Mapping[str, Any], *, values: bool = True) -> None:
    """Raise :class:`RecordError` if ``rec`` follows none of the readable schema versions.

    ``values=False`` skips the walk over every value (string keys, JSON types): a record just
    decoded from JSON text cannot fail it, and at 10,000 records the walk is most of a report."""
    version = rec.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise RecordError(f"schema_version {version!r} is not one of {READABLE_VERSIONS}")
    wanted = {k: types for k, (since, types) in TOP_LEVEL.items() if since <= version}
    missing = [k for k in wanted if k not in rec]
    if missing:
        raise RecordError(f"record lacks keys {missing}")
    unknown = sorted(set(rec) - set(wanted))
    if unknown:
        raise RecordError(f"record has unknown keys {unknown}; valid: {sorted(wanted)}")
    for k, types in wanted.items():
        if not isinstance(rec[k], types):
            raise RecordError(
                f"record[{k!r}] must be {[t.__name__ for t in types]}, got {type(rec[k]).__name__}"
            )
    if rec["status"] not in STATUSES:
        raise RecordError(f"status {rec['status']!r} not in {STATUSES}")
    if rec["status"] == "failed" and not rec["error"]:
        raise RecordError("a failed record must carry an error with its reason")
    if rec["status"] == "done" and "clean" not in rec["metrics"]:
        raise RecordError("a done record must carry metrics.clean")
    if values:
        _check_json_values(rec, "record")


class DamagedRecord(DamagedFile, RecordError):
    """A ``record.json`` that cannot be used: unreadable, truncated, not a harness record, from a
    newer schema, or invalid. ``path`` is the file, ``reason`` one line saying what is wrong;
    ``str()`` is the line a command prints (``<path>: damaged record: <reason>``)."""

    def __init__(self, path: Path, reason: str) -> None:
        DamagedFile.__init__(self, path, reason)
        self.args = (f"{path}: damaged record: {reason}",)

    def __str__(self) -> str:
        return self.args[0]


#: Reading more than this is not a record but a damaged or foreign file (a real one is ~10 kB).
MAX_RECORD_BYTES = 64 * 2**20


def _metric_problem(obj: Any, path: str) -> str | None:
    """The first metric leaf that is not a number (null stands for "not computed")."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            # A number leaf needs no call (10,000 records × ~70 leaves each when reporting).
            if type(v) is not float and (problem := _metric_problem(v, f"{path}.{k}")):
                return problem
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if type(v) is not float and (problem := _metric_problem(v, f"{path}[{i}]")):
                return problem
    elif isinstance(obj, str | bool) or not isinstance(obj, int | float | type(None)):
        return f"{path} holds {type(obj).__name__} {obj!r:.40}, not a number"
    return None


def check_record_file(path: Path) -> dict[str, Any]:
    """The record in the file ``path``, checked; :class:`DamagedRecord` (one line: file and
    reason) for anything a command cannot use. Missing files raise ``FileNotFoundError``."""
    path = Path(path)
    try:
        if path.is_symlink():
            raise DamagedRecord(path, "is a symbolic link, not a record the harness wrote")
        with path.open("rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:  # unreadable: permissions, a directory, I/O error
        raise DamagedRecord(path, f"unreadable ({exc.strerror or exc})") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise DamagedRecord(path, f"larger than {MAX_RECORD_BYTES // 2**20} MiB")
    try:
        rec = fastjson.loads(raw)
    except UnicodeDecodeError as exc:
        raise DamagedRecord(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        # The harness writes whole files ending in "}"; a file cut short (a full disk, a copy
        # interrupted) ends anywhere else.
        what = "not valid JSON" if raw.rstrip().endswith((b"}", b"]")) else "truncated"
        raise DamagedRecord(path, f"{what} ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(rec, dict) or "schema_version" not in rec:
        kind = type(rec).__name__ if not isinstance(rec, dict) else "object without schema_version"
        raise DamagedRecord(path, f"not a harness record (a JSON {kind})")
    version = rec["schema_version"]
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise DamagedRecord(
            path,
            f"written by a newer harness (schema {version}; this one reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}): upgrade the harness to read it",
        )
    try:
        validate_record(rec, values=False)  # decoded from JSON: every value is a JSON value
    except RecordError as exc:
        raise DamagedRecord(path, str(exc)) from None
    metrics = rec["metrics"]
    # The sections that hold only numbers (corruption blocks also list names and a sentence).
    numeric = [(k, metrics.get(k)) for k in ("clean", "val", "ood")]
    numeric.append(("corruption.mean", (metrics.get("corruption") or {}).get("mean")))
    for key, section in numeric:
        if problem := _metric_problem(section, f"metrics.{key}"):
            raise DamagedRecord(path, problem)
    return rec


def read_record(cell_dir: Path) -> dict[str, Any] | None:
    """The record in ``cell_dir``, or None if there is none (a pending or running cell).

    Raises:
        DamagedRecord: the file is there but cannot be used (see :func:`check_record_file`).
    """
    try:
        return check_record_file(Path(cell_dir) / RECORD_FILE)
    except FileNotFoundError:
        return None


def usable_record(cell_dir: Path) -> dict[str, Any] | None:
    """The record in ``cell_dir`` if there is a usable one, else None (missing or damaged): for
    readers that only ask "is this cell done?" and leave naming the damage to others."""
    try:
        return read_record(cell_dir)
    except DamagedRecord:
        return None


def set_aside(path: Path, stamp: str | None = None, why: str = "damaged") -> Path:
    """Rename a file out of the way, never deleting it: ``record.json`` →
    ``record.json.<why>-<UTC time>`` (a counter is added if that name is taken); ``why`` is
    ``damaged`` for an unusable file, ``replaced`` for one an explicit overwrite replaces.

    Returns:
        The new path.
    """
    import datetime as dt

    path = Path(path)
    stamp = stamp or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.{why}-{stamp}")
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}.{why}-{stamp}-{n}")
    path.rename(target)
    return target


def is_cell_dir(path: Path) -> bool:
    """Whether ``path`` is a real cell folder (a symbolic link inside results is not a cell:
    it may point anywhere, even at another cell, which would then count twice)."""
    return path.is_dir() and not path.is_symlink() and not path.name.startswith((".", "_"))


def iter_records(
    results_dir: Path, damaged: list[DamagedRecord] | None = None
) -> Iterator[dict[str, Any]]:
    """All usable records under a suite's results folder, in cell-id order.

    Damaged records are skipped; with ``damaged``, each is appended there (for the caller to
    name). Symbolic links are not cells and are skipped.
    """
    if not Path(results_dir).is_dir():
        return
    for cell_dir in sorted(Path(results_dir).iterdir()):
        if not is_cell_dir(cell_dir):
            continue
        try:
            rec = read_record(cell_dir)
        except DamagedRecord as exc:
            if damaged is not None:
                damaged.append(exc)
            continue
        if rec is not None:
            yield rec


def shown_of(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameters a record is labelled with: ``hparams_shown`` (schema 2), else every
    hyper-parameter of its config (schema 1 stored no defaults; all of them keeps the label
    one-to-one without importing the methods)."""
    if isinstance(rec.get("hparams_shown"), Mapping):
        return dict(rec["hparams_shown"])
    return dict((rec.get("config") or {}).get("hparams") or {})


def identity(rec: Mapping[str, Any]) -> tuple[str, str, str, Any, str]:
    """(dataset, backbone, method, M, shown hyper-parameters as text) of a record, read from the
    record alone (any schema version)."""
    cfg = rec.get("config") or {}
    return (
        str(cfg.get("dataset", "?")),
        str(cfg.get("backbone", "?")),
        str(cfg.get("method", "?")),
        cfg.get("M"),
        format_hparams(shown_of(rec)),
    )


def label_of(rec: Mapping[str, Any]) -> str:
    """The record's ``label`` (schema 2), else one built from its config with every
    hyper-parameter shown."""
    if isinstance(rec.get("label"), str):
        return rec["label"]
    return cell_label(rec.get("config") or {}, shown_of(rec))
