"""The built-in benchmark: digits splits, shipped OOD partners, corrupted copies, the loader."""

from __future__ import annotations

import pytest
import torch

from harness.data._machinery.base import ImageSet, stratified_split
from harness.data._machinery.corruptions import applicable_corruptions, corrupted_split
from harness.data._machinery.loader import DeviceLoader, crop_flip
from harness.data.digits import (
    DIGITS_MEAN,
    DIGITS_STD,
    load_digits_splits,
    load_heldout,
    load_photo_patches,
)


def test_fixed_stratified_split_of_classes_0_to_7():
    s = load_digits_splits()
    assert {k: len(v) for k, v in s.items()} == {"train": 938, "val": 216, "test": 289}
    for split in s.values():
        assert split.images.shape[1:] == (1, 8, 8) and split.images.dtype == torch.uint8
        assert set(split.labels.tolist()) == set(range(8))
    assert sum(len(v) for v in s.values()) == 1797 - 354  # every image of classes 0-7
    again = load_digits_splits.__wrapped__()
    assert torch.equal(again["test"].images, s["test"].images)  # split does not depend on seed


def test_stratified_split_is_a_partition():
    labels = torch.arange(100) % 4
    parts = stratified_split(labels, (0.6, 0.2, 0.2), seed=0)
    joined = torch.cat(parts).sort().values
    assert torch.equal(joined, torch.arange(100))  # disjoint and complete
    assert [len(p) for p in parts] == [60, 20, 20]
    assert all(torch.bincount(labels[p]).tolist() == [len(p) // 4] * 4 for p in parts)


def test_normalisation_constants_are_train_statistics():
    x = load_digits_splits()["train"].images.float() / 255
    assert abs(x.mean().item() - DIGITS_MEAN[0]) < 1e-3
    assert abs(x.std().item() - DIGITS_STD[0]) < 1e-3


def test_ood_partners_are_real_and_shaped_like_digits():
    near = load_heldout()["test"]
    assert len(near) == 354 and near.images.shape[1:] == (1, 8, 8)  # all real 8s and 9s
    far = load_photo_patches()["test"]
    assert len(far) == 600 and far.images.shape[1:] == (1, 8, 8)
    flat = far.images.float().flatten(1)
    assert (flat.amax(1) == 255).all() and (flat.amin(1) == 0).all()  # full range, like digits
    assert flat.std(1).min() > 20  # textured patches, not flat sky


def test_every_applicable_corruption_is_generated_at_five_severities(tmp_path):
    test = load_digits_splits()["test"]
    names = applicable_corruptions((1, 8, 8))
    assert {
        "gaussian_noise",
        "shot_noise",
        "impulse_noise",
        "contrast",
        "pixelate",
        "jpeg_compression",
        "fog",
        "frost",
        "brightness",
        "zoom_blur",
        "speckle_noise",
    } <= set(names)
    diffs = []
    for sev in range(1, 6):
        c = corrupted_split("digits", tmp_path, test, "gaussian_noise", sev)
        assert c.images.shape == test.images.shape and torch.equal(c.labels, test.labels)
        diffs.append((c.images.float() - test.images.float()).abs().mean().item())
    assert diffs == sorted(diffs) and diffs[0] > 0  # stronger with severity
    assert (tmp_path / "generated-c" / "digits" / "gaussian_noise.npy").exists()


def test_loader_same_order_for_every_consumer_and_normalised():
    data = load_digits_splits()["train"]
    kw = dict(
        batch_size=64,
        device=torch.device("cpu"),
        mean=DIGITS_MEAN,
        std=DIGITS_STD,
        shuffle=True,
        seed=3,
    )
    a, b = DeviceLoader(data, **kw), DeviceLoader(data, **kw)
    a.set_epoch(1)
    b.set_epoch(1)
    ya = torch.cat([y for _, y in a])
    yb = torch.cat([y for _, y in b])
    assert torch.equal(ya, yb)
    b.set_epoch(2)
    assert not torch.equal(ya, torch.cat([y for _, y in b]))
    x, _ = next(
        iter(
            DeviceLoader(
                data,
                batch_size=len(data),
                device=torch.device("cpu"),
                mean=DIGITS_MEAN,
                std=DIGITS_STD,
            )
        )
    )
    assert abs(x.mean().item()) < 1e-2 and abs(x.std().item() - 1) < 1e-2


def test_crop_flip_is_a_shifted_mirrored_window():
    img = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).repeat(64, 1, 1, 1)
    g = torch.Generator().manual_seed(0)
    oy, ox = (torch.randint(0, 3, (64,), generator=g) for _ in range(2))
    out = crop_flip(img, oy, ox, torch.rand(64, generator=g) < 0.5, pad=1)
    assert out.shape == img.shape
    flipped = [torch.equal(o[0, 1:3, 1:3], img[0, 0, 1:3, 1:3].flip(-1)) for o in out]
    plain = [torch.equal(o[0, 1:3, 1:3], img[0, 0, 1:3, 1:3]) for o in out]
    assert any(flipped) and any(plain)  # both flips happen over 64 draws
    # every output is a window of the zero-padded image, possibly mirrored
    padded = torch.nn.functional.pad(img[0, 0], (1, 1, 1, 1))
    windows = {
        tuple(padded[i : i + 4, j : j + 4].flatten().tolist()) for i in range(3) for j in range(3)
    }
    windows |= {
        tuple(padded[i : i + 4, j : j + 4].flip(-1).flatten().tolist())
        for i in range(3)
        for j in range(3)
    }
    assert all(tuple(o[0].flatten().tolist()) in windows for o in out)
    assert isinstance(ImageSet(out, torch.zeros(64)), ImageSet)


def test_digits_hard_is_few_shot_and_reduced_resolution():
    from harness.data.digits import (
        HARD_MEAN,
        HARD_STD,
        load_digits_hard_splits,
        load_heldout_hard,
        load_photo_patches_hard,
        reduce_resolution,
    )

    s = load_digits_hard_splits()
    # no val to merge into the pool; the digits it never trains on are spare (val/calibration)
    assert {k: len(v) for k, v in s.items()} == {"train": 120, "test": 289, "spare": 1034}
    assert torch.bincount(s["train"].labels).tolist() == [15] * 8
    full = load_digits_splits()
    assert torch.equal(s["test"].labels, full["test"].labels)  # the same test images...
    assert torch.equal(s["test"].images, reduce_resolution(full["test"].images))  # ...at 4×4
    for split in (*s.values(), load_heldout_hard()["test"], load_photo_patches_hard()["test"]):
        x = split.images
        assert x.shape[1:] == (1, 8, 8) and x.dtype == torch.uint8
        assert torch.equal(x[..., ::2, ::2].repeat_interleave(2, -2).repeat_interleave(2, -1), x)
    x = s["train"].images.float() / 255
    assert abs(x.mean().item() - HARD_MEAN[0]) < 1e-3 and abs(x.std().item() - HARD_STD[0]) < 1e-3


def test_reduce_resolution_averages_blocks():
    from harness.data.digits import reduce_resolution

    img = torch.arange(64, dtype=torch.uint8).view(1, 1, 8, 8)
    out = reduce_resolution(img, side=4)
    assert out[0, 0, 0, 0].item() == round((0 + 1 + 8 + 9) / 4)  # 4.5 rounds to even: 4
    assert torch.equal(out[0, 0, 0, :2], out[0, 0, 1, :2])  # one value per 2×2 block
    with pytest.raises(ValueError, match="not a multiple of 3"):
        reduce_resolution(img, side=3)


def test_digits_are_read_from_scikit_learns_file_as_load_digits_reads_them(monkeypatch):
    """The CSV scikit-learn ships is read directly (no import of sklearn.datasets, ~2 s of a
    cell's start-up) and gives load_digits' images and labels; without the file, load_digits."""
    from sklearn.datasets import load_digits

    from harness.data import digits

    bunch = load_digits()
    expected = (digits._to_uint8(bunch.images).unsqueeze(1), torch.from_numpy(bunch.target))
    assert digits._digits_csv() is not None and digits._digits_csv().name == "digits.csv.gz"
    for found in (digits._digits_csv, lambda: None):
        monkeypatch.setattr(digits, "_digits_csv", found)
        images, labels = digits._all_digits.__wrapped__()
        assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.uint8
        assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1].long())
