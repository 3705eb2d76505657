"""OOD-only photo sets stored as image files: Textures (DTD), Places365, TinyImageNet.

Read with torchvision's parsers where it has one (DTD, Places365) from the standard layouts;
nothing downloads (``harness data download NAME`` fetches them on a machine with internet).

Memory: these sets have large or variable-size images (DTD: up to 640×640; Places365: 256×256,
36,500 validation images = 7 GB as uint8), so they are centre-cropped to a square and resized once
at load time to ``OOD_IMAGE_SIZE``; the harness then adapts every OOD set to the in-distribution
shape with :func:`harness.engine.evaluate.adapt_images`. Places365 is capped to its first
``PLACES365_CAP`` validation images (file-list order, deterministic).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from harness.data._machinery.base import DatasetSpec, ImageSet, register_dataset
from harness.data._machinery.sources import Archive, Archives, Torchvision

OOD_IMAGE_SIZE = 64
PLACES365_CAP = 10_000
_LOAD_THREADS = min(8, os.cpu_count() or 1)
# OOD-only sets are normalised with the in-distribution set's statistics; these are ImageNet's,
# for completeness.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _fetch(name: str) -> str:
    return f"harness data download {name}"


def _all_files(folder: Path, names: Sequence[str]) -> bool:
    return all((folder / n).is_file() for n in names)


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
        download=Torchvision("DTD", ({"split": "test"},)),
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
        download=Torchvision(
            "Places365", ({"split": "val", "small": True},), into="places365", note="val, small"
        ),
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
        download=Archives(  # Stanford's zip: a top folder tiny-imagenet-200/
            (
                Archive(
                    "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
                    "90528d7ca1a48142e341f4ef8d21d0de",
                ),
            )
        ),
        description="OOD: TinyImageNet-200 validation (tiny-imagenet-200/val/), 10,000 images",
        is_available=lambda root: (
            (_tiny_folder(root) / "val" / "val_annotations.txt").is_file()
            and (_tiny_folder(root) / "val" / "images").is_dir()
        ),
    )
)
