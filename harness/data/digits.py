"""The built-in offline benchmark: scikit-learn's real 8×8 handwritten digits.

`digits` is in-distribution on classes 0–7 (K=8) so that the real held-out digits 8 and 9 serve as
near-OOD (`digits_heldout`); far-OOD (`sklearn_photos`) are 8×8 grey patches of the two
photographs scikit-learn ships (`china.jpg`, `flower.jpg`). Everything is on disk with
scikit-learn, so the whole benchmark runs offline. The split is fixed (seed 0, stratified 65/15/20)
and never depends on the cell's seed, so every method and seed sees the same test set.

`digits_hard` is the same real data made hard enough that methods differ: every image (train, val,
test and both OOD partners alike, so sharpness cannot give OOD away) is reduced to 4×4 by area
averaging and shown back at 8×8 by pixel repetition, and the model trains on only
``HARD_TRAIN_PER_CLASS`` images per class (a fixed, seed-0 subset of `digits`' training split;
the test set is `digits`' test split). Measured with the 3-block CNN (SGD, 30 epochs,
batch 32): plain `digits` gives 99.9–100% test accuracy whatever the method, `digits_hard`
95.8–96.9% for a single model. Keeping 8×8 leaves the backbone, the corruptions and the OOD
partners of `digits` usable unchanged.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import numpy as np
import torch

from harness.data._machinery.base import DatasetSpec, ImageSet, register_dataset, stratified_split

ID_CLASSES = 8
SPLIT_SEED = 0
SPLIT_FRACTIONS = (0.65, 0.15, 0.20)
HARD_TRAIN_PER_CLASS = 15  # digits_hard: training images per class
HARD_SIDE = 4  # digits_hard: effective resolution (pixels per side)
# digits_hard: images of digits 0–7 outside its few-shot pool and test set (the `spare` split;
# `digits`' 65/15/20 split of 1,439 images leaves 1,150 train + val, 120 of them trained on).
HARD_SPARE = 1_034


def _to_uint8(values: np.ndarray) -> torch.Tensor:
    """scikit-learn's digits are 0..16 grey levels; map them onto 0..255."""
    return torch.from_numpy(np.round(values * (255.0 / 16.0))).to(torch.uint8)


def _digits_csv() -> Path | None:
    """scikit-learn's ``datasets/data/digits.csv.gz``, found without importing scikit-learn
    (``sklearn.datasets`` costs about 2 s of a cell's start-up), or None."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


@cache
def _all_digits() -> tuple[torch.Tensor, torch.Tensor]:
    path = _digits_csv()
    if path is not None:  # the file load_digits reads: 64 grey levels and the label per row
        data = np.loadtxt(path, delimiter=",")
        flat, target = data[:, :-1], data[:, -1].astype(int)
    else:  # a scikit-learn that keeps the file elsewhere
        from sklearn.datasets import load_digits

        bunch = load_digits()
        flat, target = bunch.data, bunch.target
    images = _to_uint8(flat.reshape(-1, 8, 8)).unsqueeze(1)  # (1797, 1, 8, 8)
    return images, torch.from_numpy(target).long()


@cache
def load_digits_splits(root: Path | None = None) -> dict[str, ImageSet]:
    """Fixed stratified train/val/test split of digits 0–7.

    Returns:
        {"train", "val", "test"}: ImageSet with uint8 (N, 1, 8, 8) images.
    """
    images, labels = _all_digits()
    keep = labels < ID_CLASSES
    images, labels = images[keep], labels[keep]
    parts = stratified_split(labels, SPLIT_FRACTIONS, SPLIT_SEED)
    return {
        name: ImageSet(images[idx], labels[idx])
        for name, idx in zip(("train", "val", "test"), parts)
    }


@cache
def load_heldout(root: Path | None = None) -> dict[str, ImageSet]:
    """Near-OOD: all real images of the held-out classes 8 and 9."""
    images, labels = _all_digits()
    keep = labels >= ID_CLASSES
    return {"test": ImageSet(images[keep], torch.full((int(keep.sum()),), -1))}


@cache
def load_photo_patches(root: Path | None = None, count: int = 600) -> dict[str, ImageSet]:
    """Far-OOD: 8×8 grey patches of scikit-learn's sample photographs, matched to digits' scale.

    Patches are cut at random (seeded) positions of the downscaled grey photographs; low-contrast
    (nearly flat) patches are dropped since a flat patch is trivially OOD and hides differences
    between methods.
    """
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(SPLIT_SEED)
    patches = []
    photos = load_sample_images().images  # two (427, 640, 3) uint8 photographs
    for img in photos:
        rgb = torch.from_numpy(np.array(img)).permute(2, 0, 1).float()  # (3, H, W)
        grey = (rgb * torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0)  # (H, W)
        # Downscale 4× so one 8×8 patch covers a 32×32 region, like a digit's whole glyph.
        small = torch.nn.functional.avg_pool2d(grey[None, None], 4)[0, 0]  # (H/4, W/4)
        h, w = small.shape
        taken = 0
        while taken < count // len(photos):
            y, x = rng.integers(0, h - 8), rng.integers(0, w - 8)
            p = small[y : y + 8, x : x + 8]  # (8, 8)
            if p.std() > 20:
                patches.append(p)
                taken += 1
    pt = torch.stack(patches[:count])  # (N, 8, 8)
    lo = pt.amin((1, 2), keepdim=True)
    hi = pt.amax((1, 2), keepdim=True)
    pt = (pt - lo) / (hi - lo).clamp_min(1) * 255  # digits use the full 0..255 range
    images = pt.round().to(torch.uint8).unsqueeze(1)  # (N, 1, 8, 8)
    return {"test": ImageSet(images, torch.full((len(images),), -1))}


def reduce_resolution(images: torch.Tensor, side: int = HARD_SIDE) -> torch.Tensor:
    """Area-average uint8 (N, C, H, W) images to side×side, then repeat pixels back to H×W.

    Returns:
        uint8 (N, C, H, W) holding only side×side distinct values per image (H, W must be
        multiples of ``side``).
    """
    h, w = images.shape[-2:]
    if h % side or w % side:
        raise ValueError(f"image size {h}×{w} is not a multiple of {side}")
    x = torch.nn.functional.avg_pool2d(images.float(), (h // side, w // side))  # (N, C, s, s)
    x = x.repeat_interleave(h // side, dim=-2).repeat_interleave(w // side, dim=-1)
    return x.round().clamp(0, 255).to(torch.uint8)  # (N, C, H, W)


def _reduced(split: ImageSet) -> ImageSet:
    return ImageSet(reduce_resolution(split.images), split.labels)


@cache
def load_digits_hard_splits(root: Path | None = None) -> dict[str, ImageSet]:
    """`digits_hard`: reduced-resolution digits 0–7, ``HARD_TRAIN_PER_CLASS`` training images per
    class (fixed seed-0 subset of the `digits` training split) and `digits`' test split.

    Returns:
        {"train", "test"}: ImageSet with uint8 (N, 1, 8, 8) images of 4×4 content (120, 289).
    """
    full = load_digits_splits(root)
    train = full["train"]
    g = torch.Generator().manual_seed(SPLIT_SEED)
    keep = []
    for cls in range(ID_CLASSES):
        idx = (train.labels == cls).nonzero().flatten()
        keep.append(idx[torch.randperm(len(idx), generator=g)[:HARD_TRAIN_PER_CLASS]])
    idx = torch.cat(keep).sort().values
    few = ImageSet(train.images[idx], train.labels[idx])
    rest = torch.ones(len(train), dtype=torch.bool)
    rest[idx] = False
    spare = ImageSet(
        torch.cat([train.images[rest], full["val"].images]),
        torch.cat([train.labels[rest], full["val"].labels]),
    )
    # No "val": a loader's val joins the training pool
    # (harness.data._machinery.base.training_splits), and the pool must stay few-shot. The digits
    # it does not train on are `spare`: a recipe's `validation: n` and an evaluation's
    # `calibration: n` are drawn from them.
    return {"train": _reduced(few), "test": _reduced(full["test"]), "spare": _reduced(spare)}


@cache
def load_heldout_hard(root: Path | None = None) -> dict[str, ImageSet]:
    """Near-OOD of `digits_hard`: the held-out 8s and 9s at the same reduced resolution."""
    return {"test": _reduced(load_heldout(root)["test"])}


@cache
def load_photo_patches_hard(root: Path | None = None) -> dict[str, ImageSet]:
    """Far-OOD of `digits_hard`: the photo patches at the same reduced resolution."""
    return {"test": _reduced(load_photo_patches(root)["test"])}


def _sklearn_path(root: Path) -> Path:
    import sklearn

    return Path(sklearn.__file__).parent / "datasets" / "data"


# Train-split statistics of the uint8-scaled images (computed once; checked by
# tests/harness/data/test_digits.py).
DIGITS_MEAN = (0.3027,)
DIGITS_STD = (0.3767,)
HARD_MEAN = (0.3026,)
HARD_STD = (0.3037,)

register_dataset(
    DatasetSpec(
        name="digits",
        in_shape=(1, 8, 8),
        num_classes=ID_CLASSES,
        mean=DIGITS_MEAN,
        std=DIGITS_STD,
        load=load_digits_splits,
        location=_sklearn_path,
        description="built-in: scikit-learn's 8×8 handwritten digits 0–7 (offline)",
        # the held-out digits 8 and 9 are a semantic shift; photo patches other image statistics
        ood_groups={"digits_heldout": "near", "sklearn_photos": "far"},
    )
)
register_dataset(
    DatasetSpec(
        name="digits_heldout",
        in_shape=(1, 8, 8),
        num_classes=None,
        mean=DIGITS_MEAN,
        std=DIGITS_STD,
        load=load_heldout,
        location=_sklearn_path,
        description="built-in near-OOD for digits: the real held-out digits 8 and 9",
    )
)
register_dataset(
    DatasetSpec(
        name="sklearn_photos",
        in_shape=(1, 8, 8),
        num_classes=None,
        mean=DIGITS_MEAN,
        std=DIGITS_STD,
        load=load_photo_patches,
        location=_sklearn_path,
        description="built-in far-OOD for digits: 8×8 patches of scikit-learn's sample photos",
    )
)
register_dataset(
    DatasetSpec(
        name="digits_hard",
        in_shape=(1, 8, 8),
        num_classes=ID_CLASSES,
        mean=HARD_MEAN,
        std=HARD_STD,
        load=load_digits_hard_splits,
        location=_sklearn_path,
        spare_images=HARD_SPARE,
        description=(
            f"built-in, unsaturated: digits 0–7 at {HARD_SIDE}×{HARD_SIDE} resolution, "
            f"{HARD_TRAIN_PER_CLASS} training images per class (offline)"
        ),
    )
)
register_dataset(
    DatasetSpec(
        name="digits_hard_heldout",
        in_shape=(1, 8, 8),
        num_classes=None,
        mean=HARD_MEAN,
        std=HARD_STD,
        load=load_heldout_hard,
        location=_sklearn_path,
        description="built-in near-OOD for digits_hard: held-out digits 8, 9 at its resolution",
    )
)
register_dataset(
    DatasetSpec(
        name="sklearn_photos_hard",
        in_shape=(1, 8, 8),
        num_classes=None,
        mean=HARD_MEAN,
        std=HARD_STD,
        load=load_photo_patches_hard,
        location=_sklearn_path,
        description="built-in far-OOD for digits_hard: the photo patches at its resolution",
    )
)
