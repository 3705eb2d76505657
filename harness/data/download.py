"""``harness data download NAME``: fetch a benchmark set on a machine with internet access.

Everything goes through torchvision's download utilities (``torchvision.datasets.utils``): a
progress bar on stderr for every transfer (the 2.9 GB CIFAR-100-C included) and md5 checks.

- CIFAR-10/100, SVHN, MNIST, DTD, Places365: torchvision's own ``download=True`` (its URLs and
  md5s; a file already present and intact is not fetched again).
- CIFAR-10-C / CIFAR-100-C (Zenodo) and TinyImageNet-200 (Stanford): :data:`ARCHIVES` (URL and
  published md5). The transfer goes to ``<file>.part`` and becomes ``<file>`` only once its md5
  matches, so an interrupted run never leaves a truncated file under the real name; a complete
  archive already on disk (e.g. extraction was interrupted) is checked and reused, not fetched
  again. A checksum mismatch moves the file apart to ``<file>.corrupt`` and names the expected and
  actual md5. Archives are extracted with tarfile's ``data`` filter (torchvision's extractor
  applies none, and an archive must not write outside the data root), then deleted.

``$HARNESS_DOWNLOAD_MIRROR`` (a base URL) replaces the servers of :data:`ARCHIVES`: the file name
is appended to it (a site mirror; the tests serve fabricated archives from 127.0.0.1 this way).

Every failure becomes one :class:`DownloadError` whose message is a single line naming the URL,
the target folder and what to do on an offline machine. Nothing in the harness calls this
implicitly.
"""

from __future__ import annotations

import http.client
import os
import tarfile
import urllib.error
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.data.base import DATA_ROOT_ENV

MIRROR_ENV = "HARNESS_DOWNLOAD_MIRROR"


@dataclass(frozen=True)
class Archive:
    """One published file: where it is served and its published md5."""

    url: str
    md5: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


CIFAR10_C = Archive(
    "https://zenodo.org/record/2535967/files/CIFAR-10-C.tar", "56bf5dcef84df0e2308c6dcbcbbd8499"
)
CIFAR100_C = Archive(
    "https://zenodo.org/record/3555552/files/CIFAR-100-C.tar", "11f0ed0f1191edbf9fa23466ae6021d3"
)
TINYIMAGENET = Archive(
    "http://cs231n.stanford.edu/tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de"
)
# Text (harness/data/sst2.py): GLUE's SST-2 (md5 as torchtext's SST2), Maas et al.'s IMDB
# (torchtext's IMDB md5), 20 Newsgroups "bydate" (the md5 its distributors publish).
SST2 = Archive(
    "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip", "9f81648d4199384278b86e315dac217c"
)
IMDB = Archive(
    "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
    "7c2ac02c03563afcf9b574c7e56c153a",
)
NEWSGROUPS = Archive(
    "http://qwone.com/~jason/20Newsgroups/20news-bydate.tar.gz", "d6e9e45cb8cb77ec5276dfa6dfc14318"
)
ARCHIVES: dict[str, Archive] = {
    "cifar10-c": CIFAR10_C,
    "cifar100-c": CIFAR100_C,
    "tinyimagenet": TINYIMAGENET,
    "sst2": SST2,
    "imdb": IMDB,
    "20newsgroups": NEWSGROUPS,
}
# Kept for callers of the earlier names.
CIFAR10_C_URL, CIFAR100_C_URL, TINYIMAGENET_URL = CIFAR10_C.url, CIFAR100_C.url, TINYIMAGENET.url


class DownloadError(RuntimeError):
    """A download failed (no network, a bad checksum). The message is one line saying what to do."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def source_url(archive: Archive) -> str:
    """The URL an archive is fetched from: its own, or ``$HARNESS_DOWNLOAD_MIRROR/<file>``."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    return f"{mirror.rstrip('/')}/{archive.filename}" if mirror else archive.url


def _fetch_url(url: str, dest: Path) -> None:
    """Download ``url`` to ``dest`` with torchvision's downloader (tqdm progress bar on stderr),
    through ``dest.part`` (so a partial transfer never carries the final name)."""
    from torchvision.datasets.utils import download_url

    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)  # download_url would take an existing file as complete
    download_url(url, str(dest.parent), part.name)  # md5 checked by the caller, to name it
    os.replace(part, dest)


def _md5(path: Path) -> str:
    from torchvision.datasets.utils import calculate_md5

    return calculate_md5(str(path))


def _extract(archive: Path, into: Path) -> None:
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:  # zipfile never writes outside ``into``
            z.extractall(into)
        return
    with tarfile.open(archive) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(into, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            t.extractall(into)


def fetch_archive(archive: Archive, root: Path) -> Path:
    """Fetch one of :data:`ARCHIVES` into ``root``, check its md5, extract it and delete it.

    Args:
        archive: URL and published md5.
        root: the data root; the archive's top folder (e.g. ``CIFAR-10-C/``) lands in it.

    Returns:
        ``root``.

    Raises:
        DownloadError: the md5 does not match (the file is moved to ``<file>.corrupt``).
        urllib.error.URLError, OSError: the transfer failed (:func:`download` rewords them).
    """
    url = source_url(archive)
    dest = Path(root) / archive.filename
    if not dest.is_file() or _md5(dest) != archive.md5:  # a complete earlier download is reused
        print(f"downloading {url} → {dest}", flush=True)
        _fetch_url(url, dest)
        actual = _md5(dest)
        if actual != archive.md5:
            bad = dest.with_name(dest.name + ".corrupt")
            os.replace(dest, bad)  # kept apart for inspection, never extracted
            raise DownloadError(
                f"checksum mismatch for {dest.name} from {url}: expected md5 {archive.md5}, "
                f"got {actual}; the file was moved to {bad}; run the command again (if it "
                "persists, the server or mirror serves a different file)"
            )
    try:
        _extract(dest, Path(root))
    except (tarfile.TarError, zipfile.BadZipFile) as err:
        raise DownloadError(f"could not extract {dest}: {_one_line(err)}") from None
    dest.unlink()
    return Path(root)


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
    elif name in ("fashion_mnist", "kmnist"):  # <root>/FashionMNIST/raw, <root>/KMNIST/raw
        cls = datasets.FashionMNIST if name == "fashion_mnist" else datasets.KMNIST
        for train in (True, False):
            cls(root, train=train, download=True)
    elif name == "textures":
        datasets.DTD(root, split="test", download=True)
    elif name == "places365":
        datasets.Places365(root / "places365", split="val", small=True, download=True)
    else:  # pragma: no cover - guarded by SOURCES
        raise ValueError(name)


def _imagenet_c(root: Path) -> None:
    """ImageNet-C's five archives (torch-uncertainty's URLs, md5s) into ``<root>/imagenet-c/``."""
    from harness.data.imagenet import C_FOLDER, imagenet_c_sources

    for url, md5 in imagenet_c_sources():
        (Path(root) / C_FOLDER).mkdir(parents=True, exist_ok=True)
        fetch_archive(Archive(url, md5), Path(root) / C_FOLDER)


SOURCES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "cifar10": ("torchvision CIFAR10", lambda root: _torchvision("cifar10", root)),
    "cifar100": ("torchvision CIFAR100", lambda root: _torchvision("cifar100", root)),
    "svhn": ("torchvision SVHN (test split)", lambda root: _torchvision("svhn", root)),
    "mnist": ("torchvision MNIST", lambda root: _torchvision("mnist", root)),
    "fashion_mnist": ("torchvision FashionMNIST", lambda root: _torchvision("fashion_mnist", root)),
    "kmnist": ("torchvision KMNIST", lambda root: _torchvision("kmnist", root)),
    "textures": ("torchvision DTD", lambda root: _torchvision("textures", root)),
    "places365": (
        "torchvision Places365 (val, small)",
        lambda root: _torchvision("places365", root),
    ),
    "imagenet-c": ("ImageNet-C: 5 archives from zenodo.org/record/2235448", _imagenet_c),
    # Looked up at call time, so a mirror or a replaced entry applies.
    **{
        name: (archive.url, lambda root, n=name: fetch_archive(ARCHIVES[n], root))
        for name, archive in ARCHIVES.items()
    },
}


def downloadable() -> list[str]:
    """Names ``harness data download`` accepts."""
    return sorted(SOURCES)


def download(name: str, root: Path) -> Path:
    """Download one dataset into the data root.

    Args:
        name: a dataset (cifar10, cifar100, svhn, mnist, textures, places365, tinyimagenet; text:
            sst2, imdb, 20newsgroups), a
            published corruption set (cifar10-c, cifar100-c), or pretrained weights
            (``timm:<name>``, ``torchvision:<Enum>.<VALUE>``), which go to the library's own
            cache (Hugging Face Hub / ``$TORCH_HOME``), not the data root.
        root: the data root (``--data-root`` / ``$HARNESS_DATA_ROOT`` / the default cache).

    Returns:
        The root it was written to (for weights: the cached file).

    Raises:
        ValueError: unknown name.
        DownloadError: the network is unreachable, the transfer failed, a checksum does not
            match or the root is not writable (always a one-line message).
    """
    from harness.backbones.weights import fetch_named, is_named

    if is_named(name):
        return _fetch_weights(name, fetch_named)
    from harness.data.imagenet import preparation

    if (manual := preparation(name, Path(root).expanduser())) is not None:
        text, ready = manual  # sets behind a login or a third-party script: print the commands
        if ready:
            return Path(root).expanduser()
        print(text, flush=True)
        raise DownloadError(f"{name} cannot be downloaded here: prepare it with the commands above")
    if name not in SOURCES:
        raise ValueError(
            f"nothing to download for {name!r}; choose from {', '.join(downloadable())}, or "
            "pretrained weights timm:<name> / torchvision:<Enum>.<VALUE>"
        )
    root = Path(root).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DownloadError(
            f"cannot write the data root {root}: {_one_line(err)}; give a writable "
            f"--data-root DIR (or set ${DATA_ROOT_ENV})"
        ) from None
    what, fetch = SOURCES[name]
    if name in ARCHIVES:
        what = source_url(ARCHIVES[name])
    try:
        fetch(root)
    except DownloadError:
        raise
    except RuntimeError as err:  # torchvision's "File not found or corrupted." (md5 check)
        raise DownloadError(
            f"could not download {name} ({what}) into {root}: {_one_line(err)} (the file failed "
            "torchvision's md5 check or is missing after the transfer); run the command again: "
            "torchvision fetches a file whose md5 does not match anew"
        ) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        raise DownloadError(
            f"could not download {name} ({what}) into {root}: {_one_line(err)}. This machine "
            f"may have no internet access: run `harness data download {name} --data-root DIR` "
            f"on one that has, then copy DIR here and point --data-root / ${DATA_ROOT_ENV} at it."
        ) from None
    return root


def _fetch_weights(name: str, fetch: Callable[[str], Path]) -> Path:
    """Named weights into the library's cache, every failure one :class:`DownloadError` line."""
    from harness.backbones.weights import WeightsError

    try:
        return fetch(name)
    except WeightsError as err:  # an unknown name: already one line, nothing to retry
        raise DownloadError(str(err)) from None
    except Exception as err:  # the hub's and torch.hub's HTTP errors share no base class
        raise DownloadError(
            f"could not download {name} into the library's cache: {_one_line(err)}. This "
            f"machine may have no internet access: run `harness data download {name}` on one "
            "that has, then copy its cache ($HF_HOME/hub for timm, $TORCH_HOME/hub/checkpoints "
            "for torchvision) here."
        ) from None
