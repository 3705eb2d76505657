"""The evaluation's progress bar (harness/engine/evaluate.py): one step per pass (held-out fit,
test, validation, each corruption × severity, each OOD set), shown only on a terminal."""

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
        for label in ("calibration fit", "test", "validation"):
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
    assert labels == ["calibration fit", "test", "contrast s1", "OOD: test scores",
                      "OOD: digits_hard_heldout", ""]  # fmt: skip
    assert seen[-1][1] == seen[-1][2] == 5
