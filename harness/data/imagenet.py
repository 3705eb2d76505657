"""ILSVRC-2012 (ImageNet-1k) and ImageNet-C, read from their standard on-disk layouts.

ImageNet lives in ``<data_root>/imagenet/`` in either layout:

(a) torchvision's ``ImageNet`` layout: ``meta.bin`` + ``train/<wnid>/*.JPEG`` +
    ``val/<wnid>/*.JPEG``, what ``torchvision.datasets.ImageNet(root, split=...)`` writes from
    ``ILSVRC2012_devkit_t12.tar.gz``, ``ILSVRC2012_img_train.tar`` and ``ILSVRC2012_img_val.tar``
    (read here with that class, so its ``meta.bin`` names the classes);
(b) a plain folder tree ``train/<wnid>/*.JPEG``, ``val/<wnid>/*.JPEG`` (e.g. from the widely used
    ``extract_ILSVRC.sh`` / ``valprep.sh`` scripts), read with torchvision's ``ImageFolder`` rules.

In both, class index = position of the wnid in sorted order (ImageFolder's rule, the index of
every published ImageNet checkpoint), and files are sorted within a class: the lists are
deterministic. Listing 1.28 M files takes tens of seconds on a network file system, so each list
is cached in ``<data_root>/imagenet/.harness-files-<split>.npz`` together with a fingerprint of
the class folders (names and modification times: adding or removing a file changes its folder's
mtime); a stale or unwritable cache is simply rebuilt in memory.

``test`` is the official 50,000-image validation set (the test labels are not public); ``train``
all 1,281,167 training images (a recipe's ``validation: n`` holds n of them out).

ImageNet-C (Hendrycks & Dietterich, ICLR 2019) lives in
``<data_root>/imagenet-c/<corruption>/<severity>/<wnid>/*.JPEG``: the same relative paths as
``val/``, already resized to 256 and centre-cropped to 224, so they are read without a resize.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from harness.data._machinery.base import DataMissingError, DatasetSpec, register_dataset
from harness.data._machinery.corruption_sets import check_corruption
from harness.data._machinery.file_loader import FileSplit, ImageTransform
from harness.data._machinery.sources import Archive, Archives, Instructions, PublishedCorruptions
from harness.data.photo_sets import IMAGENET_MEAN, IMAGENET_STD

log = logging.getLogger(__name__)

FOLDER = "imagenet"
C_FOLDER = "imagenet-c"
NUM_CLASSES = 1000
SPLITS = {"train": "train", "test": "val"}
_CACHE_VERSION = 1

#: Printed by ``harness data download imagenet`` and named by every missing-data error: ImageNet
#: needs a login at image-net.org, so nothing can fetch it for the user.
PREPARE = """\
ImageNet (ILSVRC-2012) cannot be downloaded without an account: log in at
https://image-net.org/download-images.php and download ILSVRC2012_devkit_t12.tar.gz,
ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar into {root}/imagenet/, then either
  (a) torchvision's layout (writes meta.bin, train/<wnid>/, val/<wnid>/; hours, ~150 GB free):
      python -c "import torchvision.datasets as d; d.ImageNet('{root}/imagenet', split='train')"
      python -c "import torchvision.datasets as d; d.ImageNet('{root}/imagenet', split='val')"
  (b) or a plain folder tree train/<wnid>/*.JPEG, val/<wnid>/*.JPEG, e.g. with
      cd {root}/imagenet && mkdir train val && tar -xf ILSVRC2012_img_train.tar -C train &&
      (cd train && for f in *.tar; do d=${{f%.tar}}; mkdir $d && tar -xf $f -C $d && rm $f; done) &&
      tar -xf ILSVRC2012_img_val.tar -C val && (cd val && bash valprep.sh)
      (valprep.sh from https://raw.githubusercontent.com/soumith/imagenetloader.torch/master/valprep.sh)
ImageNet-C is public: `harness data download imagenet-c` fetches its five Zenodo archives
(md5-checked) into {root}/imagenet-c/<corruption>/<severity>/<wnid>/*.JPEG."""


def location(root: Path) -> Path:
    """``<data_root>/imagenet``."""
    return Path(root) / FOLDER


def layout(root: Path) -> str | None:
    """ "torchvision" (meta.bin + class folders), "folder" (class folders only) or None."""
    folder = location(root)
    if not all(_has_class_folders(folder / s) for s in SPLITS.values()):
        return None
    return "torchvision" if (folder / "meta.bin").is_file() else "folder"


def _has_class_folders(split_dir: Path) -> bool:
    try:
        return any(e.is_dir() for e in os.scandir(split_dir))
    except OSError:
        return False


def missing_error(root: Path, detail: str = "") -> DataMissingError:
    """The error naming both layouts and the preparation commands."""
    where = location(root)
    return DataMissingError(
        f"dataset 'imagenet' not found in {where}{': ' + detail if detail else ''}. Expected "
        f"torchvision's ImageNet layout ({where}/meta.bin + train/<wnid>/*.JPEG + "
        f"val/<wnid>/*.JPEG) or a plain folder tree ({where}/train/<wnid>/*.JPEG, "
        f"val/<wnid>/*.JPEG). With ILSVRC2012_devkit_t12.tar.gz, ILSVRC2012_img_train.tar and "
        f"ILSVRC2012_img_val.tar (image-net.org, login needed) in {where}, run `python -c "
        f"\"import torchvision.datasets as d; d.ImageNet('{where}', split='train'); "
        f"d.ImageNet('{where}', split='val')\"`; `harness data download imagenet` prints "
        f"every preparation command."
    )


@dataclass(frozen=True)
class ImageNetSpec(DatasetSpec):
    """ImageNet's registration: a missing tree is reported with both layouts and the commands
    that prepare them (the generic message only knows one download command)."""

    def require(self, root: Path) -> None:
        if layout(root) is None:
            raise missing_error(root)


def _fingerprint(split_dir: Path) -> str:
    """Names and mtimes of the class folders (a file added or removed changes its folder's)."""
    digest = hashlib.sha256(str(_CACHE_VERSION).encode())
    for entry in sorted(os.scandir(split_dir), key=lambda e: e.name):
        if entry.is_dir():
            digest.update(f"{entry.name}:{entry.stat().st_mtime_ns};".encode())
    return digest.hexdigest()


def _scan(split_dir: Path, kind: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(wnids in index order, relative paths, labels) by torchvision's own listing rules."""
    if kind == "torchvision":
        from torchvision.datasets import ImageNet

        # Only constructed when the split folder exists: it would otherwise start extracting the
        # archives (hours) as a side effect of loading.
        ds = ImageNet(str(split_dir.parent), split=split_dir.name)
        samples, wnids = ds.samples, ds.wnids
    else:
        from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

        wnids, class_to_idx = find_classes(str(split_dir))
        samples = make_dataset(str(split_dir), class_to_idx, extensions=IMG_EXTENSIONS)
    files = np.array([os.path.relpath(p, split_dir).encode() for p, _ in samples], dtype=bytes)
    labels = np.array([t for _, t in samples], dtype=np.int64)
    return list(wnids), files, labels


def file_list(root: Path, split: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The sorted file list of one split (``train`` or ``test`` = the official val set), from the
    on-disk cache when its fingerprint still matches.

    Returns:
        (wnids in class-index order, relative paths as a bytes array (N,), labels int64 (N,)).

    Raises:
        DataMissingError: neither layout is present (the message says how to prepare it).
    """
    kind = layout(root)
    if kind is None:
        raise missing_error(root)
    folder = location(root).resolve()
    split_name = SPLITS[split]
    # The fingerprint is part of the in-memory key too: a tree changed since is listed anew.
    return _file_list_cached(str(folder), split_name, kind, _fingerprint(folder / split_name))


@lru_cache(maxsize=4)
def _file_list_cached(folder: str, split_name: str, kind: str, fingerprint: str):
    split_dir = Path(folder) / split_name
    cache = Path(folder) / f".harness-files-{split_name}.npz"
    try:
        with np.load(cache, allow_pickle=False) as z:
            if str(z["fingerprint"]) == fingerprint:
                return [w.decode() for w in z["wnids"]], z["files"], z["labels"]
    except (OSError, KeyError, ValueError):
        pass  # absent, unreadable or from another version: rebuilt below
    wnids, files, labels = _scan(split_dir, kind)
    if len(wnids) != NUM_CLASSES:
        log.warning("%s has %d classes, not ImageNet's %d", split_dir, len(wnids), NUM_CLASSES)
    try:
        tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp.npz")
        np.savez(tmp, fingerprint=fingerprint, wnids=np.array(wnids, dtype=bytes), files=files,
                 labels=labels)  # fmt: skip
        os.replace(tmp, cache)
    except OSError:  # a read-only data root: keep the list in memory only
        pass
    return wnids, files, labels


def _split(root: Path, split: str) -> FileSplit:
    _, files, labels = file_list(root, split)
    folder = location(root) / SPLITS[split]
    return FileSplit(folder, files, torch.from_numpy(np.asarray(labels, dtype=np.int64)))


def load_imagenet(root: Path) -> dict[str, FileSplit]:
    """``{"train": 1.28 M training images, "test": the 50,000 validation images}`` as lazy
    file splits (224×224 inputs: RandomResizedCrop in training, Resize 256 + CenterCrop 224 in
    evaluation)."""
    return {"train": _split(root, "train"), "test": _split(root, "test")}


def imagenet_c_folder(root: Path, corruption: str, severity: int) -> Path:
    """``<data_root>/imagenet-c/<corruption>/<severity>``."""
    return Path(root) / C_FOLDER / corruption / str(severity)


def read_imagenet_c(root: Path, test: FileSplit, corruption: str, severity: int) -> FileSplit:
    """The ImageNet validation images under one corruption at one severity.

    Args:
        root: data root holding ``imagenet-c/``.
        test: ImageNet's test split (its relative paths ``<wnid>/<file>`` and labels are reused).
        corruption: one of the 19 ImageNet-C corruptions.
        severity: 1..5.

    Returns:
        A file split of ``imagenet-c/<corruption>/<severity>/<wnid>/<file>`` with ``test``'s
        labels, read without a resize (the files are 224×224 centre crops already).

    Raises:
        DataMissingError: the folder or one of the files is missing.
    """
    check_corruption(corruption, severity)
    folder = imagenet_c_folder(root, corruption, severity)
    if not folder.is_dir():
        raise DataMissingError(
            f"ImageNet-C {corruption} severity {severity} not found: looked in {folder}. "
            f"`harness data download imagenet-c` prints where to get it."
        )
    # One listing per class folder instead of a stat per file: 50,000 stats × 75 cells is slow on
    # a cluster file system.
    present: set[str] = set()
    for wnid in sorted({f.decode().split("/")[0] for f in test.files}):
        with contextlib.suppress(OSError):  # a missing class folder: its files are reported
            present.update(f"{wnid}/{e.name}" for e in os.scandir(folder / wnid))
    missing = [f for f in test.files if f.decode() not in present]
    if missing:
        raise DataMissingError(
            f"{folder} lacks {len(missing)} of the {len(test)} validation images "
            f"(e.g. {missing[0].decode()}): an incomplete ImageNet-C extraction"
        )
    size = test.transform.size
    return test.relocated(folder, ImageTransform(size=size, resize=size, pre_cropped=True))


def imagenet_c_available(root: Path, corruption: str, severity: int) -> bool:
    return imagenet_c_folder(root, corruption, severity).is_dir()


register_dataset(
    ImageNetSpec(
        name="imagenet",
        in_shape=(3, 224, 224),
        num_classes=NUM_CLASSES,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        load=load_imagenet,
        location=location,
        fetch="harness data download imagenet (prints the preparation commands: ImageNet "
        "needs a login)",
        augment="imagenet",
        download=Instructions(
            lambda root: PREPARE.format(root=root), lambda r: layout(r) is not None
        ),
        published_corruptions=PublishedCorruptions(
            C_FOLDER,  # JPEG folders, read lazily like the test split itself
            C_FOLDER,
            Archives(
                lambda: [Archive(url, md5) for url, md5 in imagenet_c_sources()],  # looked up late
                into=C_FOLDER,
                what="ImageNet-C: 5 archives from zenodo.org/record/2235448",
            ),
            read=read_imagenet_c,
        ),
        description=(
            "ILSVRC-2012 (imagenet/: torchvision's ImageNet layout or train/<wnid>/, "
            "val/<wnid>/ folders), read from JPEG files by loader workers: train 1,281,167 / "
            "test = the 50,000 val images; 224×224; corruptions from ImageNet-C"
        ),
        is_available=lambda root: layout(root) is not None,
    )
)


def imagenet_c_sources() -> list[tuple[str, str]]:
    """ImageNet-C's five Zenodo archives (blur, digital, extra, noise, weather) as (URL, md5),
    as torch-uncertainty's ``ImageNetC`` dataset lists them; each holds
    ``<corruption>/<severity>/<wnid>/*.JPEG`` at its top (``harness data download imagenet-c``
    extracts them into ``<data_root>/imagenet-c/``)."""
    from torch_uncertainty.datasets.classification import ImageNetC

    return list(zip(ImageNetC.url, ImageNetC.tgz_md5, strict=True))
