"""The field's standard benchmark sets, read with torchvision's own parsers from the usual layouts.

In-distribution: CIFAR-10 and CIFAR-100 (train/val held out from the official training set,
test = the official test set). OOD-only: SVHN, MNIST, Textures (DTD), Places365, TinyImageNet.

Nothing here downloads: loaders run with ``download=False`` and every spec's ``is_available``
only checks that the files exist. ``harness data download NAME`` (:mod:`harness.data.download`)
fetches them on a machine with internet.

torchvision md5-checks every CIFAR/SVHN/Places365 file each time a dataset object is built
(170 MB hashed per CIFAR load). The archives are md5-checked once, when they are downloaded;
loading then uses small subclasses that only check that the files exist, so the parsing is still
torchvision's own (and the tests can run it on fabricated files in the same formats).

Memory: OOD-only sets with large or variable-size images (DTD: up to 640×640; Places365: 256×256,
36,500 validation images = 7 GB as uint8) are centre-cropped to a square and resized once at load
time to ``OOD_IMAGE_SIZE``; the harness then adapts every OOD set to the in-distribution shape with
:func:`harness.data.base.adapt_images`. Places365 is capped to its first ``PLACES365_CAP``
validation images (file-list order, deterministic).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from harness.data.base import DatasetSpec, ImageSet, register_dataset, stratified_split

# The validation split is held out from the official training set once, for every method and seed.
CIFAR_SPLIT_SEED = 0
CIFAR_VAL_FRACTION = 0.1  # 45,000 train / 5,000 val, 10 % of each class
OOD_IMAGE_SIZE = 64
PLACES365_CAP = 10_000
_LOAD_THREADS = min(8, os.cpu_count() or 1)

# Per-channel mean/std of the training images on the [0, 1] scale (the true pixel std, not the
# 0.2023/0.1994/0.2010 values that circulate for CIFAR-10).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
# OOD-only sets are normalised with the in-distribution set's statistics; these are their own,
# for completeness (SVHN/MNIST: their training sets; the photo sets: ImageNet's).
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _fetch(name: str) -> str:
    return f"harness data download {name}"


def _all_files(folder: Path, names: Sequence[str]) -> bool:
    return all((folder / n).is_file() for n in names)


def _hwc_to_set(data: np.ndarray, labels: Sequence[int] | np.ndarray) -> ImageSet:
    """uint8 (N, H, W, C) numpy → ImageSet with uint8 (N, C, H, W)."""
    # torchvision's CIFAR .data is a HWC view of CHW rows: transposing back costs no copy.
    images = torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))
    return ImageSet(images, torch.as_tensor(np.asarray(labels), dtype=torch.int64))


# --------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100


@lru_cache(maxsize=1)
def _cifar_classes():
    """torchvision's CIFAR classes with the per-load md5 check replaced by an existence check."""
    from torchvision.datasets import CIFAR10, CIFAR100

    def check_files(self) -> bool:
        folder = Path(self.root) / self.base_folder
        names = [n for n, _ in self.train_list + self.test_list] + [self.meta["filename"]]
        return _all_files(folder, names)

    def load_meta(self) -> None:
        import pickle

        path = Path(self.root) / self.base_folder / self.meta["filename"]
        with open(path, "rb") as f:
            self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    overrides = {"_check_integrity": check_files, "_load_meta": load_meta}
    return (
        type("CIFAR10ExistsOnly", (CIFAR10,), overrides),
        type("CIFAR100ExistsOnly", (CIFAR100,), overrides),
    )


_CIFAR = {
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"],
    ),
    "cifar100": ("cifar-100-python", ["train", "test", "meta"]),
}


@lru_cache(maxsize=2)
def _load_cifar_cached(name: str, root: str) -> dict[str, ImageSet]:
    cls = _cifar_classes()[0 if name == "cifar10" else 1]
    train = cls(root, train=True, download=False)
    test = cls(root, train=False, download=False)
    full = _hwc_to_set(train.data, train.targets)
    tr_idx, val_idx = stratified_split(
        full.labels, (1 - CIFAR_VAL_FRACTION, CIFAR_VAL_FRACTION), CIFAR_SPLIT_SEED
    )
    return {
        "train": ImageSet(full.images[tr_idx], full.labels[tr_idx]),
        "val": ImageSet(full.images[val_idx], full.labels[val_idx]),
        "test": _hwc_to_set(test.data, test.targets),
    }


def load_cifar(name: str, root: Path) -> dict[str, ImageSet]:
    """CIFAR-10/100 as {"train" (45k), "val" (5k, stratified, fixed seed), "test" (10k)}."""
    return _load_cifar_cached(name, str(Path(root).expanduser().resolve()))


def _cifar_spec(name: str, num_classes: int, mean, std) -> DatasetSpec:
    folder, files = _CIFAR[name]
    return DatasetSpec(
        name=name,
        in_shape=(3, 32, 32),
        num_classes=num_classes,
        mean=mean,
        std=std,
        load=lambda root: load_cifar(name, root),
        location=lambda root: Path(root) / folder,
        fetch=_fetch(name),
        augment="crop_flip",
        corruption_source=f"{name}-c",
        description=(
            f"CIFAR-{num_classes} (torchvision, {folder}/): train 45,000 / val 5,000 held out of "
            f"the training set (stratified, seed {CIFAR_SPLIT_SEED}) / test 10,000; "
            f"corruptions from CIFAR-{num_classes}-C"
        ),
        is_available=lambda root: _all_files(Path(root) / folder, files),
    )


register_dataset(_cifar_spec("cifar10", 10, CIFAR10_MEAN, CIFAR10_STD))
register_dataset(_cifar_spec("cifar100", 100, CIFAR100_MEAN, CIFAR100_STD))


# --------------------------------------------------------------------------------------------
# SVHN (test split) and MNIST (test split): numpy arrays, no per-image loop


def _svhn_root(root: Path) -> Path:
    return Path(root) / "svhn"


@lru_cache(maxsize=1)
def _load_svhn_cached(root: str) -> dict[str, ImageSet]:
    from torchvision.datasets import SVHN

    # Existence check instead of the per-load md5 of the 64 MB .mat (checked at download).
    cls = type(
        "SVHNExistsOnly",
        (SVHN,),
        {"_check_integrity": lambda self: (Path(self.root) / self.filename).is_file()},
    )
    ds = cls(root, split="test", download=False)  # data: (N, 3, 32, 32), labels 0..9
    return {"test": ImageSet(torch.from_numpy(ds.data).contiguous(), torch.from_numpy(ds.labels))}


def load_svhn(root: Path) -> dict[str, ImageSet]:
    """SVHN test split (26,032 images, 3×32×32); labels are the digits (torchvision maps 10→0)."""
    return _load_svhn_cached(str(_svhn_root(root).expanduser().resolve()))


register_dataset(
    DatasetSpec(
        name="svhn",
        in_shape=(3, 32, 32),
        num_classes=None,
        mean=SVHN_MEAN,
        std=SVHN_STD,
        load=load_svhn,
        location=lambda root: _svhn_root(root) / "test_32x32.mat",
        fetch=_fetch("svhn"),
        description="OOD: SVHN test split (torchvision, svhn/test_32x32.mat), 26,032 images",
        is_available=lambda root: (_svhn_root(root) / "test_32x32.mat").is_file(),
    )
)

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@lru_cache(maxsize=1)
def _load_mnist_cached(root: str) -> dict[str, ImageSet]:
    from torchvision.datasets import MNIST

    ds = MNIST(root, train=False, download=False)  # data: uint8 (N, 28, 28)
    return {"test": ImageSet(ds.data.unsqueeze(1).contiguous(), ds.targets.long())}


def load_mnist(root: Path) -> dict[str, ImageSet]:
    """MNIST test split (10,000 images, 1×28×28) from the raw idx files."""
    return _load_mnist_cached(str(Path(root).expanduser().resolve()))


register_dataset(
    DatasetSpec(
        name="mnist",
        in_shape=(1, 28, 28),
        num_classes=None,
        mean=MNIST_MEAN,
        std=MNIST_STD,
        load=load_mnist,
        location=lambda root: Path(root) / "MNIST" / "raw",
        fetch=_fetch("mnist"),
        description="OOD: MNIST test split (torchvision, MNIST/raw idx files), 10,000 images",
        # torchvision's MNIST wants all four raw files, the training ones included.
        is_available=lambda root: _all_files(Path(root) / "MNIST" / "raw", _MNIST_FILES),
    )
)


# --------------------------------------------------------------------------------------------
# Photo sets stored as image files: DTD, Places365, TinyImageNet


def _read_image(path: str | Path, size: int | None) -> np.ndarray:
    """One image file → uint8 (H, W, 3); centre-cropped to a square and resized when size is set."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        if size is not None and im.size != (size, size):
            w, h = im.size
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            im = im.crop((left, top, left + side, top + side))
            im = im.resize((size, size), Image.BILINEAR, reducing_gap=None)  # antialiased
        return np.asarray(im, dtype=np.uint8)


def _read_images(paths: Sequence[str | Path], size: int | None) -> torch.Tensor:
    """Image files → uint8 (N, 3, H, W) (decoding threads release the GIL)."""
    if not paths:
        return torch.zeros((0, 3, size or 1, size or 1), dtype=torch.uint8)
    with ThreadPoolExecutor(_LOAD_THREADS) as pool:
        arrays = list(pool.map(lambda p: _read_image(p, size), paths))
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _dtd_folder(root: Path) -> Path:
    return Path(root) / "dtd" / "dtd"  # torchvision's DTD layout: <root>/dtd/dtd/{images,labels}


@lru_cache(maxsize=1)
def _load_textures_cached(root: str, size: int) -> dict[str, ImageSet]:
    from torchvision.datasets import DTD

    files, labels = [], []
    # All 5,640 images, as in the OOD literature: partition 1's train+val+test cover each once.
    for split in ("train", "val", "test"):
        ds = DTD(root, split=split, partition=1, download=False)
        files += ds._image_files
        labels += ds._labels
    return {"test": ImageSet(_read_images(files, size), torch.tensor(labels, dtype=torch.int64))}


def load_textures(root: Path, size: int = OOD_IMAGE_SIZE) -> dict[str, ImageSet]:
    """DTD (all 5,640 images), centre-cropped and resized to size×size."""
    return _load_textures_cached(str(Path(root).expanduser().resolve()), size)


def _textures_available(root: Path) -> bool:
    folder = _dtd_folder(root)
    return (
        _all_files(folder / "labels", [f"{s}1.txt" for s in ("train", "val", "test")])
        and (folder / "images").is_dir()
    )


register_dataset(
    DatasetSpec(
        name="textures",
        in_shape=(3, OOD_IMAGE_SIZE, OOD_IMAGE_SIZE),
        num_classes=None,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        load=load_textures,
        location=_dtd_folder,
        fetch=_fetch("textures"),
        description=(
            f"OOD: Textures/DTD (torchvision, dtd/dtd/), all 5,640 images, centre-cropped and "
            f"resized to {OOD_IMAGE_SIZE}×{OOD_IMAGE_SIZE} at load time"
        ),
        is_available=_textures_available,
    )
)

_PLACES_FILES = ("categories_places365.txt", "places365_val.txt")


def _places_root(root: Path) -> Path:
    return Path(root) / "places365"


@lru_cache(maxsize=1)
def _load_places_cached(root: str, size: int, cap: int | None) -> dict[str, ImageSet]:
    from torchvision.datasets import Places365

    def exists_only(self, file: str, md5: str, download: bool) -> bool:
        # The devkit text files are md5-checked at download; here only their presence matters.
        return Places365._check_integrity(self, file, None, download)

    cls = type("Places365ExistsOnly", (Places365,), {"_check_integrity": exists_only})
    ds = cls(root, split="val", small=True, download=False)
    pairs = ds.imgs if cap is None else ds.imgs[:cap]
    files = [f for f, _ in pairs]
    labels = torch.tensor([t for _, t in pairs], dtype=torch.int64)
    return {"test": ImageSet(_read_images(files, size), labels)}


def load_places365(
    root: Path, size: int = OOD_IMAGE_SIZE, cap: int | None = PLACES365_CAP
) -> dict[str, ImageSet]:
    """Places365 validation images (small, 256×256): the first ``cap`` in file-list order."""
    return _load_places_cached(str(_places_root(root).expanduser().resolve()), size, cap)


register_dataset(
    DatasetSpec(
        name="places365",
        in_shape=(3, OOD_IMAGE_SIZE, OOD_IMAGE_SIZE),
        num_classes=None,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        load=load_places365,
        location=_places_root,
        fetch=_fetch("places365"),
        description=(
            f"OOD: Places365 validation (torchvision, small 256×256, places365/val_256/): the "
            f"first {PLACES365_CAP:,} of 36,500 images in file-list order (deterministic), "
            f"resized to {OOD_IMAGE_SIZE}×{OOD_IMAGE_SIZE} at load time"
        ),
        is_available=lambda root: (
            _all_files(_places_root(root), _PLACES_FILES)
            and (_places_root(root) / "val_256").is_dir()
        ),
    )
)


def _tiny_folder(root: Path) -> Path:
    return Path(root) / "tiny-imagenet-200"


@lru_cache(maxsize=1)
def _load_tiny_cached(root: str) -> dict[str, ImageSet]:
    # Hand-written: torchvision has no TinyImageNet loader (torch-uncertainty's keeps every image
    # as a PIL object). The standard layout: val/images/val_<i>.JPEG and val/val_annotations.txt
    # ("val_0.JPEG<TAB>n03444034<TAB>x0<TAB>y0<TAB>x1<TAB>y1"); labels index wnids.txt's order, as
    # torch-uncertainty's TinyImageNet does. Some images are greyscale: converted to RGB.
    folder = Path(root)
    val = folder / "val"
    rows = [
        line.split("\t")[:2]
        for line in (val / "val_annotations.txt").read_text().splitlines()
        if line.strip()
    ]
    wnids_file = folder / "wnids.txt"
    if wnids_file.is_file():
        wnids = [w.strip() for w in wnids_file.read_text().splitlines() if w.strip()]
    else:
        wnids = sorted({w for _, w in rows})
    index = {w: i for i, w in enumerate(wnids)}
    files = [val / "images" / f for f, _ in rows]
    labels = torch.tensor([index.get(w, -1) for _, w in rows], dtype=torch.int64)
    return {"test": ImageSet(_read_images(files, OOD_IMAGE_SIZE), labels)}


def load_tinyimagenet(root: Path) -> dict[str, ImageSet]:
    """TinyImageNet-200 validation split (10,000 images, 3×64×64)."""
    return _load_tiny_cached(str(_tiny_folder(root).expanduser().resolve()))


register_dataset(
    DatasetSpec(
        name="tinyimagenet",
        in_shape=(3, 64, 64),
        num_classes=None,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        load=load_tinyimagenet,
        location=_tiny_folder,
        fetch=_fetch("tinyimagenet"),
        description="OOD: TinyImageNet-200 validation (tiny-imagenet-200/val/), 10,000 images",
        is_available=lambda root: (
            (_tiny_folder(root) / "val" / "val_annotations.txt").is_file()
            and (_tiny_folder(root) / "val" / "images").is_dir()
        ),
    )
)
