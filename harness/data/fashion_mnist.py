"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747): 60,000 training and 10,000 test
images, 28×28 grayscale, 10 classes of Zalando article photographs; read from the four published
IDX files, kept in memory as uint8 :class:`~harness.data._machinery.base.ImageSet` splits.

Where the files are looked for, in order:

1. ``<data root>/FashionMNIST/raw/`` — torchvision's ``FashionMNIST`` layout, which
   ``harness data download fashion_mnist`` writes (torchvision's URLs and ``.gz`` md5s; it keeps
   the ``.gz`` files and their extracted copies side by side);
2. Debian's package ``dataset-fashion-mnist`` (``apt-get install dataset-fashion-mnist``):
   ``/usr/share/datasets/fashion-mnist/`` (``$HARNESS_FASHION_MNIST_DIR`` replaces that path,
   e.g. to hide it in tests or to point at a copy).

Each file may be plain (``train-images-idx3-ubyte``) or gzipped (``….gz``); a plain file wins.

Integrity: the md5 of the *decompressed* content is checked, not the ``.gz`` md5 torchvision
publishes. Debian recompresses the files (its ``.gz`` md5s differ from torchvision's: e.g.
train-images ``cf8536b0…`` vs ``8d4fb7e6…``) while the IDX bytes inside are the published ones, so
the content md5 holds for both sources, and for torchvision's extracted copies. The content md5s
in :data:`CONTENT_MD5` are those of the published files, as other loaders list them next to the
``.gz`` md5s, and were checked here on the Debian files. The check runs once per process per file
set (``harness validate`` runs it before any training) and costs about a second.

``fashion_mnist_10k`` is the CPU-sized variant: a fixed stratified 10,000-image subset of the
60,000 training images (1,000 per class, drawn with seed :data:`SUBSET_SEED`, independent of any
cell's seed); its test set stays the full 10,000 images.

Corruptions: there is no published Fashion-MNIST-C, so ``corruptions: [all]`` is the CIFAR-C
benchmark family (Hendrycks & Dietterich 2019; torch-uncertainty's ports) where it applies to one
28×28 channel — 13 of its 15 corruptions, glass_blur and elastic_transform being left out below
32×32 (:mod:`harness.data._machinery.corruption_sets` says why) — at its 5 severities, plus the
extras speckle_noise and gaussian_blur when named. They are generated once, deterministically, into
``<root>/generated-c/fashion_mnist/`` and shared by ``fashion_mnist_10k`` (same test set).
MNIST-C (Mu & Gilmer 2019) is another family with one severity per corruption; it is not used.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from harness.contract.env import FASHION_MNIST_DIR
from harness.data._machinery.base import (
    DATA_ROOT_ENV,
    DataFileError,
    DataMissingError,
    DatasetSpec,
    ImageSet,
    register_dataset,
    stratified_holdout,
)
from harness.data._machinery.sources import Torchvision

#: Debian's install location of ``dataset-fashion-mnist`` (``dpkg -L dataset-fashion-mnist``).
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Replaces :data:`DEBIAN_DIR` when set (an empty value disables that location).
DEBIAN_DIR_ENV = FASHION_MNIST_DIR.name
APT_PACKAGE = "dataset-fashion-mnist"
RAW_FOLDER = Path("FashionMNIST") / "raw"  # torchvision's layout under the data root

TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)
#: md5 of each file's decompressed IDX content (the same for torchvision's and Debian's copies).
CONTENT_MD5 = {
    TRAIN_IMAGES: "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    TRAIN_LABELS: "9018921c3c673c538a1fc5bad174d6f9",
    TEST_IMAGES: "8181f5470baa50b63fa0f6fddb340f0a",
    TEST_LABELS: "15d484375f8d13e6eb1aabb0c3f46965",
}
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
SUBSET_SIZE = 10_000
SUBSET_SEED = 0
# Training-set statistics on the [0, 1] scale (recomputed by
# tests/harness/data/test_fashion_mnist.py).
FASHION_MEAN, FASHION_STD = (0.2860,), (0.3530,)
SUBSET_MEAN, SUBSET_STD = (0.2865,), (0.3531,)

_IDX_UBYTE = 0x08  # IDX type code of unsigned bytes, the only one these files use


def fetch_hint(name: str = "fashion_mnist") -> str:
    """The two ways to get the files, for every message that says they are missing or damaged."""
    return f"apt-get install --reinstall {APT_PACKAGE}` (Debian) or `harness data download {name}"


def debian_dir() -> Path | None:
    """Where the Debian package's files are looked for (None when disabled by the variable)."""
    return FASHION_MNIST_DIR.read(DEBIAN_DIR)


def candidate_folders(root: Path) -> list[Path]:
    """The folders searched, in order: torchvision's layout under ``root``, then Debian's."""
    folders = [Path(root).expanduser() / RAW_FOLDER]
    if (deb := debian_dir()) is not None:
        folders.append(deb)
    return folders


def _file(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists (plain first)."""
    for path in (folder / name, folder / f"{name}.gz"):
        if path.is_file():
            return path
    return None


def locate(root: Path) -> dict[str, Path] | None:
    """The four files from the first folder that has all of them, or None."""
    for folder in candidate_folders(root):
        paths = {name: _file(folder, name) for name in FILES}
        if all(paths.values()):
            return paths  # type: ignore[return-value]
    return None


def read_content(path: Path, fetch: str) -> bytes:
    """A file's IDX bytes (gunzipped when it ends in ``.gz``).

    Raises:
        DataFileError: a truncated or corrupt gzip stream.
    """
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DataFileError(path, f"{type(exc).__name__}: {exc}", fetch) from None


def parse_idx(data: bytes, ndim: int, path: Path, fetch: str) -> np.ndarray:
    """An IDX array of unsigned bytes (LeCun's format: 2 zero bytes, type 0x08, the number of
    dimensions, big-endian int32 sizes, then the data in C order).

    Args:
        data: the whole file's bytes.
        ndim: dimensions expected (3 for images (N, 28, 28), 1 for labels (N,)).

    Returns:
        uint8 array of the file's shape (a copy, writable).

    Raises:
        DataFileError: wrong magic, type, dimension count or a size that disagrees with the data.
    """
    if len(data) < 4 or data[0] or data[1]:
        raise DataFileError(path, "not an IDX file (the first two bytes must be zero)", fetch)
    if data[2] != _IDX_UBYTE or data[3] != ndim:
        raise DataFileError(
            path,
            f"IDX type 0x{data[2]:02x} with {data[3]} dimensions, expected unsigned bytes "
            f"(0x08) with {ndim}",
            fetch,
        )
    head = 4 + 4 * ndim
    if len(data) < head:
        raise DataFileError(path, f"IDX header truncated ({len(data)} bytes)", fetch)
    shape = tuple(int(s) for s in np.frombuffer(data, ">i4", ndim, 4))
    expected = head + int(np.prod(shape))
    if len(data) != expected:
        raise DataFileError(
            path, f"{len(data)} bytes where its header {shape} implies {expected}", fetch
        )
    return np.frombuffer(data, np.uint8, offset=head).reshape(shape).copy()


def _checked(path: Path, name: str, fetch: str) -> bytes:
    data = read_content(path, fetch)
    actual = hashlib.md5(data).hexdigest()
    if actual != CONTENT_MD5[name]:
        raise DataFileError(
            path,
            f"content md5 {actual}, expected {CONTENT_MD5[name]} (the md5 of the published "
            "file's decompressed bytes)",
            fetch,
        )
    return data


def _split(paths: dict[str, Path], images: str, labels: str, fetch: str) -> ImageSet:
    x = parse_idx(_checked(paths[images], images, fetch), 3, paths[images], fetch)
    y = parse_idx(_checked(paths[labels], labels, fetch), 1, paths[labels], fetch)
    if len(x) != len(y) or x.shape[1:] != (28, 28):
        raise DataFileError(
            paths[labels], f"{len(y)} labels for images of shape {x.shape}", fetch
        )  # fmt: skip
    if y.size and int(y.max()) >= len(CLASSES):
        raise DataFileError(paths[labels], f"label {int(y.max())} outside 0..9", fetch)
    return ImageSet(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y.astype(np.int64)))


@lru_cache(maxsize=2)
def _load_cached(files: tuple[tuple[str, str, int, int], ...]) -> dict[str, ImageSet]:
    # Keyed by (name, path, size, mtime) of every file: a replaced file is read (and checked) anew.
    paths = {name: Path(path) for name, path, _, _ in files}
    fetch = fetch_hint()
    return {
        "train": _split(paths, TRAIN_IMAGES, TRAIN_LABELS, fetch),
        "test": _split(paths, TEST_IMAGES, TEST_LABELS, fetch),
    }


def _key(paths: dict[str, Path]) -> tuple[tuple[str, str, int, int], ...]:
    out = []
    for name, path in paths.items():
        st = path.stat()
        out.append((name, str(path.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _missing(name: str, root: Path) -> DataMissingError:
    looked = " and ".join(str(f) for f in candidate_folders(root))
    return DataMissingError(
        f"dataset {name!r} not found: looked for {', '.join(FILES)} (or .gz) in {looked}. "
        f"Install Debian's package with `apt-get install {APT_PACKAGE}`, or download it with "
        f"`harness data download fashion_mnist` on a machine with internet (or point "
        f"--data-root / ${DATA_ROOT_ENV} at a folder holding {RAW_FOLDER}/)."
    )


def load_fashion_mnist(root: Path) -> dict[str, ImageSet]:
    """All 60,000 training and 10,000 test images, md5-checked (see the module docstring).

    Returns:
        {"train": uint8 (60000, 1, 28, 28), "test": uint8 (10000, 1, 28, 28)} with int64 labels.

    Raises:
        DataMissingError: no folder has all four files (naming both ways to get them).
        DataFileError: a file is damaged or not the published one (naming it).
    """
    paths = locate(root)
    if paths is None:
        raise _missing("fashion_mnist", root)
    return _load_cached(_key(paths))


def subset_indices(labels: torch.Tensor, count: int = SUBSET_SIZE) -> torch.Tensor:
    """The fixed stratified training subset of ``fashion_mnist_10k`` (sorted int64 indices)."""
    return stratified_holdout(labels, count, SUBSET_SEED)


def load_fashion_mnist_10k(root: Path) -> dict[str, ImageSet]:
    """``fashion_mnist_10k``: 10,000 training images (1,000 per class, seed 0), full test set,
    and the other 50,000 training images as ``spare`` (validation and calibration splits are
    drawn from them: training keeps its 10,000)."""
    full = load_fashion_mnist(root)
    train = full["train"]
    picked = subset_indices(train.labels)
    rest = torch.ones(len(train), dtype=torch.bool)
    rest[picked] = False
    return {
        "train": train.subset(picked),
        "test": full["test"],
        "spare": train.subset(rest.nonzero().flatten()),
    }


@dataclass(frozen=True)
class FashionSpec(DatasetSpec):
    """A dataset read from the Fashion-MNIST files: ``require`` names both ways to get them and
    checks the files' content md5 (so ``harness validate`` finds a damaged file before training).

    Attributes:
        corruption_key: the name its generated corrupted copies are seeded and cached under
            (``<root>/generated-c/fashion_mnist/``): every variant has the same test set.
    """

    corruption_key: str = "fashion_mnist"

    def require(self, root: Path) -> None:
        """Raise unless the four files are present and are the published ones.

        Raises:
            DataMissingError: not found (the message names the apt package and the download).
            DataFileError: a damaged file (naming it).
        """
        if locate(root) is None:
            raise _missing(self.name, root)
        self.load(root)  # checks the md5s; cached, so the run that follows reads nothing again


def _location(root: Path) -> Path:
    paths = locate(root)
    return paths[TRAIN_IMAGES].parent if paths else Path(root) / RAW_FOLDER


#: As OpenOOD v1.5's MNIST benchmark (near: notMNIST, Fashion-MNIST): the other 28×28 glyph sets
#: are near-OOD, natural-image patches far (harness/data/ood_28.py says what each stands for).
OOD_GROUPS = {
    **dict.fromkeys(("mnist", "kmnist", "digits_28", "letters_28"), "near"),
    "photos_28": "far",
}


def _spec(name: str, load, mean, std, what: str, spare: int = 0) -> FashionSpec:
    return FashionSpec(
        spare_images=spare,
        ood_groups=OOD_GROUPS,
        name=name,
        in_shape=(1, 28, 28),
        num_classes=len(CLASSES),
        mean=mean,
        std=std,
        load=load,
        location=_location,
        fetch="harness data download fashion_mnist",
        # <root>/FashionMNIST/raw, the folder :func:`locate` reads first
        download=Torchvision("FashionMNIST", ({"train": True}, {"train": False})),
        description=(
            f"Fashion-MNIST (Xiao et al. 2017), 28×28 grey, 10 classes: {what}; test 10,000 "
            f"(<root>/{RAW_FOLDER}/ or Debian's {APT_PACKAGE})"
        ),
        is_available=lambda root: locate(root) is not None,
    )


register_dataset(
    _spec("fashion_mnist", load_fashion_mnist, FASHION_MEAN, FASHION_STD, "train 60,000")
)
register_dataset(
    _spec(
        "fashion_mnist_10k",
        load_fashion_mnist_10k,
        SUBSET_MEAN,
        SUBSET_STD,
        f"train a fixed stratified {SUBSET_SIZE:,} of the 60,000 (seed {SUBSET_SEED}, CPU studies)",
        spare=60_000 - SUBSET_SIZE,
    )
)
