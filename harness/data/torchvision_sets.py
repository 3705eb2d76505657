"""The field's standard benchmark sets, read with torchvision's own parsers from the usual layouts.

In-distribution: CIFAR-10 and CIFAR-100 (train = all 50,000 official training images, test = the
official test set; a validation split is held out of the training images only when a recipe asks
for one, :func:`harness.data._machinery.base.training_splits`). OOD-only: SVHN and MNIST here;
Textures (DTD), Places365 and TinyImageNet in :mod:`harness.data.photo_sets`.

Nothing here downloads: loaders run with ``download=False`` and every spec's ``is_available``
only checks that the files exist. ``harness data download NAME``
(:mod:`harness.data._machinery.download`) fetches them on a machine with internet.

torchvision md5-checks every CIFAR/SVHN/Places365 file each time a dataset object is built
(170 MB hashed per CIFAR load). The archives are md5-checked once, when they are downloaded;
loading then uses small subclasses that only check that the files exist, so the parsing is still
torchvision's own (and the tests can run it on fabricated files in the same formats).

Memory: OOD-only sets with large or variable-size images (DTD: up to 640×640; Places365: 256×256,
36,500 validation images = 7 GB as uint8) are centre-cropped to a square and resized once at load
time to ``OOD_IMAGE_SIZE``; the harness then adapts every OOD set to the in-distribution shape with
:func:`harness.engine.evaluate.adapt_images`. Places365 is capped to its first ``PLACES365_CAP``
validation images (file-list order, deterministic).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.data._machinery.base import (
    VALIDATION_SEED,
    DatasetSpec,
    ImageSet,
    damaged_data_file,
    register_dataset,
)
from harness.data._machinery.sources import Archive, Archives, PublishedCorruptions, Torchvision

# Per-channel mean/std of the training images on the [0, 1] scale (the true pixel std, not the
# 0.2023/0.1994/0.2010 values that circulate for CIFAR-10).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
# OOD-only sets are normalised with the in-distribution set's statistics; these are their own,
# for completeness (SVHN/MNIST: their training sets; the photo sets: ImageNet's, in photo_sets).
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


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


def _read_pickle(path: Path) -> Any:

    with open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")


@lru_cache(maxsize=2)
def _load_cifar_cached(name: str, root: str) -> dict[str, ImageSet]:
    cls = _cifar_classes()[0 if name == "cifar10" else 1]
    try:
        train = cls(root, train=True, download=False)
        test = cls(root, train=False, download=False)
    except (pickle.UnpicklingError, EOFError, ValueError, KeyError, IndexError) as exc:
        # torchvision's message names no file (a truncated batch: "pickle data was truncated").
        folder, files = _CIFAR[name]
        paths = [Path(root) / folder / f for f in files]
        raise damaged_data_file(paths, exc, _fetch(name), _read_pickle) from None
    return {
        "train": _hwc_to_set(train.data, train.targets),
        "test": _hwc_to_set(test.data, test.targets),
    }


def load_cifar(name: str, root: Path) -> dict[str, ImageSet]:
    """CIFAR-10/100 as {"train" (all 50k, file order), "test" (10k)}."""
    return _load_cifar_cached(name, str(Path(root).expanduser().resolve()))


#: The published corruption sets (Hendrycks & Dietterich 2019, Zenodo; URL and published md5).
CIFAR_C = {
    "cifar10": PublishedCorruptions(
        "cifar10-c",
        "CIFAR-10-C",
        Archives(
            (
                Archive(
                    "https://zenodo.org/record/2535967/files/CIFAR-10-C.tar",
                    "56bf5dcef84df0e2308c6dcbcbbd8499",
                ),
            )
        ),
    ),
    "cifar100": PublishedCorruptions(
        "cifar100-c",
        "CIFAR-100-C",
        Archives(
            (
                Archive(
                    "https://zenodo.org/record/3555552/files/CIFAR-100-C.tar",
                    "11f0ed0f1191edbf9fa23466ae6021d3",
                ),
            )
        ),
    ),
}
_BOTH_SPLITS = ({"train": True}, {"train": False})


#: OpenOOD v1.5 (Zhang et al., 2023, Table 1): near-OOD the other CIFAR and TinyImageNet, far-OOD
#: MNIST, SVHN, Textures and Places365.
_CIFAR_FAR = dict.fromkeys(("mnist", "svhn", "textures", "places365"), "far")
_CIFAR_OOD = {
    "cifar10": {**dict.fromkeys(("cifar100", "tinyimagenet"), "near"), **_CIFAR_FAR},
    "cifar100": {**dict.fromkeys(("cifar10", "tinyimagenet"), "near"), **_CIFAR_FAR},
}


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
        download=Torchvision(name.upper(), _BOTH_SPLITS),
        published_corruptions=CIFAR_C[name],
        ood_groups=_CIFAR_OOD[name],
        description=(
            f"CIFAR-{num_classes} (torchvision, {folder}/): train 50,000 (a recipe's "
            f"`validation: n` holds n of them out, stratified, seed {VALIDATION_SEED}) / test "
            f"10,000; corruptions from CIFAR-{num_classes}-C"
        ),
        is_available=lambda root: _all_files(Path(root) / folder, files),
    )


register_dataset(_cifar_spec("cifar10", 10, CIFAR10_MEAN, CIFAR10_STD))
register_dataset(_cifar_spec("cifar100", 100, CIFAR100_MEAN, CIFAR100_STD))


# --------------------------------------------------------------------------------------------
# SVHN (test split) and MNIST (test split): numpy arrays, no per-image loop


def _svhn_root(root: Path) -> Path:
    """The folder holding ``test_32x32.mat``: ``<root>/svhn/`` (what ``harness data download
    svhn`` writes) or ``<root>/`` itself (torchvision's ``SVHN(root, download=True)`` layout);
    ``<root>/svhn/`` when neither has it (the error then names that path)."""
    nested = Path(root) / "svhn"
    if not (nested / "test_32x32.mat").is_file() and (Path(root) / "test_32x32.mat").is_file():
        return Path(root)
    return nested


@lru_cache(maxsize=1)
def _load_svhn_cached(root: str) -> dict[str, ImageSet]:
    from torchvision.datasets import SVHN

    # Existence check instead of the per-load md5 of the 64 MB .mat (checked at download).
    cls = type(
        "SVHNExistsOnly",
        (SVHN,),
        {"_check_integrity": lambda self: (Path(self.root) / self.filename).is_file()},
    )
    try:
        ds = cls(root, split="test", download=False)  # data: (N, 3, 32, 32), labels 0..9
    except (ValueError, KeyError, OSError, TypeError) as exc:  # scipy's MatReadError: ValueError
        raise damaged_data_file([Path(root) / cls.filename], exc, _fetch("svhn")) from None
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
        download=Torchvision("SVHN", ({"split": "test"},), into="svhn", note="test split"),
        description=(
            "OOD: SVHN test split (torchvision, svhn/test_32x32.mat or test_32x32.mat), "
            "26,032 images"
        ),
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

    try:
        ds = MNIST(root, train=False, download=False)  # data: uint8 (N, 28, 28)
    except (ValueError, RuntimeError, IndexError) as exc:  # a short idx file fails in reshape
        raise damaged_data_file([Path(root) / "MNIST" / "raw"], exc, _fetch("mnist")) from None
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
        download=Torchvision("MNIST", ({"train": False},)),
        description="OOD: MNIST test split (torchvision, MNIST/raw idx files), 10,000 images",
        # torchvision's MNIST wants all four raw files, the training ones included.
        is_available=lambda root: _all_files(Path(root) / "MNIST" / "raw", _MNIST_FILES),
    )
)
