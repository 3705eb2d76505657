"""The calibration split: held-out training-distribution images, never trained on, never the
test set, the same images for every method of a suite; and `validate` refuses a suite that asks
for calibration without one."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.config.parse import load_suite
from harness.data._machinery.base import ImageSet, training_splits
from harness.engine.build import load_data
from harness.registry import DATASETS

SUITE = """
name: cal
include: {repo}/suites/common/digits_hard_recipe.yaml
grid:
  datasets: [digits_hard]
  backbones: [digits_cnn]
  M: [2]
  seeds: [0, 1]
  methods: [single, deep_ensemble, sigma_ens]
evaluation:
  calibrate: true
  calibration: 300
"""


def _rows(split: ImageSet) -> set[bytes]:
    """Each image's bytes with its label: what identifies an image across subsets."""
    return {
        bytes(img.numpy().tobytes()) + bytes([int(lab)])
        for img, lab in zip(split.images, split.labels)
    }


@pytest.fixture
def suite(write_suite):
    from tests.conftest import REPO

    return load_suite(write_suite(SUITE.format(repo=REPO)))


def test_calibration_images_are_never_trained_on_and_shared_by_every_method(suite, tmp_path):
    cells = suite.cells()
    assert {c.method for c in cells} == {"single", "deep_ensemble", "sigma_ens"}
    seen = None
    for cell in cells:
        _, splits = load_data(cell, tmp_path)
        cal, train = splits["calibration"], splits["train"]
        assert len(cal) == 300
        # disjoint from every training index the cell used, and from the test set: no image of
        # the calibration split is among them (digits_hard images are distinct enough that
        # duplicates would show; checked on the bytes, not only the indices)
        assert not _rows(cal) & _rows(train)
        assert not _rows(cal) & _rows(splits["test"])
        rows = _rows(cal)
        if seen is None:
            seen = (cal.images.clone(), cal.labels.clone())
        else:  # the same images in the same order for every method and seed
            assert torch.equal(cal.images, seen[0]) and torch.equal(cal.labels, seen[1])
        assert len(rows) > 250  # mostly distinct images (4×4 digits can coincide)
        # stratified: every class is represented
        assert set(cal.labels.tolist()) == set(range(8))


def test_spare_images_are_what_the_dataset_declares(tmp_path):
    spec = DATASETS.get("digits_hard")
    splits = spec.load(tmp_path)
    assert len(splits["spare"]) == spec.spare_images
    # the pool stays few-shot: 15 per class, and the spare images are outside it
    assert len(splits["train"]) == 120
    pool = _rows(splits["train"])
    spare_idx_overlap = [r for r in _rows(splits["spare"]) if r in pool]
    # a reduced 4×4 digit can equal another image's reduction; the indices never overlap
    assert len(spare_idx_overlap) < 5


def test_validation_comes_from_spare_images_and_calibration_from_the_rest():
    labels = torch.arange(3).repeat(100)  # 300 spare images of 3 classes
    ids = torch.arange(1000, 1300)  # each image's content is its id, in two uint8 channels
    spare = ImageSet(
        torch.stack([ids // 256, ids % 256], 1).view(-1, 2, 1, 1).to(torch.uint8), labels
    )
    pool = ImageSet(torch.zeros(60, 2, 1, 1, dtype=torch.uint8), torch.arange(3).repeat(20))
    test = ImageSet(torch.ones(30, 2, 1, 1, dtype=torch.uint8), torch.arange(3).repeat(10))
    out = training_splits({"train": pool, "test": test, "spare": spare}, 60, calibration=90)
    assert len(out["train"]) == 60  # the pool trains whole
    assert len(out["val"]) == 60 and len(out["calibration"]) == 90

    def idset(split):
        return {int(a) * 256 + int(b) for a, b in split.images.view(-1, 2).tolist()}

    assert not idset(out["val"]) & idset(out["calibration"])
    assert out["calibration"].labels.bincount().tolist() == [30, 30, 30]
    with pytest.raises(ValueError, match=r"calibration must be in \[1, 240\]"):
        training_splits({"train": pool, "test": test, "spare": spare}, 60, calibration=241)
    with pytest.raises(ValueError, match="no spare images"):
        training_splits({"train": pool, "test": test}, 0, calibration=10)


def test_validate_refuses_calibration_without_a_split(write_suite):
    from tests.conftest import REPO

    text = SUITE.format(repo=REPO).replace("  calibration: 300\n", "")
    path = write_suite(text)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "evaluation.calibrate" in lines[0]
    assert "evaluation.calibration: N" in lines[0] and "recipe.validation: N" in lines[0]
    assert "Traceback" not in proc.stderr


def test_validate_refuses_more_calibration_images_than_spare(write_suite):
    from tests.conftest import REPO

    path = write_suite(SUITE.format(repo=REPO).replace("calibration: 300", "calibration: 5000"))
    from harness.config.includes import SuiteError

    with pytest.raises(SuiteError, match="only 1034 spare images"):
        load_suite(path)


def test_a_validation_split_serves_calibration(write_suite, tmp_path):
    from tests.conftest import REPO

    text = SUITE.format(repo=REPO).replace("  calibration: 300\n", "")
    text += "recipe:\n  validation: 200\n"
    cell = load_suite(write_suite(text)).cells()[0]
    _, splits = load_data(cell, tmp_path)
    assert "calibration" not in splits and len(splits["val"]) == 200
    assert len(splits["train"]) == 120  # from the spare images: the few-shot pool is whole


def test_conformal_alpha_takes_one_value_or_a_list(write_suite):
    """``evaluation.conformal_alpha``: a number (every existing suite) or a list of distinct
    values in (0, 1); a cell's JSON carries the list back as it was given."""
    from harness.config.includes import SuiteError
    from harness.contract import Cell
    from tests.conftest import REPO

    base = SUITE.format(repo=REPO)
    assert load_suite(write_suite(base)).evaluation.conformal_alpha == 0.1
    one = load_suite(write_suite(base + "  conformal_alpha: 0.2\n"))
    assert one.evaluation.conformal_alpha == 0.2
    several = load_suite(write_suite(base + "  conformal_alpha: [0.05, 0.1, 0.2]\n"))
    assert several.evaluation.conformal_alpha == (0.05, 0.1, 0.2)
    cell = several.cells()[0]
    data = cell.to_json()
    assert data["evaluation"]["conformal_alpha"] == [0.05, 0.1, 0.2]
    assert Cell.from_json(data).evaluation.conformal_alpha == (0.05, 0.1, 0.2)
    assert Cell.from_json(data, validated=True).evaluation.conformal_alpha == (0.05, 0.1, 0.2)
    with pytest.raises(SuiteError, match=r"evaluation.conformal_alpha: must be < 1, got 1.5"):
        load_suite(write_suite(base + "  conformal_alpha: [0.1, 1.5]\n"))
    with pytest.raises(SuiteError, match=r"conformal_alpha: \[0.1, 0.1\] repeats a value"):
        load_suite(write_suite(base + "  conformal_alpha: [0.1, 0.1]\n"))
    with pytest.raises(SuiteError, match="conformal_alpha: an empty list"):
        load_suite(write_suite(base + "  conformal_alpha: []\n"))
