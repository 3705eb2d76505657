"""Per-image outcomes of an evaluation: what a bootstrap over test images resamples.

A record's clean metrics are means over the test set (accuracy, NLL, Brier) or a function of
per-image (confidence, correct) pairs (ECE). Their sampling error over the test images is not in
the record; these arrays are, one value per test image in the split's order, so that a paired
comparison can resample images as well as seeds (:mod:`reports.stats.bootstrap`).

Arrays (length N, the test split's size), for the raw ensemble mean and, when post-hoc
calibration ran, for the pool-then-calibrate prediction under the prefix ``ts/``:

- ``correct`` (bool): argmax of p̄ equals the label (ties go to the lowest class index);
- ``nll`` (float32): −log max(p̄[y], 1e-12), nats;
- ``brier`` (float32): Σ_k (p̄_k − 1[k = y])²;
- ``confidence`` (float32): max_k p̄_k.

Their means are the record's ``acc``, ``nll`` and ``brier`` (to float32 rounding), and the
15-bin ECE of (``confidence``, ``correct``) its ``ece`` (a confidence within float32 rounding of
a bin edge may fall in the neighbouring bin). Temperature scaling leaves ``correct`` unchanged,
so ``ts/correct`` is not stored.

Stored as ``outcomes.npz`` beside the cell's ``record.json`` (:mod:`harness.contract.outcomes`,
which checks them without torch); :func:`read_outcomes` reads them back.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from harness.contract.outcomes import (  # noqa: F401 (re-exported: the engine's one import)
    FIELDS,
    OUTCOMES_FILE,
    DamagedOutcomes,
    check_outcomes,
    record_image_count,
)


class OutcomeAccumulator:
    """Collects per-image outcomes batch by batch for one or more views (``""`` for the raw
    prediction, ``"ts"`` for the calibrated one)."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[str, list[np.ndarray]]] = {}

    def update(self, probs: Tensor, labels: Tensor, view: str = "") -> None:
        """Add a batch.

        Args:
            probs: member probabilities ``(M, B, K)`` (their mean is the prediction) or
                ``(B, K)``.
            labels: ``(B,)`` integer labels.
            view: ``""`` (raw) or a calibrated view's name (``"ts"``).
        """
        # Imported here: classification imports torchmetrics (seconds, and scipy), which a
        # cell's process loads when it first evaluates, not when the runner is imported.
        from harness.metrics.classification import NLL_EPS, _sample_stats, as_ensemble

        with torch.no_grad():
            p = as_ensemble(probs, labels, validate=False)
            stats = {k: v[0] for k, v in _sample_stats(p, labels, NLL_EPS).items()}  # (B,) each
            stats["confidence"] = p.mean(0).amax(-1)
        parts = self._parts.setdefault(view, {k: [] for k in FIELDS})
        for key, dtype in FIELDS.items():
            if view and key == "correct":
                continue  # a temperature does not change the top label
            parts[key].append(stats[key].cpu().numpy().astype(dtype))

    def arrays(self) -> dict[str, np.ndarray]:
        """``{"correct": (N,), "nll": (N,), …, "ts/nll": (N,), …}``."""
        out: dict[str, np.ndarray] = {}
        for view, parts in self._parts.items():
            for key, chunks in parts.items():
                if chunks:
                    out[f"{view}/{key}" if view else key] = np.concatenate(chunks)
        return out


def outcomes_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The ``.npz`` file's bytes (compressed; plain arrays only)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def save_outcomes(cell_dir: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` atomically to ``cell_dir/outcomes.npz`` (a reader never sees half a
    file)."""
    from harness.storage.safe_files import atomic_write

    path = Path(cell_dir) / OUTCOMES_FILE
    data = outcomes_bytes(arrays)
    atomic_write(path, lambda f: f.write(data), binary=True)
    return path


def read_outcomes(
    cell_dir: Path, n_images: int | None = None, record: dict[str, Any] | None = None
) -> dict[str, np.ndarray] | None:
    """The cell's per-image outcomes (``{"correct": (N,), "nll": (N,), …}``), or None when it
    has no ``outcomes.npz``.

    Args:
        cell_dir: the cell's folder.
        n_images: the N the file must hold (:func:`record_image_count` of the cell's record;
            None: any).

        record: the cell's record, to check the values against (finite, in range, each
            field's mean the record's metric); None: the form only.

    Raises:
        DamagedOutcomes: the file is there but damaged, its values untrue to ``record``, or
            of another length than ``n_images`` (:func:`harness.contract.outcomes.check_outcomes`
            says which).
    """
    checked = check_outcomes(cell_dir, n_images, record)
    if checked is None:
        return None
    # The bytes the check read (not the file again: a rewrite in between would go unchecked).
    with np.load(io.BytesIO(checked.data), allow_pickle=False) as data:
        return {key: data[key] for key in data.files}
