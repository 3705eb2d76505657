"""Checkpoints and weights files: safe loading, atomic umask-honouring saving, random states.

Safety: every file is read with ``torch.load(..., weights_only=True)``, PyTorch's restricted
unpickler that rebuilds tensors and plain containers only (no imports, no calls), so a weights
file cannot run code (a pickle executes whatever its ``__reduce__`` names when fully unpickled).
A file that needs full unpickling is refused with :class:`UnsafeWeightsError`, which says why and
how to convert it. The one opt-in is named and per file: ``HARNESS_TRUST_PICKLE`` lists the paths
(``os.pathsep``-separated) of files the user vouches for; nothing is trusted by default.

Checkpoints therefore hold only tensors and plain types: state dicts, history lists, and the
random states as tensors and lists (:func:`rng_state`), which is also what lets a resumed cell be
bit-identical to an uninterrupted one (CPU, CUDA, NumPy and Python ``random`` are all restored;
the data order needs no state: it is a function of (seed, epoch), see ``DeviceLoader``).
"""

from __future__ import annotations

import logging
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.contract.env import TRUST_PICKLE
from harness.contract.errors import DamagedFile
from harness.storage.safe_files import atomic_write, weights_file_problem
from harness.storage.space import naming_full_disk

TRUST_ENV = TRUST_PICKLE.name

log = logging.getLogger("harness")

#: What a training checkpoint written by ``train_cell`` holds (``rng`` or ``rng_cpu`` too).
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "epoch", "history", "diagnostics", "train_s")


class UnsafeWeightsError(RuntimeError):
    """A weights file needs full unpickling (it could run code) and is not trusted."""


def trusted_paths() -> set[Path]:
    """Files named in ``$HARNESS_TRUST_PICKLE`` (resolved), the only ones fully unpickled."""
    return {p.resolve() for p in TRUST_PICKLE.read([])}


def load_weights(path: str | Path, map_location: Any = "cpu") -> Any:
    """Load a weights file or checkpoint without running code from it.

    Args:
        path: a ``torch.save`` file.
        map_location: as for ``torch.load``.

    Raises:
        UnsafeWeightsError: the file holds objects other than tensors and plain types, and it
            is not listed in ``$HARNESS_TRUST_PICKLE``.
        DamagedFile: the file is missing, empty, truncated or not a ``torch.save`` file
            (one line: the path and what is wrong).
    """
    path = Path(path).expanduser()
    if problem := weights_file_problem(path):
        raise DamagedFile(path, problem)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (EOFError, KeyError, IndexError, ValueError, OSError) as exc:
        # What torch.load's unpickler raises on a cut or foreign byte stream; its own message
        # is a bare key or "index out of range", so the reason is ours.
        raise DamagedFile(
            path, f"truncated or not written by torch.save ({type(exc).__name__}: {exc})"
        ) from None
    except RuntimeError as exc:
        if "PytorchStreamReader" not in str(exc) and "zip" not in str(exc):
            raise  # e.g. a CUDA tensor on a machine without CUDA: the file is fine
        first = str(exc).strip().splitlines()[0][:160]
        raise DamagedFile(path, f"damaged zip archive ({first})") from None
    except pickle.UnpicklingError as exc:
        if path.resolve() in trusted_paths():
            # The user named this very file as trusted: full unpickling is their explicit choice.
            return torch.load(path, map_location=map_location, weights_only=False)
        # The restricted unpickler's own message names the offending global: keep its first line.
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafeWeightsError(
            f"refused to load {path}: it needs full unpickling, which can run arbitrary code "
            f"({detail}); convert it to a plain state dict in a trusted session "
            f"(torch.save(torch.load(f, weights_only=False)['state_dict'], 'plain.pt')) or, if "
            f"you trust this file, name it in ${TRUST_ENV}"
        ) from None


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any] | None:
    """The training checkpoint at ``path``, or None when there is none or it is damaged.

    A damaged one (truncated, not a ``torch.save`` file, lacking :data:`CHECKPOINT_KEYS`) is
    renamed aside, never deleted
    (``checkpoint.pt.damaged-<time>``), named in one warning line and in the cell's
    ``events.jsonl``; the caller then trains from epoch 0, as without a checkpoint. Otherwise
    every later run would fail on the same file and the cell would never finish.
    """
    from harness.contract.record import set_aside

    path = Path(path)
    if not path.exists():
        return None
    try:
        ckpt = load_weights(path, map_location=map_location)
        if not isinstance(ckpt, dict):
            raise DamagedFile(path, f"holds a {type(ckpt).__name__}, not a training checkpoint")
        if missing := [k for k in CHECKPOINT_KEYS if k not in ckpt]:
            raise DamagedFile(path, f"is not a training checkpoint (lacks {', '.join(missing)})")
    except DamagedFile as exc:  # UnsafeWeightsError is not damage: a planted pickle fails the
        reason = exc.reason  # cell with the reason, for the user to look at, as any weights file
        moved = set_aside(path)
        log.warning(
            "%s: damaged checkpoint (%s); moved to %s; no other checkpoint, training restarts "
            "from epoch 0",
            path,
            reason,
            moved.name,
        )
        log_event(path.parent, "checkpoint_damaged", file=path.name, moved_to=moved.name,
                  reason=reason)  # fmt: skip
        return None
    return ckpt


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` atomically (temp file, fsync, ``os.replace``), with the mode a
    plain ``open(path, "w")`` would give under the current umask.

    A unique temporary name (``mkstemp``) keeps two writers from sharing one temp file; on any
    failure, Ctrl-C included, the temp file is removed and the old ``path`` is left as it was.
    """
    atomic_write(path, lambda f: torch.save(obj, f), binary=True)


def rng_state() -> dict[str, Any]:
    """Every process-wide random state a cell draws from, as tensors and plain lists.

    Returns:
        {"torch": uint8 tensor, "cuda": [uint8 tensor per device] (empty without CUDA),
        "numpy": [name, int64 tensor (624,), pos, has_gauss, cached_gaussian],
        "python": [version, [625 ints], gauss_next]}.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": [version, list(internal), gauss_next],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved (CUDA only when present on both sides).

    ``state`` may come from ``torch.load(..., map_location=device)`` (the runner resumes onto
    the cell's device), so every tensor goes through ``.cpu()`` before it is used as a host
    value: ``.numpy()`` of a CUDA tensor raises, and that would fail every resume on a GPU.
    """
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


EVENTS_FILE = "events.jsonl"


def log_event(cell_dir: Path, event: str, **fields: Any) -> None:
    """Append one line to the cell's ``events.jsonl`` (train/resume/trained/evaluate/done/failed,
    with host, pid and time), the audit trail that shows a cell was trained once.

    One ``write`` on an ``O_APPEND`` descriptor: lines of concurrent writers do not interleave.
    """
    import json
    import socket
    import time

    line = json.dumps(
        {"event": event, "at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
        | fields
    )
    path = Path(cell_dir) / EVENTS_FILE
    with naming_full_disk(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read_events(cell_dir: Path) -> list[dict[str, Any]]:
    """The cell's events, oldest first (a torn last line from a killed process is skipped)."""
    import json

    path = Path(cell_dir) / EVENTS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
