"""Building a cell's model and data, and loading its trained weights: what every path that
runs or re-evaluates a cell shares (the cell runner, ``harness evaluate``, ``harness bench``).

:func:`load_trained` is the one way a cell's saved ``final.pt`` becomes a model ready to
evaluate: loaded without running code from the file, and with the method's progress-dependent
schedules (σN-Ens's τ and λ) set to where training ended.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import numpy as np
import torch

from harness.contract import Cell
from harness.data._machinery.base import DatasetSpec, Split, training_splits
from harness.engine.train import set_determinism
from harness.registry import DATASETS, METHODS, resolved
from harness.storage.checkpoint import load_weights
from methods._base import BuildContext, EnsembleModel


def now() -> str:
    """The current UTC time, ISO 8601 to the second (record timestamps)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def record_evaluation(cell: Cell) -> dict:
    """A record's ``evaluation`` block: the cell's evaluation settings and, for the OOD sets it
    evaluates, the near/far groups its dataset declares (``ood_groups``: the reporter reads its
    near- and far-OOD means from here, never from a table of its own)."""
    block = cell.to_json()["evaluation"]
    declared = DATASETS.get(cell.dataset).ood_groups
    groups = {s: declared[s] for s in cell.evaluation.ood if s in declared}
    if groups:
        block["ood_groups"] = groups
    return block


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (same seed → same initial weights)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(
    cell: Cell,
    spec: DatasetSpec,
    pretrained: dict[str, torch.Tensor] | None = None,
    device: torch.device | None = None,
) -> tuple[EnsembleModel, BuildContext]:
    """Build the cell's method on its backbone (seeded: same seed → same initial weights); with
    ``device``, also place it there as the recipe asks (channels_last on CUDA, compile).
    Kernels are made deterministic or not as the recipe says, before any is chosen."""
    set_determinism(cell.recipe.deterministic)
    seed_everything(cell.seed)
    cell = resolved(cell)  # a suite's cell carries its typed hyper-parameters already
    mspec = METHODS.get(cell.method)
    ctx = BuildContext(
        cell.backbone,
        spec.in_shape,
        spec.num_classes,
        cell.M,
        dict(cell.backbone_kwargs),
        pretrained,
        seed=cell.seed,
    )
    model = mspec.build(ctx, cell.typed_hparams)
    if device is not None:
        model.to(device)
        if cell.recipe.channels_last and device.type == "cuda":
            model.to(memory_format=torch.channels_last)
        if cell.recipe.compile:
            model.compile()  # in place: state_dict keys and the method's hooks stay as they are
    return model, ctx


def load_data(cell: Cell, data_root: Path) -> tuple[DatasetSpec, dict[str, Split]]:
    """The cell's dataset spec and splits (raises ``DataMissingError`` naming the fetch)."""
    return dataset_splits(
        cell.dataset, data_root, cell.recipe.validation, cell.evaluation.calibration
    )


def dataset_splits(
    dataset: str, data_root: Path, validation: int = 0, calibration: int = 0
) -> tuple[DatasetSpec, dict[str, Split]]:
    """A dataset's spec and the splits a cell of it trains, selects, calibrates and is tested on
    (:func:`load_data`'s, and ``harness.api.data``'s: one way to carve them).

    Raises:
        DataMissingError: the data is not on this machine (the message names the fetch).
        ValueError: ``validation`` or ``calibration`` out of range
            (:func:`harness.data._machinery.base.training_splits`).
    """
    spec = DATASETS.get(dataset)
    spec.require(data_root)
    # The loader's training pool, minus `validation` held-out images when the recipe asks (from
    # its spare images when it has them), and the evaluation's `calibration` images.
    splits = spec.load(data_root)
    return spec, training_splits(splits, validation, calibration=calibration)


def load_backbone_state(path: str | Path) -> dict[str, torch.Tensor]:
    """A plain backbone's state dict from a harness ``final.pt``/``checkpoint.pt`` of a `single`
    cell (keys prefixed ``net.``) or from any state dict the backbone accepts
    (:func:`harness.backbones._weights.backbone_file_state`). Loaded without running code from
    the file: one that needs full unpickling raises ``UnsafeWeightsError``."""
    from harness.backbones._weights import backbone_file_state

    return backbone_file_state(path)


def load_trained(cell: Cell, cell_dir: Path, model: EnsembleModel, device: torch.device) -> None:
    """Load the cell's ``final.pt`` into ``model`` and set the method's progress-dependent
    schedules to the end of training, so that it evaluates as it did right after training.

    Raises:
        DamagedFile: ``final.pt`` is missing, truncated or not a weights file.
        UnsafeWeightsError: it needs full unpickling (code could run).
    """
    model.load_state_dict(load_weights(cell_dir / "final.pt", map_location=device))
    model.set_progress(cell.recipe.epochs - 1, cell.recipe.epochs)
