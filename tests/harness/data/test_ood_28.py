"""The 28×28 OOD partners: real offline sets in MNIST's framing, their statistics, the font
location and its missing-data message, KMNIST's idx files, and their near/far groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.data import ood_28
from harness.data._machinery.base import DataMissingError
from harness.registry import DATASETS
from reports.records.flatten import ood_kind
from tests import fabricate

OFFLINE = ("digits_28", "letters_28", "photos_28")


@pytest.mark.parametrize(
    ("name", "count"),
    [("digits_28", 1797), ("letters_28", 1080), ("photos_28", 2000)],
)
def test_offline_sets_are_28x28_grey_with_their_statistics(name, count):
    spec = DATASETS.get(name)
    assert spec.num_classes is None and spec.in_shape == (1, 28, 28)
    spec.require(None)
    out = spec.load(None)["test"]
    assert out.images.shape == (count, 1, 28, 28) and out.images.dtype == torch.uint8
    x = out.images.float() / 255
    assert (x.mean().item(), x.std().item()) == pytest.approx((spec.mean[0], spec.std[0]), abs=2e-4)


@pytest.mark.parametrize("name", ["digits_28", "letters_28"])
def test_glyph_sets_have_mnists_4_pixel_black_border(name):
    images = DATASETS.get(name).load(None)["test"].images[:, 0]
    border = torch.ones(28, 28, dtype=torch.bool)
    border[4:24, 4:24] = False
    assert images[:, border].max() == 0
    assert images[:, 4:24, 4:24].amax((1, 2)).min() > 100  # every glyph has ink


def test_digits_28_are_sklearns_digits_in_order():
    from sklearn.datasets import load_digits

    out = DATASETS.get("digits_28").load(None)["test"]
    np.testing.assert_array_equal(out.labels.numpy(), load_digits().target)
    # Resizing keeps the glyph: the 20×20 box, averaged back to 8×8, correlates with the source.
    box = out.images[:, :, 4:24, 4:24].float()
    back = torch.nn.functional.interpolate(box, size=(8, 8), mode="area").flatten(1)
    src = torch.from_numpy(load_digits().images * 255 / 16).float().flatten(1)
    back, src = back - back.mean(1, keepdim=True), src - src.mean(1, keepdim=True)
    corr = (back * src).sum(1) / (back.norm(dim=1) * src.norm(dim=1))
    assert corr.mean() > 0.9


def test_letters_cover_every_letter_font_angle_and_size():
    out = DATASETS.get("letters_28").load(None)["test"]
    per_letter = len(ood_28.FONTS) * len(ood_28.LETTER_ANGLES) * len(ood_28.LETTER_SCALES)
    assert out.labels.bincount().tolist() == [per_letter] * 10
    assert len(torch.unique(out.images.flatten(1), dim=0)) == len(out)  # no two alike


def test_photo_patches_are_stretched_and_not_flat():
    images = DATASETS.get("photos_28").load(None)["test"].images.flatten(1)
    assert (images.amin(1) == 0).all() and (images.amax(1) == 255).all()
    assert (DATASETS.get("photos_28").load(None)["test"].labels == -1).all()


def test_missing_fonts_name_the_debian_package(tmp_path, monkeypatch):
    monkeypatch.setenv(ood_28.FONT_DIR_ENV, str(tmp_path))
    with pytest.raises(DataMissingError, match=r"apt-get install fonts-dejavu-core"):
        DATASETS.get("letters_28").require(None)


def test_kmnist_reads_torchvisions_layout(tmp_path):
    raw = tmp_path / "KMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 3), ("t10k", 7)):
        fabricate._idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        fabricate._idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    spec = DATASETS.get("kmnist")
    spec.require(tmp_path)
    out = spec.load(tmp_path)["test"]
    assert out.images.shape == (7, 1, 28, 28)
    assert out.labels.tolist() == list(range(7))
    with pytest.raises(DataMissingError, match=r"harness data download kmnist"):
        spec.require(tmp_path / "elsewhere")


@pytest.mark.parametrize("dataset", ["fashion_mnist", "fashion_mnist_10k"])
def test_near_and_far_groups_of_fashion_mnist(dataset):
    """The dataset declares OpenOOD's MNIST-benchmark split when it registers; a record written
    by the engine carries the evaluated sets' groups, and the reporter reads them from it."""
    from harness.contract import Evaluation
    from harness.engine.build import record_evaluation
    from tests.harness.contract.test_contract import make_cell

    sets = ("mnist", "kmnist", "digits_28", "letters_28", "photos_28", "svhn")
    cell = make_cell(dataset=dataset, evaluation=Evaluation(ood=sets))
    record = {"evaluation": record_evaluation(cell)}
    assert record["evaluation"]["ood_groups"] == {
        **dict.fromkeys(sets[:4], "near"),
        "photos_28": "far",
    }  # svhn is in neither group
    for near in ("mnist", "kmnist", "digits_28", "letters_28"):
        assert ood_kind(near, record) == "near"
    assert ood_kind("photos_28", record) == "far"
    assert ood_kind("svhn", record) is None and ood_kind("mnist", {}) is None
