"""The OOD sets of OpenOOD v1.5's ImageNet-1K benchmark, read as OpenOOD ships them.

OpenOOD v1.5 (Zhang et al., "OpenOOD v1.5: Enhanced Benchmark for Out-of-Distribution Detection",
2023) evaluates ImageNet-1K classifiers on near-OOD SSB-hard and NINCO and far-OOD iNaturalist,
Textures and OpenImage-O. Its download script (``scripts/download/download.py`` of
github.com/Jingkang50/OpenOOD) writes, under its data folder (here ``<data_root>/openood/``):

- ``benchmark_imglist/imagenet/test_<name>.txt``: one image per line, ``<relative path> <label>``
  (the label is -1 or a dict for OOD images; split at the first space, as OpenOOD's
  ``ImglistDataset`` does);
- the images, the paths relative to ``images_largescale/`` (ssb_hard, ninco, inaturalist,
  openimage_o) or ``images_classic/`` (texture).

Each set is an OOD-only dataset (``num_classes`` None) of lazy file splits with OpenOOD's
evaluation transform for ImageNet (bilinear Resize 256 + CenterCrop 224), so its batches already
have the model's input shape. Images are listed in the imglist's order.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from harness.data._machinery.base import DataMissingError, DatasetSpec, register_dataset
from harness.data._machinery.file_loader import FileSplit
from harness.data._machinery.sources import Instructions
from harness.data.photo_sets import IMAGENET_MEAN, IMAGENET_STD

FOLDER = "openood"
IMGLIST_DIR = "benchmark_imglist/imagenet"

#: name → (OpenOOD's name, images folder, near/far, what it is)
SETS: dict[str, tuple[str, str, str, str]] = {
    "openood_ssb_hard": (
        "ssb_hard",
        "images_largescale",
        "near",
        "SSB-hard (Vaze et al. 2022), 49,000 ImageNet-21K images of classes semantically close to "
        "ImageNet-1K's",
    ),
    "openood_ninco": (
        "ninco",
        "images_largescale",
        "near",
        "NINCO (Bitterwolf et al. 2023), 5,879 images checked free of ImageNet-1K objects",
    ),
    "openood_inaturalist": (
        "inaturalist",
        "images_largescale",
        "far",
        "iNaturalist OOD subset (Huang & Li 2021), 10,000 plant images",
    ),
    "openood_textures": (
        "textures",
        "images_classic",
        "far",
        "Textures / DTD (Cimpoi et al. 2014) as OpenOOD lists it for ImageNet, 5,160 images",
    ),
    "openood_openimage_o": (
        "openimage_o",
        "images_largescale",
        "far",
        "OpenImage-O (Wang et al. 2022), 15,869 Open Images photos",
    ),
}

#: Printed by ``harness data download openood_*``: the images are served from Google Drive by
#: OpenOOD's own script (needs ``pip install gdown``), which has no fixed URL or checksum to
#: fetch them with the harness's downloader.
PREPARE = """\
OpenOOD v1.5's ImageNet-1K OOD sets come from OpenOOD's download script (Google Drive, needs gdown):
  git clone https://github.com/Jingkang50/OpenOOD && cd OpenOOD && pip install gdown
  python scripts/download/download.py --contents datasets --dataset_mode dataset \\
      --datasets ssb_hard ninco inaturalist texture openimage_o --save_dir {root}/openood
The script first fetches benchmark_imglist/ (every benchmark's image lists) into {root}/openood/;
the harness reads benchmark_imglist/imagenet/test_<name>.txt and the images under
{root}/openood/images_largescale/ (ssb_hard, ninco, inaturalist, openimage_o) and
{root}/openood/images_classic/ (texture)."""


def data_folder(root: Path) -> Path:
    """``<data_root>/openood`` (OpenOOD's ``--save_dir``)."""
    return Path(root) / FOLDER


def imglist_path(root: Path, name: str) -> Path:
    return data_folder(root) / IMGLIST_DIR / f"test_{SETS[name][0]}.txt"


def images_folder(root: Path, name: str) -> Path:
    return data_folder(root) / SETS[name][1]


def read_imglist(path: Path) -> np.ndarray:
    """Relative image paths of an OpenOOD imglist (first field of each non-empty line)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return np.array([line.split(" ", 1)[0].encode() for line in lines if line], dtype=bytes)


@lru_cache(maxsize=8)
def _load_cached(name: str, root: str) -> dict[str, FileSplit]:
    files = read_imglist(imglist_path(Path(root), name))
    folder = images_folder(Path(root), name)
    if len(files) and not (folder / files[0].decode()).is_file():
        raise DataMissingError(
            f"dataset {name!r}: {imglist_path(Path(root), name)} lists {files[0].decode()} but "
            f"{folder / files[0].decode()} does not exist; "
            f"`harness data download {name}` prints how to fetch the images"
        )
    labels = torch.full((len(files),), -1, dtype=torch.int64)  # OOD: unlabelled
    return {"test": FileSplit(folder, files, labels)}


def load(name: str, root: Path) -> dict[str, FileSplit]:
    """``{"test": the set's images}`` (labels -1), in the imglist's order."""
    return _load_cached(name, str(Path(root).expanduser().resolve()))


def _available(name: str, root: Path) -> bool:
    return imglist_path(root, name).is_file() and images_folder(root, name).is_dir()


for _name, (_openood, _images, _kind, _what) in SETS.items():
    register_dataset(
        DatasetSpec(
            name=_name,
            in_shape=(3, 224, 224),
            num_classes=None,
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            load=lambda root, n=_name: load(n, root),
            location=lambda root, n=_name: imglist_path(root, n),
            fetch=f"harness data download {_name} (prints OpenOOD's download command)",
            download=Instructions(
                lambda root: PREPARE.format(root=root), lambda root, n=_name: _available(n, root)
            ),
            description=(
                f"OOD ({_kind}, OpenOOD v1.5 ImageNet-1K): {_what}; openood/{IMGLIST_DIR}/"
                f"test_{_openood}.txt + openood/{_images}/"
            ),
            is_available=lambda root, n=_name: _available(n, root),
        )
    )
