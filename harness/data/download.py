"""``harness data download NAME``: fetch a benchmark set on a machine with internet access.

torchvision's own ``download=True`` for the sets it knows (it verifies the archives' md5s);
urllib + extraction for CIFAR-10-C / CIFAR-100-C (Zenodo) and TinyImageNet-200 (Stanford). Every
network failure becomes one :class:`DownloadError` naming the URL, the target folder and what to
do on an offline machine. Nothing in the harness calls this implicitly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

from harness.data.base import DATA_ROOT_ENV

CIFAR10_C_URL = "https://zenodo.org/record/2535967/files/CIFAR-10-C.tar"
CIFAR100_C_URL = "https://zenodo.org/record/3555552/files/CIFAR-100-C.tar"
TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_MD5 = {
    CIFAR10_C_URL: "56bf5dcef84df0e2308c6dcbcbbd8499",
    CIFAR100_C_URL: "11f0ed0f1191edbf9fa23466ae6021d3",
    TINYIMAGENET_URL: "90528d7ca1a48142e341f4ef8d21d0de",
}


class DownloadError(RuntimeError):
    """A download failed (usually: no network). The message says what to do instead."""


def _fetch_url(url: str, dest: Path) -> None:
    """Download url to dest through a temporary file (replaced atomically when complete)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
        shutil.copyfileobj(response, out, length=1 << 20)
    os.replace(part, dest)


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_archive(url: str, root: Path) -> None:
    archive = root / url.rsplit("/", 1)[-1]
    if not archive.is_file():
        _fetch_url(url, archive)
    if url in _MD5 and _md5(archive) != _MD5[url]:
        archive.unlink()
        raise DownloadError(f"{archive} from {url} is corrupted (md5 mismatch); run again")
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(root)
    else:
        with tarfile.open(archive) as t:
            if hasattr(tarfile, "data_filter"):
                t.extractall(root, filter="data")
            else:  # pragma: no cover - Python < 3.11.4
                t.extractall(root)
    archive.unlink()


def _torchvision(name: str, root: Path) -> None:
    from torchvision import datasets

    if name == "cifar10":
        for train in (True, False):
            datasets.CIFAR10(root, train=train, download=True)
    elif name == "cifar100":
        for train in (True, False):
            datasets.CIFAR100(root, train=train, download=True)
    elif name == "svhn":
        datasets.SVHN(root / "svhn", split="test", download=True)
    elif name == "mnist":
        datasets.MNIST(root, train=False, download=True)
    elif name == "textures":
        datasets.DTD(root, split="test", download=True)
    elif name == "places365":
        datasets.Places365(root / "places365", split="val", small=True, download=True)
    else:  # pragma: no cover - guarded by SOURCES
        raise ValueError(name)


SOURCES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "cifar10": ("torchvision CIFAR10", lambda root: _torchvision("cifar10", root)),
    "cifar100": ("torchvision CIFAR100", lambda root: _torchvision("cifar100", root)),
    "svhn": ("torchvision SVHN (test split)", lambda root: _torchvision("svhn", root)),
    "mnist": ("torchvision MNIST", lambda root: _torchvision("mnist", root)),
    "textures": ("torchvision DTD", lambda root: _torchvision("textures", root)),
    "places365": (
        "torchvision Places365 (val, small)",
        lambda root: _torchvision("places365", root),
    ),
    "tinyimagenet": (TINYIMAGENET_URL, lambda root: _fetch_archive(TINYIMAGENET_URL, root)),
    "cifar10-c": (CIFAR10_C_URL, lambda root: _fetch_archive(CIFAR10_C_URL, root)),
    "cifar100-c": (CIFAR100_C_URL, lambda root: _fetch_archive(CIFAR100_C_URL, root)),
}


def downloadable() -> list[str]:
    """Names ``harness data download`` accepts."""
    return sorted(SOURCES)


def download(name: str, root: Path) -> Path:
    """Download one dataset into the data root.

    Args:
        name: a dataset (cifar10, cifar100, svhn, mnist, textures, places365, tinyimagenet) or a
            published corruption set (cifar10-c, cifar100-c).
        root: the data root (``--data-root`` / ``$HARNESS_DATA_ROOT`` / the default cache).

    Returns:
        The root it was written to.

    Raises:
        ValueError: unknown name.
        DownloadError: the network is unreachable or the transfer failed.
    """
    if name not in SOURCES:
        raise ValueError(
            f"nothing to download for {name!r}; choose from {', '.join(downloadable())}"
        )
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    what, fetch = SOURCES[name]
    try:
        fetch(root)
    except DownloadError:
        raise
    except (urllib.error.URLError, OSError, RuntimeError) as err:
        raise DownloadError(
            f"could not download {name} ({what}) into {root}: {err}. This machine may have no "
            f"internet access: run `harness data download {name} --data-root DIR` on one that "
            f"has, then copy DIR here and point --data-root / ${DATA_ROOT_ENV} at it."
        ) from err
    return root
