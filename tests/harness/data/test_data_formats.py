"""The real dataset loaders, run on tiny files fabricated in the exact on-disk formats."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.data import photo_sets
from harness.data import torchvision_sets as tvs
from harness.data._machinery import download as dl
from harness.data._machinery.base import (
    DataMissingError,
    ImageSet,
    stratified_holdout,
    training_splits,
)
from harness.registry import DATASETS
from tests import fabricate

OOD_SETS = ("svhn", "mnist", "textures", "places365", "tinyimagenet")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy()


# ---------------------------------------------------------------------------------------------
# CIFAR


def test_cifar10_reads_back_pixels_and_labels_and_keeps_every_training_image(tmp_path):
    written = fabricate.write_cifar10(tmp_path, train_per_class=10, test_per_class=3)
    spec = DATASETS.get("cifar10")
    assert spec.is_available(tmp_path)
    splits = spec.load(tmp_path)
    x_train, y_train = written["train"]
    x_test, y_test = written["test"]

    # The whole training set, in file order: published numbers train on all 50,000 images.
    assert set(splits) == {"train", "test"}
    np.testing.assert_array_equal(_np(splits["train"].images), x_train)
    np.testing.assert_array_equal(_np(splits["train"].labels), y_train)
    np.testing.assert_array_equal(_np(splits["test"].images), x_test)
    np.testing.assert_array_equal(_np(splits["test"].labels), y_test)
    assert splits["test"].images.shape == (30, 3, 32, 32)
    assert splits["test"].images.dtype == torch.uint8
    assert splits["test"].labels.dtype == torch.int64
    assert "train 50,000" in spec.description


def test_no_validation_split_unless_asked_and_then_stratified_seeded_and_exact(tmp_path):
    written = fabricate.write_cifar10(tmp_path, train_per_class=10, test_per_class=3)
    loaded = DATASETS.get("cifar10").load(tmp_path)
    y_train = torch.from_numpy(written["train"][1])

    none = training_splits(loaded, 0)
    assert set(none) == {"train", "test"} and len(none["train"]) == 100

    held = training_splits(loaded, 20)
    assert set(held) == {"train", "val", "test"}
    assert (len(held["train"]), len(held["val"])) == (80, 20)
    assert torch.bincount(held["val"].labels, minlength=10).tolist() == [2] * 10  # stratified
    idx = stratified_holdout(y_train, 20)
    np.testing.assert_array_equal(_np(held["val"].images), written["train"][0][idx.numpy()])
    rest = sorted(set(range(100)) - set(idx.tolist()))
    np.testing.assert_array_equal(_np(held["train"].labels), written["train"][1][rest])
    again = training_splits(DATASETS.get("cifar10").load(tmp_path), 20)  # fixed seed
    assert torch.equal(again["val"].images, held["val"].images)
    assert training_splits(loaded, 20, seed=1)["val"].labels.tolist() != []
    assert not torch.equal(training_splits(loaded, 20, seed=1)["val"].images, held["val"].images)
    assert torch.equal(held["test"].images, loaded["test"].images)


def test_holdout_counts_are_exact_with_uneven_classes_and_reject_bad_sizes():
    labels = torch.tensor([0] * 7 + [1] * 2 + [2] * 1)
    idx = stratified_holdout(labels, 5)
    # quotas 3.5 / 1.0 / 0.5 → floors 3, 1, 0 and one left over for the largest remainder (0).
    assert len(idx) == 5 and torch.bincount(labels[idx], minlength=3).tolist() == [4, 1, 0]
    for bad in (-1, 10, 2.5, True):
        with pytest.raises(ValueError, match=r"validation must be an integer in \[0, 10\)"):
            stratified_holdout(labels, bad)


def test_a_loaders_own_val_split_goes_back_into_the_training_pool():
    def part(lo: int, hi: int) -> ImageSet:
        return ImageSet(torch.zeros(hi - lo, 1, 2, 2, dtype=torch.uint8), torch.arange(lo, hi) % 2)

    loaded = {"train": part(0, 6), "val": part(6, 10), "test": part(10, 12)}
    out = training_splits(loaded, 0)
    assert set(out) == {"train", "test"} and len(out["train"]) == 10
    out = training_splits(loaded, 4)
    assert (len(out["train"]), len(out["val"])) == (6, 4)
    assert torch.bincount(out["val"].labels).tolist() == [2, 2]


def test_cifar10_load_is_deterministic_across_copies(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fabricate.write_cifar10(a, seed=11)
    fabricate.write_cifar10(b, seed=11)
    sa, sb = tvs.load_cifar("cifar10", a), tvs.load_cifar("cifar10", b)
    assert sa is not sb
    for split in ("train", "test"):
        assert torch.equal(sa[split].images, sb[split].images)
        assert torch.equal(sa[split].labels, sb[split].labels)


def test_cifar100_reads_fine_labels(tmp_path):
    written = fabricate.write_cifar100(tmp_path, train_per_class=10, test_per_class=1)
    splits = DATASETS.get("cifar100").load(tmp_path)
    x_test, y_test = written["test"]
    np.testing.assert_array_equal(_np(splits["test"].images), x_test)
    np.testing.assert_array_equal(_np(splits["test"].labels), y_test)
    np.testing.assert_array_equal(_np(splits["train"].labels), written["train"][1])
    assert len(splits["train"]) == 1000
    val = training_splits(splits, 100)["val"]
    assert torch.bincount(val.labels, minlength=100).tolist() == [1] * 100


def test_cifar_specs_declare_augmentation_normalisation_and_corruption_source():
    c10, c100 = DATASETS.get("cifar10"), DATASETS.get("cifar100")
    assert (c10.in_shape, c10.num_classes, c10.augment) == ((3, 32, 32), 10, "crop_flip")
    assert (c100.num_classes, c100.augment) == (100, "crop_flip")
    assert (c10.corruption_source, c100.corruption_source) == ("cifar10-c", "cifar100-c")
    assert c10.mean == pytest.approx((0.4914, 0.4822, 0.4465))
    assert c100.std == pytest.approx((0.2673, 0.2564, 0.2762))
    for name in OOD_SETS:
        spec = DATASETS.get(name)
        assert spec.num_classes is None
        assert len(spec.mean) == len(spec.std) == spec.in_shape[0]


def test_cifar_load_fails_on_a_truncated_folder(tmp_path):
    fabricate.write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    spec = DATASETS.get("cifar10")
    assert not spec.is_available(tmp_path)
    with pytest.raises(DataMissingError, match="cifar-10-batches-py"):
        spec.require(tmp_path)


# ---------------------------------------------------------------------------------------------
# OOD sets


def test_svhn_mat_reads_back_with_ten_mapped_to_zero(tmp_path):
    images, digits = fabricate.write_svhn(tmp_path, n=30)
    out = DATASETS.get("svhn").load(tmp_path)["test"]
    np.testing.assert_array_equal(_np(out.images), images)
    np.testing.assert_array_equal(_np(out.labels), digits)
    assert out.labels.min().item() == 0 and out.labels.max().item() == 9


def test_mnist_idx_files_read_back(tmp_path):
    images, labels = fabricate.write_mnist(tmp_path, n_test=12)
    out = DATASETS.get("mnist").load(tmp_path)["test"]
    assert out.images.shape == (12, 1, 28, 28)
    np.testing.assert_array_equal(_np(out.images), images)
    np.testing.assert_array_equal(_np(out.labels), labels)


def test_tinyimagenet_val_layout_reads_back_including_a_greyscale_jpeg(tmp_path):
    images, labels = fabricate.write_tinyimagenet(tmp_path, n=6)
    out = DATASETS.get("tinyimagenet").load(tmp_path)["test"]
    assert out.images.shape == (6, 3, 64, 64)
    np.testing.assert_array_equal(_np(out.images), images)
    np.testing.assert_array_equal(_np(out.labels), labels)
    grey = out.images[1]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])


def test_textures_reads_every_split_and_resizes_to_a_square(tmp_path):
    written, order = fabricate.write_dtd(tmp_path, per_split=2)
    out = DATASETS.get("textures").load(tmp_path)["test"]
    size = photo_sets.OOD_IMAGE_SIZE
    assert out.images.shape == (6, 3, size, size)
    classes = sorted({name.split("/")[0] for name in order})
    assert out.labels.tolist() == [classes.index(name.split("/")[0]) for name in order]
    for i, name in enumerate(order):  # images already 64×64 are read unchanged
        if written[name].shape[1:] == (size, size):
            np.testing.assert_array_equal(_np(out.images[i]), written[name])


def test_places365_val_reads_back_and_caps_deterministically(tmp_path):
    images, labels = fabricate.write_places365(tmp_path, n=5)
    out = DATASETS.get("places365").load(tmp_path)["test"]
    np.testing.assert_array_equal(_np(out.images), images)
    np.testing.assert_array_equal(_np(out.labels), labels)
    capped = photo_sets.load_places365(tmp_path, cap=3)["test"]
    assert torch.equal(capped.images, out.images[:3])
    assert "first 10,000" in DATASETS.get("places365").description


# ---------------------------------------------------------------------------------------------
# Missing data and downloads


@pytest.mark.parametrize("name", ["cifar10", "cifar100", *OOD_SETS])
def test_missing_data_names_the_path_and_the_fetch_command(tmp_path, name):
    spec = DATASETS.get(name)
    assert not spec.is_available(tmp_path)
    where = str(spec.location(tmp_path))
    assert where.startswith(str(tmp_path))
    with pytest.raises(DataMissingError, match=f"harness data download {name}`") as err:
        spec.require(tmp_path)
    assert where in str(err.value)


@pytest.mark.parametrize(
    ("name", "writer"),
    [
        ("cifar10", fabricate.write_cifar10),
        ("cifar100", fabricate.write_cifar100),
        ("svhn", fabricate.write_svhn),
        ("mnist", fabricate.write_mnist),
        ("textures", fabricate.write_dtd),
        ("places365", fabricate.write_places365),
        ("tinyimagenet", fabricate.write_tinyimagenet),
    ],
)
def test_fabricated_layout_is_recognised_as_available(tmp_path, name, writer):
    writer(tmp_path)
    spec = DATASETS.get(name)
    assert spec.is_available(tmp_path)
    spec.require(tmp_path)
    assert spec.location(tmp_path).exists()


def test_download_without_network_raises_a_clear_error(tmp_path, monkeypatch):
    def offline(url: str, dest: Path) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(dl, "_fetch_url", offline)
    with pytest.raises(dl.DownloadError, match=r"could not download cifar10-c .*no internet"):
        dl.download("cifar10-c", tmp_path)
    with pytest.raises(dl.DownloadError, match=r"tinyimagenet \(http://cs231n"):
        dl.download("tinyimagenet", tmp_path)


def test_download_via_torchvision_without_network_raises_a_clear_error(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as tv_cifar

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(tv_cifar, "download_and_extract_archive", offline)
    with pytest.raises(
        dl.DownloadError, match=r"could not download cifar10 .*network is unreachable"
    ):
        dl.download("cifar10", tmp_path)


def test_download_rejects_unknown_names_and_covers_every_fetch_command(tmp_path):
    with pytest.raises(ValueError, match=r"nothing to download for 'cifar11'.*cifar10-c"):
        dl.download("cifar11", tmp_path)
    for name in ("cifar10", "cifar100", *OOD_SETS):
        assert DATASETS.get(name).fetch == f"harness data download {name}"
        assert name in dl.downloadable()
    assert {"cifar10-c", "cifar100-c"} <= set(dl.downloadable())
