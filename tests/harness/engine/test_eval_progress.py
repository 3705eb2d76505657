"""The evaluation's progress (harness/engine/eval_passes.py): a bar with one step per pass
(held-out fit, clean test set, validation, each corruption × severity, each OOD set), shown only
on a terminal, and the pass's batches, on the bar and in the cell's heartbeat."""

from __future__ import annotations

import sys

import torch

from harness.contract import Evaluation
from harness.engine.evaluate import _Passes, evaluate_all


def test_counts_every_pass_and_shows_only_on_a_terminal(monkeypatch):
    ood = ("digits_hard_heldout", "sklearn_photos_hard")
    evaluation = Evaluation(calibrate=True, calibration=100, corruptions=("contrast", "fog"),
                            severities=(1, 3), ood=ood)  # fmt: skip
    from harness.registry import DATASETS

    spec = DATASETS.get("digits_hard")
    splits = {"test": None, "val": None, "calibration": None}
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with _Passes(splits, evaluation, spec, progress=True) as passes:
        assert passes.bar.total == 1 + 1 + 1 + 2 * 2 + (1 + 2) and not passes.bar.disable
        for label in ("calibration fit", "clean", "validation"):
            passes.step(label)
        assert passes.bar.n == 2  # the third pass is running
        passes.step("")
        assert passes.bar.n == 3
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with _Passes(splits, evaluation, spec, progress=True) as quiet:
        assert quiet.bar.disable  # redirected: no bar in the log
    with _Passes(splits, Evaluation(), spec, progress=False) as off:
        assert off.bar.disable and off.bar.total == 1 + 1  # test and validation


def test_a_real_evaluation_steps_through_all_its_passes(monkeypatch):
    """evaluate_all on a model: the bar ends at its total (every pass counted once)."""
    from harness.contract import Recipe
    from harness.data._machinery.base import default_data_root, training_splits
    from harness.engine.external import ExternalEnsemble
    from harness.registry import DATASETS

    seen = []
    real_step = _Passes.step

    def step(self, label):
        real_step(self, label)
        seen.append((label, self.bar.n, self.bar.total))

    monkeypatch.setattr(_Passes, "step", step)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a disabled bar counts nothing
    spec = DATASETS.get("digits_hard")
    root = default_data_root(None)
    evaluation = Evaluation(calibrate=True, calibration=100, corruptions=("contrast",),
                            severities=(1,), ood=("digits_hard_heldout",), cost=False)  # fmt: skip
    splits = training_splits(spec.load(root), 0, calibration=100)
    features = spec.in_shape[0] * spec.in_shape[1] * spec.in_shape[2]
    weight = torch.randn(features, spec.num_classes, generator=torch.Generator().manual_seed(0))
    model = ExternalEnsemble(lambda x: x.flatten(1) @ weight, spec.num_classes)
    evaluate_all(model, splits, spec, evaluation, Recipe(), torch.device("cpu"), root,
                 progress=True)  # fmt: skip
    labels = [s[0] for s in seen]
    assert labels == ["calibration fit", "clean", "contrast s1", "OOD: test scores",
                      "OOD: digits_hard_heldout", ""]  # fmt: skip
    assert seen[-1][1] == seen[-1][2] == 5


def test_every_batch_of_every_pass_reaches_the_heartbeat(tmp_path):
    """evaluate_all with the cell's heartbeat: each pass counts its batches up to the loader's
    length, whatever process evaluates and without a terminal."""
    from harness.contract import Recipe
    from harness.data._machinery.base import default_data_root, training_splits
    from harness.engine.external import ExternalEnsemble
    from harness.registry import DATASETS
    from harness.storage.live import Heartbeat

    class Seen(Heartbeat):
        def __init__(self, folder) -> None:
            super().__init__(folder)
            self.seen: list[tuple] = []

        def evaluating(self, label, batch, batches, done, total) -> None:
            self.seen.append((label, batch, batches, done, total))
            super().evaluating(label, batch, batches, done, total)

    spec = DATASETS.get("digits_hard")
    root = default_data_root(None)
    evaluation = Evaluation(calibrate=True, calibration=100, ood=("digits_hard_heldout",),
                            cost=False)  # fmt: skip
    splits = training_splits(spec.load(root), 0, calibration=100)
    features = spec.in_shape[0] * spec.in_shape[1] * spec.in_shape[2]
    weight = torch.randn(features, spec.num_classes, generator=torch.Generator().manual_seed(0))
    model = ExternalEnsemble(lambda x: x.flatten(1) @ weight, spec.num_classes)
    beat = Seen(tmp_path)
    recipe = Recipe(eval_batch_size=64)
    evaluate_all(model, splits, spec, evaluation, recipe, torch.device("cpu"), root, live=beat)
    n_test = -(-len(splits["test"].labels) // 64)
    clean = [s for s in beat.seen if s[0] == "clean"]
    assert clean == [("clean", i, n_test if i else None, 1, 4) for i in range(n_test + 1)]
    labels = list(dict.fromkeys(s[0] for s in beat.seen))
    assert labels == ["calibration fit", "clean", "OOD: test scores", "OOD: digits_hard_heldout"]
    last = beat.seen[-1]
    assert last[1] == last[2] and last[3:] == (3, 4)  # the last batch of the fourth pass
