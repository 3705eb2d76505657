"""Corruption shift: the published CIFAR-10-C / CIFAR-100-C files, and generated copies of any
dataset's test split in the same layout.

Layout (Hendrycks & Dietterich, ICLR 2019): one ``<corruption>.npy`` per corruption, uint8
(5·N, H, W, C) with the rows of severity s at (s−1)·N … s·N − 1 (N = 10,000 for CIFAR), plus
``labels.npy`` (5·N,). The published sets live in ``<root>/CIFAR-10-C`` and ``<root>/CIFAR-100-C``;
generated copies in ``<root>/generated-c/<dataset>/`` with a ``source.json`` fingerprint of the
clean test split they were made from (a changed split regenerates them).

The generated copies are a derived cache, shared by every process using the data root: each file
is written whole (temporary file, fsync, ``os.replace``) with the mode a plain file gets under
the umask (a group-writable data root stays usable by the group), and a cached file that cannot
be read or does not hold what it should is renamed aside (``<name>.damaged-<time>``, never
deleted), named in one warning line, and generated again.

Generation uses torch-uncertainty's corruption transforms (``torch_uncertainty.transforms.
corruption``, PyTorch ports of the originals), seeded per (dataset, corruption, severity), so a
cache rebuilt on another machine is the same up to library versions. Some transforms need the
``torch-uncertainty[image]`` extras (opencv for elastic_transform); asking for one that cannot be
built here raises with the install command, and ``harness validate`` reports it beforehand.

The corruption names, what ``all`` means for each dataset and the validation live in
:mod:`harness.data._machinery.corruption_sets` (re-exported here).
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import json
import logging
import os
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from harness.contract.errors import DamagedFile
from harness.contract.record import set_aside
from harness.data._machinery.base import (
    DATA_ROOT_ENV,
    DataFileError,
    DataMissingError,
    ImageSet,
)
from harness.data._machinery.corruption_sets import (
    ALL_CORRUPTIONS,
    CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    SEVERITIES,
    applicable_corruptions,
    build_transform,
    check_corruption,
    check_corruptions,
    corruption_set,
    missing_requirement,
    published_set,
    resolve_corruptions,
    why_not_applicable,
)
from harness.storage.safe_files import atomic_write

__all__ = [
    "ALL_CORRUPTIONS",
    "CORRUPTIONS",
    "EXTRA_CORRUPTIONS",
    "GENERATED_DIR",
    "SEVERITIES",
    "applicable_corruptions",
    "check_corruptions",
    "cifar_c_location",
    "corrupt_images",
    "corrupted_split",
    "corruption_seed",
    "corruption_set",
    "corruptions_for",
    "generated_corruption",
    "generated_location",
    "read_cifar_c",
    "require_cifar_c",
    "resolve_corruptions",
    "why_not_applicable",
]

GENERATED_DIR = "generated-c"

log = logging.getLogger("harness")

# These call RGB-only code (kornia's rgb_to_grayscale, the colour frost photos, cv2's warp that
# drops a singleton channel); grey images go through a 3-channel copy and back by luma.
_NEEDS_RGB = {"snow", "frost", "elastic_transform"}
# Transforms that treat each image of a batch independently (so a chunk is one call). The others
# take one (C, H, W) image per call (motion_blur would draw one angle for a whole batch).
_BATCHABLE = {
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "brightness",
    "contrast",
    "speckle_noise",
    "gaussian_blur",
    "saturate",
}
_CHUNK = 500


# --------------------------------------------------------------------------------------------
# Published CIFAR-10-C / CIFAR-100-C


def cifar_c_location(root: Path, name: str) -> Path:
    """Folder of a published corruption set: ``<root>/CIFAR-10-C`` or ``<root>/CIFAR-100-C``."""
    return Path(root) / published_set(name).folder


def _missing(name: str, path: Path) -> DataMissingError:
    return DataMissingError(
        f"{name} not found: looked for {path}. Fetch it with `harness data download {name}` "
        f"(or point --data-root / ${DATA_ROOT_ENV} at a folder that has it)."
    )


def require_cifar_c(root: Path, name: str, corruptions: tuple[str, ...] = ALL_CORRUPTIONS) -> None:
    """Raise :class:`DataMissingError` unless labels.npy and every corruption file exist."""
    folder = cifar_c_location(root, name)
    for file in ("labels", *corruptions):
        if not (folder / f"{file}.npy").is_file():
            raise _missing(name, folder / f"{file}.npy")


def _unreadable_npy(path: Path, exc: BaseException) -> str:
    """One line saying why ``np.load`` could not read ``path`` (NumPy's own message for a file
    that is not an array at all speaks of pickled data, which misleads)."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        head = b"\x93NUMPY"  # gone or unreadable since: what np.load said is all there is
    if not head:
        return "empty (0 bytes)"
    if head != b"\x93NUMPY":
        return f"not a .npy array file (it starts with {head!r})"
    detail = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"truncated or not a whole .npy file ({type(exc).__name__}: {detail})"


def _load_published(path: Path, name: str) -> np.ndarray:
    """``path`` of a published set, memory-mapped; a damaged file raises naming it."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:  # what a cut or foreign file raises in np.load
        fetch = f"harness data download {name}"
        raise DataFileError(path, _unreadable_npy(path, exc), fetch) from None


def _severity_rows(arr: np.ndarray, severity: int, path: Path) -> np.ndarray:
    if arr.shape[0] % len(SEVERITIES):
        raise ValueError(f"{path}: {arr.shape[0]} rows is not 5 severities × N")
    n = arr.shape[0] // len(SEVERITIES)
    return np.array(arr[(severity - 1) * n : severity * n])  # a copy: only these rows are read


def read_cifar_c(root: Path, name: str, corruption: str, severity: int) -> ImageSet:
    """One corruption at one severity of CIFAR-10-C / CIFAR-100-C.

    Only the rows of that severity are read (memory-mapped file).

    Args:
        root: data root holding ``CIFAR-10-C/`` or ``CIFAR-100-C/``.
        name: "cifar10-c" or "cifar100-c".
        corruption: one of :data:`ALL_CORRUPTIONS`.
        severity: 1..5.

    Returns:
        ImageSet with uint8 (N, 3, 32, 32) images and int64 labels.

    Raises:
        DataMissingError: a file is absent (the message names it and the fetch command).
        DataFileError: a file is truncated or not a ``.npy`` array (the message names it and
            the fetch command).
        ValueError: unknown name/corruption/severity, or a file not in the published layout.
    """
    check_corruption(corruption, severity)
    folder = cifar_c_location(root, name)
    path, labels_path = folder / f"{corruption}.npy", folder / "labels.npy"
    for p in (path, labels_path):
        if not p.is_file():
            raise _missing(name, p)
    arr = _load_published(path, name)
    if arr.ndim != 4 or arr.dtype != np.uint8:
        raise ValueError(f"{path}: expected uint8 (5·N, H, W, C), got {arr.dtype} {arr.shape}")
    images = _severity_rows(arr, severity, path)
    labels = _load_published(labels_path, name)
    if labels.shape[0] != arr.shape[0]:
        raise ValueError(f"{labels_path}: {labels.shape[0]} labels for {arr.shape[0]} images")
    labels = _severity_rows(labels, severity, labels_path)
    return ImageSet(
        torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(),
        torch.from_numpy(labels.astype(np.int64)),
    )


def corruptions_for(dataset_name: str) -> list[str]:
    """The corruptions ``all`` evaluates for a dataset: its benchmark set
    (:func:`~harness.data._machinery.corruption_sets.corruption_set`), whatever is installed."""
    return list(corruption_set(dataset_name).benchmark)


# --------------------------------------------------------------------------------------------
# Generation


def corruption_seed(dataset_name: str, corruption: str, severity: int) -> int:
    """Stable seed of one generated cell (independent of Python's hash randomisation)."""
    return zlib.crc32(f"{dataset_name}/{corruption}/{severity}".encode())


def _to_grey(x: Tensor) -> Tensor:
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)


def corrupt_images(images: Tensor, corruption: str, severity: int, seed: int) -> Tensor:
    """Apply one torch-uncertainty corruption to uint8 (N, C, H, W) images, deterministically.

    Returns:
        uint8 (N, C, H, W).
    """
    check_corruption(corruption, severity)
    reason = why_not_applicable(corruption, tuple(images.shape[1:]))
    if reason:
        raise ValueError(f"corruption {corruption!r} does not apply to these images: {reason}")
    missing = missing_requirement(corruption)
    if missing:
        raise ImportError(missing)
    transform = build_transform(corruption, severity, seed)
    x = images.float().div(255)
    grey_via_rgb = corruption in _NEEDS_RGB and x.shape[1] == 1
    if grey_via_rgb:
        x = x.expand(-1, 3, -1, -1)
    # Several transforms draw from torch's global generator (noise, glass offsets, frost crops);
    # the others take the seed. Fork so the caller's RNG stream is untouched.
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        # NumPy 2 notices about how torch-uncertainty mixes tensors and arrays (fog, speckle,
        # elastic): not ours to fix, and harmless
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch_uncertainty")
        # reshape: impulse_noise drops the channel axis of a batch of grey images
        if corruption in _BATCHABLE:
            outs = [torch.as_tensor(transform(b)).reshape(b.shape) for b in x.split(_CHUNK)]
        else:  # clone: glass_blur permutes pixels of its input in place
            outs = [torch.as_tensor(transform(i.clone())).reshape(1, *i.shape) for i in x]
    out = torch.cat(outs).float() if outs else x
    if grey_via_rgb:
        out = _to_grey(out)
    return out.clamp(0, 1).mul(255).round().to(torch.uint8)


def generated_location(root: Path, dataset_name: str) -> Path:
    """``<root>/generated-c/<dataset>/``."""
    return Path(root) / GENERATED_DIR / dataset_name


def _fingerprint(test: ImageSet) -> dict:
    digest = hashlib.sha256()
    digest.update(test.images.contiguous().numpy().tobytes())
    digest.update(test.labels.contiguous().numpy().astype(np.int64).tobytes())
    try:
        tu_version = importlib.metadata.version("torch-uncertainty")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        tu_version = "unknown"
    return {
        "sha256": digest.hexdigest(),
        "n": len(test),
        "shape": list(test.images.shape[1:]),
        "torch_uncertainty": tu_version,
    }


def _atomic_write(path: Path, write) -> None:
    """Write a cache file whole through ``write(f)``: the project's atomic writer (a unique
    temporary file per writer, so processes generating the same file at once never mix their
    bytes; fsync; ``os.replace``; the mode a plain file gets under the umask, which a data root
    shared by a group needs; a full disk named by ``path``)."""
    atomic_write(path, write, binary=True)


def _same_file(before: os.stat_result, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino)


def _set_aside_damaged(path: Path, judged: os.stat_result, reason: str) -> None:
    """Rename the damaged cache file ``path`` aside (never deleted) and name it in one warning.

    Other processes may be judging and regenerating the same file: only the file judged damaged
    is moved. One already moved (or replaced) by another process is left alone, and a fresh copy
    another process put in place at that very moment is put back (it is whole: written
    atomically).
    """
    try:
        moved = set_aside(path)
    except FileNotFoundError:
        return  # another process set it aside first
    except OSError as exc:  # a read-only data root: the file cannot be replaced either
        raise DamagedFile(path, f"{reason}; could not move it aside ({exc})") from None
    if not _same_file(judged, moved):  # another process's whole, fresh copy: keep it in use
        os.replace(moved, path)
        return
    log.warning(
        "%s: damaged corruption cache (%s); moved to %s; generating it again",
        path,
        reason,
        moved.name,
    )


def _unreadable(path: Path, exc: OSError) -> str:
    """Why a cache file that the OS refused to read is unusable, or raise: out of memory or of
    descriptors is this process's trouble, not the file's, and must not set the file aside."""
    if exc.errno not in (errno.EIO, errno.EACCES, errno.EPERM):
        raise OSError(exc.errno, f"reading {path}: {exc.strerror or exc}") from exc
    # EACCES: e.g. a file private to another member of a group sharing the data root (cache
    # files were written 0600 whatever the umask until they followed it); derived, so made again.
    return f"cannot be read ({exc.strerror or exc})"


def _cached_array(path: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """The cached uint8 array of ``shape`` at ``path``, memory-mapped; None when there is none or
    it is damaged (unreadable, or another shape or dtype: then it is set aside, see
    :func:`_set_aside_damaged`), for the caller to generate it."""
    for _ in range(3):  # a file replaced while it is read is read again
        try:
            before = os.stat(path)
        except FileNotFoundError:  # none yet, or set aside by another process meanwhile
            return None
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            continue
        except (ValueError, EOFError) as exc:  # what a cut or foreign file raises in np.load
            arr, reason = None, _unreadable_npy(path, exc)
        except OSError as exc:
            arr, reason = None, _unreadable(path, exc)
        else:
            reason = f"holds {arr.dtype} {arr.shape}, not uint8 {shape}"
        # np.load opens the file twice (header, then the map): both must be the same file
        if not _same_file(before, path):
            continue
        if arr is not None and arr.shape == shape and arr.dtype == np.uint8:
            return arr
        _set_aside_damaged(path, before, reason)
    return None


def _read_source(source: Path) -> dict | None:
    """The fingerprint in ``source.json``; None when there is none or it is damaged (then set
    aside and named, like a damaged cache file)."""
    try:
        before = os.stat(source)
    except FileNotFoundError:
        return None
    try:
        return json.loads(source.read_bytes())
    except FileNotFoundError:  # set aside or replaced by another process meanwhile
        return None
    except ValueError as exc:  # not JSON, or not UTF-8 text
        reason = f"not a JSON fingerprint ({type(exc).__name__}: {str(exc)[:120]})"
    except OSError as exc:
        reason = _unreadable(source, exc)
    if _same_file(before, source):
        _set_aside_damaged(source, before, reason)
    return None


def _prepare_folder(folder: Path, test: ImageSet) -> None:
    """Make sure folder holds labels.npy and source.json of this test split; clear a stale one."""
    meta = _fingerprint(test)
    source = folder / "source.json"
    present = source.is_file()
    current = _read_source(source) if present else None
    if current == meta and (folder / "labels.npy").is_file():
        return
    if present:  # made from another test split or library version, or of unknown origin
        for stale in folder.glob("*.npy"):
            stale.unlink(missing_ok=True)
    labels = np.tile(test.labels.numpy().astype(np.int64), len(SEVERITIES))
    _atomic_write(folder / "labels.npy", lambda f: np.save(f, labels))
    _atomic_write(source, lambda f: f.write(json.dumps(meta, indent=1).encode()))


def generated_corruption(
    dataset_name: str, root: Path, test: ImageSet, corruption: str, severity: int
) -> ImageSet:
    """One corruption at one severity of a dataset's test split, generated once and cached.

    The first call for a corruption generates all 5 severities into
    ``<root>/generated-c/<dataset>/<corruption>.npy`` (uint8 (5·N, H, W, C), written atomically);
    later calls read only the requested rows. A cached file that cannot be read or has another
    shape or dtype is renamed aside (``<corruption>.npy.damaged-<time>``), named in one warning
    line, and generated again.
    """
    check_corruption(corruption, severity)
    folder = generated_location(root, dataset_name)
    _prepare_folder(folder, test)
    path = folder / f"{corruption}.npy"
    n, (c, h, w) = len(test), tuple(test.images.shape[1:])
    arr = _cached_array(path, (len(SEVERITIES) * n, h, w, c))
    if arr is None:
        blocks = [
            corrupt_images(test.images, corruption, s, corruption_seed(dataset_name, corruption, s))
            for s in SEVERITIES
        ]
        arr = torch.cat(blocks).permute(0, 2, 3, 1).contiguous().numpy()
        # Rows come from this array, not the file just written: another process may replace or
        # set aside that file meanwhile.
        _atomic_write(path, lambda f: np.save(f, arr))
    images = _severity_rows(arr, severity, path)
    return ImageSet(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), test.labels.clone())


def corrupted_split(
    dataset_name: str, root: Path, test: ImageSet, corruption: str, severity: int
) -> ImageSet:
    """The test split of a dataset under one corruption at one severity.

    Datasets with a ``corruption_source`` read the published files (CIFAR-10-C / CIFAR-100-C);
    the others get generated, cached copies (:func:`generated_corruption`).

    Raises:
        DataMissingError: the published files are absent.
        ValueError: unknown corruption/severity, a corruption that does not apply to the images,
            or published files whose labels do not match ``test``.
    """
    from harness.registry import DATASETS

    spec = DATASETS.get(dataset_name)
    source = spec.corruption_source
    if source is None:  # datasets sharing one test set share its copies (``corruption_key``)
        key = spec.corruption_key or dataset_name
        return generated_corruption(key, root, test, corruption, severity)
    if (read := published_set(source).read) is not None:  # its own layout (ImageNet-C's JPEGs)
        return read(root, test, corruption, severity)
    out = read_cifar_c(root, source, corruption, severity)
    if len(out) != len(test) or not torch.equal(out.labels, test.labels):
        raise ValueError(
            f"{cifar_c_location(root, source)}: labels do not match {dataset_name}'s test split "
            f"({len(out)} vs {len(test)} images)"
        )
    return out
