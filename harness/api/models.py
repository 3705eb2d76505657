"""Models in and out of the benchmark: evaluate a model you already have (:func:`evaluate`), get a
finished cell's model back (:func:`load_model`) and its probabilities (:func:`predictions`).

    import harness.api as h

    # beside the smoke cells (then: harness report results/smoke)
    out = h.evaluate(my_ensemble, suite="suites/smoke.yaml", name="my_ensemble", results="results")
    out.record["metrics"]["clean"]["acc"], out.row

    model = h.load_model("results/smoke/<cell id>")       # the cell's trained ensemble (eval mode)
    p = h.predictions("results/smoke/<cell id>", "test")  # p.probs (M, N, K), p.labels (N,)

Torch is imported when these are called (reading results stays torch-free).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.api._common import HarnessError, PathLike

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import torch
    from torch import nn

    from harness.contract import Cell, Evaluation, Recipe
    from methods._base import EnsembleModel

#: The suite name of a record evaluated without a suite.
EXTERNAL_SUITE = "external"


@dataclass(frozen=True)
class Evaluated:
    """What :func:`evaluate` produced.

    Attributes:
        record: the result record (docs/records.md), as a harness cell's.
        path: its folder (``record.json``, ``outcomes.npz``), or None when not written.
        outcomes: the per-image outcomes (``correct``, ``nll``, ``brier``, ``confidence``, and
            ``ts/…`` with calibration), each ``(N,)`` over the test set.
    """

    record: dict[str, Any]
    path: Path | None
    outcomes: dict[str, np.ndarray]

    @property
    def row(self) -> pd.DataFrame:
        """The record as the reporter's one-row frame (the columns of a results folder's)."""
        from reports.records.results import records_to_frame

        return records_to_frame([self.record])


def evaluate(
    model: nn.Module | Callable[[torch.Tensor], torch.Tensor],
    dataset: str | None = None,
    *,
    suite: PathLike | None = None,
    overrides: Sequence[str] = (),
    name: str = "my_model",
    backbone: str = "external",
    results: PathLike | None = None,
    evaluation: Mapping[str, Any] | None = None,
    recipe: Mapping[str, Any] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    data_root: PathLike | None = None,
    progress: bool = False,
    outputs: str = "logits",
    overwrite: bool = False,
    limit: int | None = None,
) -> Evaluated:
    """Put a model trained anywhere through the benchmark's evaluation: clean test set,
    corruptions, OOD sets, temperature scaling and conformal sets fitted on the held-out split,
    per-image outcomes, parameters and FLOPs.

    The model receives what a harness model receives: float32 batches ``(B, C, H, W)`` at the
    dataset's input shape, normalised with the dataset's mean and standard deviation
    (``harness.registry.DATASETS.get(dataset)``), and returns **logits** (the default,
    ``outputs="logits"``) or, with ``outputs="probs"``, probabilities: ``(M, B, K)`` for an
    ensemble of M members (the prediction is the mean of their softmax, as for every method) or
    ``(B, K)`` for one model. Outputs that contradict ``outputs`` (rows of probabilities
    scored as logits would give an NLL near log K) are refused on the first batch, as are NaN or
    infinite outputs. It is evaluated in ``eval()`` mode as it is; nothing is trained.

    The record's id is ``ext-`` and 12 hex digits of its configuration and the model's weights
    (``docs/results.md``): it never names a trained cell's folder. A record of the same name,
    dataset, backbone and seed already in the results folder is refused unless ``overwrite``
    (its files are then renamed ``*.replaced-<time>``, never deleted); a name that is one of
    the suite's trained methods on the same backbone is always refused.

    Args:
        model: an ``nn.Module`` or any callable from a batch to logits.
        dataset: a registered dataset; with ``suite``, needed only when the suite has several.
        suite: evaluate as this suite's cells are evaluated: its dataset, held-out splits
            (``recipe.validation``, ``evaluation.calibration``), eval batch size and evaluation
            block, so the record sits beside its cells (written to ``<results>/<suite name>``).
        overrides: ``KEY=VALUE`` overrides of the suite (``"evaluation.ood=[]"``).
        name: the record's method name (the leaderboard's row).
        backbone: the record's backbone (the page groups by it): ``"external"`` unless the
            model is built on one of the suite's backbones and you want it in that table.
        results: the results root to write the record to (None: return it only).
        evaluation: fields of the evaluation block (``{"ood": ["digits_heldout"]}``); over the
            suite's when both are given.
        recipe: recipe fields that matter to evaluation (``validation``, ``eval_batch_size``,
            ``amp``, ``channels_last``); over the suite's.
        seed: of the evaluation's draws (a stochastic model's), as a cell's seed.
        device: where the model runs (default: where its parameters are, else the CPU).
        data_root: where the data lives (default: ``$HARNESS_DATA_ROOT``, else the user cache).
        progress: a progress bar over the evaluation's passes (on a terminal).
        outputs: ``"logits"`` (default) or ``"probs"``: what the model returns.
        overwrite: replace an earlier record of an outside model under the same name,
            dataset, backbone and seed (its files set aside, never deleted).
        limit: score a fixed subset of this many test images (and of each OOD and corruption
            set) for a quick look: ``evaluation={"limit": N}``; the record states it.

    Returns:
        The record, its folder and the per-image outcomes; ``.row`` is the reporter's row.

    Raises:
        HarnessError: before any evaluation, naming the argument: a wrong argument type or
            value, a device this machine does not have, a model on the meta device or on
            another device, an unknown dataset or OOD set, an invalid evaluation or recipe
            field, a conformal α the calibration split cannot honour, data missing on this
            machine, a suite that does not load, a results path that is a file, a record it
            would collide with; on the first test batch: a model that fails on the dataset's
            input shape or whose outputs are not finite logits (or probabilities) of the
            dataset's classes.
    """
    # Length: two thirds of it is the docstring (the API's reference); the body is the order
    # of the checks, every one before the first forward pass.
    from harness.api.evaluate_checks import (
        argument_problems,
        checked_device,
        colliding_records,
        model_fingerprint,
    )
    from harness.contract import ExternalCell
    from harness.data._machinery.base import DataMissingError, default_data_root
    from harness.engine.external import evaluate_external

    problems = argument_problems(model, dataset, overrides, name, backbone, results,
                                 evaluation, recipe, seed, outputs, data_root)  # fmt: skip
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        problems.append(f"limit: {limit!r}: pass a whole number of test images >= 1, or None")
    if problems:
        raise HarnessError(problems)
    if limit is not None:
        evaluation = {**(evaluation or {}), "limit": limit}
    where = checked_device(device, model)
    cell, suite_methods = _external_cell(
        name, backbone, dataset, suite, overrides, evaluation, recipe, seed
    )
    root = default_data_root(Path(data_root) if data_root else None)
    _check_data(cell, root)
    cell = ExternalCell(**_fields(cell), fingerprint=model_fingerprint(model))
    suite_dir = Path(results) / cell.suite if results is not None else None
    if suite_dir is not None and suite_dir.exists() and not suite_dir.is_dir():
        raise HarnessError([f"results: {suite_dir} is a file, not a folder"])
    replaces = [] if suite_dir is None else colliding_records(
        suite_dir, cell, suite_methods, overwrite
    )  # fmt: skip
    try:
        record, outcomes, folder = evaluate_external(
            model, cell, root, where, suite_dir, progress, outputs=outputs, replaces=replaces
        )
    except (TypeError, ValueError, DataMissingError) as exc:
        raise HarnessError([f"{name}: {exc}"]) from exc
    return Evaluated(record, folder, outcomes)


def _fields(cell: Cell) -> dict[str, Any]:
    """A cell's dataclass fields by name (to rebuild it as another cell type)."""
    return {f.name: getattr(cell, f.name) for f in dataclasses.fields(cell)}


def _external_cell(
    name: str,
    backbone: str,
    dataset: str | None,
    suite: PathLike | None,
    overrides: Sequence[str],
    evaluation: Mapping[str, Any] | None,
    recipe: Mapping[str, Any] | None,
    seed: int,
) -> tuple[Cell, list[tuple[str, str]]]:
    """The configuration an outside model is evaluated under (M = 1 until the model shows its
    own), checked as a suite is: every problem at once; and the suite's (method, backbone)
    pairs, the names an outside model may not take."""
    from harness.contract import Cell, Evaluation, Recipe
    from harness.contract.config import conformal_alpha_problem
    from harness.registry import DATASETS
    from harness.registry.core import RegistryError

    problems: list[str] = []
    base_recipe, base_eval, suite_name = Recipe(), Evaluation(), EXTERNAL_SUITE
    pairs: list[tuple[str, str]] = []
    if suite is not None:
        loaded = _load_suite(suite, overrides)
        suite_name, base_recipe, base_eval = loaded.name, loaded.recipe, loaded.evaluation
        pairs = [(me.name, b) for me in loaded.grid.methods for b in _backbone_names(loaded, me)]
        datasets = list(loaded.grid.datasets)
        if dataset is None and len(datasets) == 1:
            dataset = datasets[0]
        elif dataset is None:
            problems.append(f"{suite}: the suite has datasets {datasets}; pass dataset=")
    elif dataset is None:
        problems.append("evaluate: pass dataset= (a registered dataset) or suite=")
    rec = _replaced(base_recipe, recipe, "recipe", problems)
    ev = _replaced(base_eval, evaluation, "evaluation", problems)
    for what, names in (("dataset", [dataset] if dataset else []), ("OOD set", ev.ood)):
        for n in names:
            try:
                DATASETS.get(n)
            except RegistryError as exc:
                problems.append(f"{what}: {exc}")
    if ev.calibrate and not (ev.calibration or rec.validation):
        problems.append("evaluation.calibrate needs held-out images: set "
                        "evaluation.calibration or recipe.validation")  # fmt: skip
    elif ev.calibrate and (
        low := conformal_alpha_problem(ev.conformal_alpha, ev.calibration or rec.validation)
    ):
        problems.append(f"evaluation.conformal_alpha: {low}")
    if problems:
        raise HarnessError(problems)
    cell = Cell(suite_name, str(dataset), backbone, {}, name, 1, {}, seed, rec, ev, {})
    return cell, pairs


def _backbone_names(suite: Any, entry: Any) -> list[str]:
    """The backbones a suite's method entry trains on (its own list, else the grid's)."""
    return list(entry.backbones) if entry.backbones else [b.name for b in suite.grid.backbones]


def _load_suite(suite: PathLike, overrides: Sequence[str]) -> Any:
    """The loaded suite (validation's problems raised as :class:`HarnessError`)."""
    from harness.config.includes import SuiteError
    from harness.registry.core import RegistryError
    from harness.session.checks import load_suite_arg

    try:
        return load_suite_arg(str(suite), list(overrides), check_files=False)
    except (SuiteError, RegistryError, FileNotFoundError) as exc:
        raise HarnessError(list(getattr(exc, "problems", None) or [str(exc)])) from None


def _replaced(
    base: Recipe | Evaluation, fields: Mapping[str, Any] | None, where: str, problems: list[str]
) -> Any:
    """``base`` with ``fields`` over it, each checked by the suite's own builder."""
    from harness.contract.build import build_dataclass

    if not fields:
        return base
    errors: list[str] = []
    checked = build_dataclass(type(base), dict(fields), where, errors)
    problems.extend(errors)
    if errors:
        return base
    return dataclasses.replace(base, **{k: getattr(checked, k) for k in fields})


def _check_data(cell: Cell, root: Path) -> None:
    """Every dataset the evaluation reads is on this machine (else one line each, naming the
    fetch), before anything is evaluated."""
    from harness.data._machinery.base import DataMissingError
    from harness.registry import DATASETS

    problems = []
    for n in (cell.dataset, *cell.evaluation.ood):
        try:
            DATASETS.get(n).require(root)
        except DataMissingError as exc:
            problems.append(str(exc))
    if problems:
        raise HarnessError(problems)


def load_model(cell: PathLike, device: str | torch.device = "cpu") -> EnsembleModel:
    """A finished cell's trained model, as it was evaluated (eval mode, the method's schedules
    at the end of training).

    Args:
        cell: the cell's folder (``<results>/<suite>/<cell id>``, holding ``cell.json`` and
            ``final.pt``).
        device: where to put it.

    Returns:
        The method's ensemble: input ``(B, C, H, W)`` normalised as the dataset's loader does,
        output logits ``(M, B, K)``.

    Raises:
        FileNotFoundError: no such cell folder, or its weights were not kept (no ``final.pt``).
        HarnessError: ``cell.json`` does not describe a cell this harness can build.
    """
    import torch

    from harness.engine.build import build_model, load_trained
    from harness.registry import DATASETS

    built = _cell_of(Path(cell))
    where = torch.device(device)
    spec = DATASETS.get(built.dataset)
    model, _ = build_model(built, spec, None, where)
    load_trained(built, Path(cell), model, where)
    return model.eval()


def _cell_of(folder: Path) -> Cell:
    """The cell a folder holds, with its weights present."""
    import json

    from harness.contract import Cell

    if not (folder / "cell.json").is_file():
        raise FileNotFoundError(f"{folder}: not a cell folder (no cell.json)")
    if not (folder / "final.pt").is_file():
        raise FileNotFoundError(
            f"{folder}: no final.pt: the cell has not finished training, or its weights were "
            "deleted (re-run the cell to get them back)"
        )
    try:
        return Cell.from_json(json.loads((folder / "cell.json").read_text()))
    except (ValueError, KeyError) as exc:
        raise HarnessError([f"{folder / 'cell.json'}: {exc}"]) from None


@dataclass(frozen=True)
class Predictions:
    """A cell's member probabilities on one split.

    Attributes:
        probs: ``(M, N, K)`` float32, the softmax of each member (their mean is the prediction).
        labels: ``(N,)`` int64 (for an OOD set: the set's own labels, not the task's).
    """

    probs: np.ndarray
    labels: np.ndarray


def predictions(
    cell: PathLike,
    split: str = "test",
    *,
    data_root: PathLike | None = None,
    device: str | torch.device = "cpu",
) -> Predictions:
    """A finished cell's member probabilities on a split of its dataset (``test``, ``train``,
    ``val`` or ``calibration`` when the cell held them out) or on an OOD set (its name), in
    the split's order, computed from ``final.pt`` as the evaluation computes them.

    Raises:
        FileNotFoundError: as :func:`load_model`.
        HarnessError: the split is not one of the cell's, or the data is missing.
    """
    import numpy as np
    import torch

    from harness.data._machinery.base import DataMissingError, default_data_root
    from harness.engine.build import load_data, seed_everything
    from harness.engine.evaluate import member_probs, ood_split
    from harness.registry.core import RegistryError

    built = _cell_of(Path(cell))
    root = default_data_root(Path(data_root) if data_root else None)
    try:
        spec, splits = load_data(built, root)
        if split not in splits:  # an OOD set, as the evaluation feeds it
            splits[split] = ood_split(split, spec, root)
    except (DataMissingError, RegistryError) as exc:
        names = ", ".join(sorted(splits)) if "splits" in locals() else "?"
        raise HarnessError(
            [f"{cell}: split {split!r}: {exc} (the cell's splits: {names})"]
        ) from None
    model = load_model(cell, device)
    seed_everything(built.seed)  # a stochastic method's draws as in its evaluation
    parts = list(member_probs(model, splits[split], spec, built.recipe, torch.device(device)))
    probs = torch.cat([p for p, _ in parts], dim=1).numpy().astype(np.float32)
    labels = torch.cat([y for _, y in parts]).numpy().astype(np.int64)
    return Predictions(probs, labels)
