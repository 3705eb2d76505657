"""Tiny datasets written in the exact on-disk formats of the real ones, for the loader tests.

Each writer returns what it wrote (images as uint8 (N, C, H, W) numpy, labels as int64) so the tests
can compare the loaders' output pixel for pixel.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _labels(n_per_class: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    labels = np.repeat(np.arange(num_classes), n_per_class)
    return rng.permutation(labels).astype(np.int64)


def _pickle(path: Path, obj: dict) -> None:
    # The real batches are Python 2 pickles read with encoding="latin1": str keys, numpy data.
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10(root: Path, train_per_class: int = 10, test_per_class: int = 3, seed: int = 0):
    """``<root>/cifar-10-batches-py/``: data_batch_1..5, test_batch, batches.meta.

    Returns:
        {"train": (images, labels), "test": (images, labels)}, images uint8 (N, 3, 32, 32).
    """
    rng = _rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    y_train = _labels(train_per_class, 10, rng)
    x_train = rng.integers(0, 256, (len(y_train), 3, 32, 32), dtype=np.uint8)
    y_test = _labels(test_per_class, 10, rng)
    x_test = rng.integers(0, 256, (len(y_test), 3, 32, 32), dtype=np.uint8)
    for i, idx in enumerate(np.array_split(np.arange(len(y_train)), 5), start=1):
        _pickle(
            folder / f"data_batch_{i}",
            {
                "batch_label": f"training batch {i} of 5",
                "labels": y_train[idx].tolist(),
                "data": x_train[idx].reshape(len(idx), 3072),  # row-major R, G, B planes
                "filenames": [f"img_{j}.png" for j in idx],
            },
        )
    _pickle(
        folder / "test_batch",
        {
            "batch_label": "testing batch 1 of 1",
            "labels": y_test.tolist(),
            "data": x_test.reshape(len(y_test), 3072),
            "filenames": [f"test_{j}.png" for j in range(len(y_test))],
        },
    )
    _pickle(
        folder / "batches.meta",
        {
            "num_cases_per_batch": 10000,
            "label_names": [
                "airplane",
                "automobile",
                "bird",
                "cat",
                "deer",
                "dog",
                "frog",
                "horse",
                "ship",
                "truck",
            ],
            "num_vis": 3072,
        },
    )
    return {"train": (x_train, y_train), "test": (x_test, y_test)}


def write_cifar100(root: Path, train_per_class: int = 10, test_per_class: int = 1, seed: int = 1):
    """``<root>/cifar-100-python/``: train, test, meta (fine and coarse labels)."""
    rng = _rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, per_class in (("train", train_per_class), ("test", test_per_class)):
        y = _labels(per_class, 100, rng)
        x = rng.integers(0, 256, (len(y), 3, 32, 32), dtype=np.uint8)
        _pickle(
            folder / split,
            {
                "filenames": [f"{split}_{j}.png" for j in range(len(y))],
                "batch_label": f"{split} batch",
                "fine_labels": y.tolist(),
                "coarse_labels": (y // 5).tolist(),
                "data": x.reshape(len(y), 3072),
            },
        )
        out[split] = (x, y)
    _pickle(
        folder / "meta",
        {
            "fine_label_names": [f"class_{i}" for i in range(100)],
            "coarse_label_names": [f"super_{i}" for i in range(20)],
        },
    )
    return out


def write_cifar_c(
    root: Path,
    folder: str = "CIFAR-10-C",
    corruptions: tuple[str, ...] = ("gaussian_noise",),
    labels: np.ndarray | None = None,
    n: int = 20,
    constant_blocks: bool = False,
    seed: int = 2,
):
    """``<root>/<folder>/<corruption>.npy`` uint8 (5·n, 32, 32, 3) and ``labels.npy`` (5·n,).

    Args:
        labels: the n test labels (tiled 5× as in the published files); random if None.
        constant_blocks: fill the rows of severity s with the value 40·s (else random pixels).

    Returns:
        ({corruption: array (5·n, 32, 32, 3)}, labels (5·n,)).
    """
    rng = _rng(seed)
    out = Path(root) / folder
    out.mkdir(parents=True, exist_ok=True)
    if labels is None:
        labels = rng.integers(0, 10, n)
    n = len(labels)
    tiled = np.tile(np.asarray(labels, dtype=np.uint8), 5)  # published: uint8, 5 copies
    np.save(out / "labels.npy", tiled)
    arrays = {}
    for c in corruptions:
        if constant_blocks:
            arr = np.repeat(np.arange(1, 6, dtype=np.uint8) * 40, n)[:, None, None, None]
            arr = np.broadcast_to(arr, (5 * n, 32, 32, 3)).copy()
        else:
            arr = rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8)
        np.save(out / f"{c}.npy", arr)
        arrays[c] = arr
    return arrays, tiled.astype(np.int64)


def write_svhn(root: Path, n: int = 30, seed: int = 3):
    """``<root>/svhn/test_32x32.mat``: X (32, 32, 3, N) uint8, y (N, 1) with 10 for the digit 0.

    Returns:
        images uint8 (N, 3, 32, 32), digit labels 0..9.
    """
    from scipy.io import savemat

    rng = _rng(seed)
    folder = Path(root) / "svhn"
    folder.mkdir(parents=True, exist_ok=True)
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    digits = np.arange(n) % 10  # every digit, 0 included
    y = np.where(digits == 0, 10, digits).astype(np.uint8).reshape(n, 1)
    savemat(folder / "test_32x32.mat", {"X": images.transpose(2, 3, 1, 0), "y": y})
    return images, digits.astype(np.int64)


def _idx(path: Path, array: np.ndarray) -> None:
    """IDX file (LeCun): magic 0x0000 08 ndim, big-endian int32 dims, then the uint8 data."""
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(f">{array.ndim}i", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def write_mnist(root: Path, n_train: int = 5, n_test: int = 12, seed: int = 4):
    """``<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``.

    Returns:
        test images uint8 (N, 1, 28, 28), test labels.
    """
    rng = _rng(seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out = None
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        _idx(raw / f"{prefix}-images-idx3-ubyte", x)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", y)
        out = (x[:, None], y.astype(np.int64))
    return out


def _save(path: Path, array_hwc: np.ndarray, fmt: str) -> np.ndarray:
    """Save an image and return what PIL decodes from the file (JPEG is lossy) as (3, H, W)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "L" if array_hwc.ndim == 2 else "RGB"
    Image.fromarray(array_hwc, mode=mode).save(path, fmt, quality=95)
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


def write_tinyimagenet(root: Path, n: int = 6, seed: int = 5):
    """``<root>/tiny-imagenet-200/``: wnids.txt, words.txt, val/val_annotations.txt and
    val/images/val_<i>.JPEG (64×64 JPEGs; image 1 is greyscale, as some real ones are).

    Returns:
        images uint8 (N, 3, 64, 64) as PIL decodes them, labels (index in wnids.txt).
    """
    rng = _rng(seed)
    folder = Path(root) / "tiny-imagenet-200"
    (folder / "val" / "images").mkdir(parents=True, exist_ok=True)
    wnids = ["n03444034", "n01443537", "n02099712"]  # file order, not sorted
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (folder / "words.txt").write_text("".join(f"{w}\tthing {i}\n" for i, w in enumerate(wnids)))
    rows, images, labels = [], [], []
    for i in range(n):
        label = i % len(wnids)
        shape = (64, 64) if i == 1 else (64, 64, 3)
        img = _save(
            folder / "val" / "images" / f"val_{i}.JPEG",
            rng.integers(0, 256, shape, dtype=np.uint8),
            "JPEG",
        )
        rows.append(f"val_{i}.JPEG\t{wnids[label]}\t0\t0\t63\t63")
        images.append(img)
        labels.append(label)
    (folder / "val" / "val_annotations.txt").write_text("\n".join(rows) + "\n")
    return np.stack(images), np.array(labels, dtype=np.int64)


def write_dtd(root: Path, per_split: int = 2, seed: int = 6):
    """``<root>/dtd/dtd/``: images/<class>/<name>.jpg of various sizes and labels/{train,val,
    test}1.txt listing "class/name.jpg".

    Returns:
        {relative name: decoded (3, H, W) image}, list of names in train, val, test order.
    """
    rng = _rng(seed)
    folder = Path(root) / "dtd" / "dtd"
    classes = ["banded", "zigzagged"]
    written, order = {}, []
    for split in ("train", "val", "test"):
        lines = []
        for i in range(per_split):
            cls = classes[i % 2]
            name = f"{cls}/{cls}_{split}_{i}.jpg"
            h, w = (70 + 10 * i, 90) if i % 2 else (64, 64)
            written[name] = _save(
                folder / "images" / name, rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "JPEG"
            )
            lines.append(name)
            order.append(name)
        (folder / "labels").mkdir(parents=True, exist_ok=True)
        (folder / "labels" / f"{split}1.txt").write_text("\n".join(lines) + "\n")
    return written, order


def write_places365(root: Path, n: int = 5, size: int = 64, seed: int = 7):
    """``<root>/places365/``: categories_places365.txt, places365_val.txt ("name label") and
    val_256/Places365_val_<8 digits>.jpg.

    Returns:
        decoded images uint8 (N, 3, size, size), labels.
    """
    rng = _rng(seed)
    folder = Path(root) / "places365"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "categories_places365.txt").write_text("/a/airfield 0\n/b/beach 1\n/c/canyon 2\n")
    lines, images, labels = [], [], []
    for i in range(n):
        name = f"Places365_val_{i + 1:08d}.jpg"
        images.append(
            _save(
                folder / "val_256" / name,
                rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
                "JPEG",
            )
        )
        labels.append(i % 3)
        lines.append(f"{name} {i % 3}")
    (folder / "places365_val.txt").write_text("\n".join(lines) + "\n")
    return np.stack(images), np.array(labels, dtype=np.int64)


def write_fashion_mnist(
    folder: Path, n_train: int = 20, n_test: int = 10, gz: bool = False, seed: int = 8
) -> dict[str, tuple[np.ndarray, np.ndarray, dict[str, str]]]:
    """The four Fashion-MNIST IDX files in ``folder`` (``<root>/FashionMNIST/raw`` or Debian's
    flat folder), plain or gzipped (``….gz``, as published and as Debian ships them).

    Labels cycle through 0..9 so that every class is present.

    Returns:
        {"train"/"test": (images uint8 (N, 1, 28, 28), labels int64 (N,), {file: content md5})}.
    """
    import gzip
    import hashlib

    rng = _rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        md5s = {}
        for name, array in ((f"{prefix}-images-idx3-ubyte", x), (f"{prefix}-labels-idx1-ubyte", y)):
            plain = folder / name
            _idx(plain, array)
            md5s[name] = hashlib.md5(plain.read_bytes()).hexdigest()
            if gz:
                with gzip.open(folder / f"{name}.gz", "wb") as f:
                    f.write(plain.read_bytes())
                plain.unlink()
        out[split] = (x[:, None], y.astype(np.int64), md5s)
    return out
