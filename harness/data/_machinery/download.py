"""``harness data download NAME``: fetch a benchmark set on a machine with internet access.

What to fetch is declared by each dataset (``DatasetSpec.download``) and each published
corruption set (``DatasetSpec.published_corruptions``), in the dataset's own module
(:mod:`harness.data._machinery.sources`); this module holds only the machinery, read from the
dataset registry at call time:

- :class:`~harness.data._machinery.sources.Torchvision`: torchvision's own ``download=True`` (its
  URLs and md5s; a file already present and intact is not fetched again).
- :class:`~harness.data._machinery.sources.Archives`: the transfer goes to ``<file>.part`` and
  becomes ``<file>`` only once its md5 matches, so an interrupted run never leaves a truncated
  file under the real name; a complete archive already on disk (e.g. extraction was
  interrupted) is checked and reused, not fetched again. A checksum mismatch moves the file
  apart to ``<file>.corrupt`` and names the expected and actual md5. Archives are extracted with
  tarfile's ``data`` filter (torchvision's extractor applies none, and an archive must not write
  outside the data root), then deleted.
- :class:`~harness.data._machinery.sources.Instructions`: the preparation commands are printed.

Every transfer goes through torchvision's download utilities (``torchvision.datasets.utils``): a
progress bar on stderr (the 2.9 GB CIFAR-100-C included) and md5 checks.
``$HARNESS_DOWNLOAD_MIRROR`` (a base URL) replaces the servers of every archive: the file name
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
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from harness.contract.env import DOWNLOAD_MIRROR
from harness.data._machinery.base import DATA_ROOT_ENV
from harness.data._machinery.sources import Archive, Archives, Instructions, Source, Torchvision

MIRROR_ENV = DOWNLOAD_MIRROR.name


def declared() -> dict[str, Source]:
    """Every name ``harness data download`` fetches → its declaration: the datasets that declare
    a download and the published corruption sets, as registered now (plugins included)."""
    from harness.data._machinery.corruption_sets import published_sets
    from harness.registry import DATASETS

    out: dict[str, Source] = {n: s.download for n, s in DATASETS.items() if s.download}
    out.update({n: p.download for n, p in published_sets().items()})
    return out


class _Archives(MutableMapping):
    """:data:`ARCHIVES`: name → the one archive of each single-archive declaration, read from the
    registry when looked up. An entry set here overrides the declared one for later downloads
    (a site's local copy with its own md5; the tests serve fabricated archives this way);
    deleting it restores the declaration."""

    def __init__(self) -> None:
        self._override: dict[str, Archive] = {}

    def _all(self) -> dict[str, Archive]:
        found = {
            name: source.files[0]
            for name, source in declared().items()
            if isinstance(source, Archives) and not callable(source.files)
            and len(source.files) == 1
        }  # fmt: skip
        return {**found, **self._override}

    def __getitem__(self, name: str) -> Archive:
        return self._all()[name]

    def __setitem__(self, name: str, archive: Archive) -> None:
        self._override[name] = archive

    def __delitem__(self, name: str) -> None:
        del self._override[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: The published single-archive sources by name (``dl.ARCHIVES["cifar10-c"].md5``).
ARCHIVES: MutableMapping[str, Archive] = _Archives()


class DownloadError(RuntimeError):
    """A download failed (no network, a bad checksum). The message is one line saying what to do."""


class PrepareByHand(DownloadError):
    """A dataset behind a login or a third-party script: its preparation commands were printed.
    Unlike a network failure, the names after it may still download."""


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def source_url(archive: Archive) -> str:
    """The URL an archive is fetched from: its own, or ``$HARNESS_DOWNLOAD_MIRROR/<file>``."""
    mirror = DOWNLOAD_MIRROR.read("")
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
        raise DownloadError(f"could not extract {dest}: {one_line(err)}") from None
    dest.unlink()
    return Path(root)


def _run_torchvision(source: Torchvision, root: Path) -> None:
    from torchvision import datasets

    cls = getattr(datasets, source.cls)
    for kwargs in source.calls:
        cls(root / source.into if source.into else root, download=True, **kwargs)


def _run_archives(name: str, source: Archives, root: Path) -> None:
    archives = source.archives()
    if len(archives) == 1 and name in ARCHIVES:
        archives = [ARCHIVES[name]]  # an override set in ARCHIVES applies
    into = root / source.into if source.into else root
    into.mkdir(parents=True, exist_ok=True)
    for archive in archives:
        fetch_archive(archive, into)


def _what(name: str, source: Source) -> str:
    """How an error message names where ``name`` comes from."""
    if isinstance(source, Torchvision):
        return source.what
    return source_url(ARCHIVES[name]) if name in ARCHIVES else source.what or name


def downloadable() -> list[str]:
    """Datasets and corruption sets :func:`download` fetches (``harness data download`` also
    takes named weights ``timm:<name>`` / ``torchvision:<Enum>.<VALUE>``)."""
    return sorted(declared())


def download(name: str, root: Path) -> Path:
    """Download one dataset into the data root (named pretrained weights are
    :func:`harness.backbones._weights.download_named`'s; ``harness data download`` takes both).

    Args:
        name: a dataset that declares its download (:func:`downloadable`: cifar10, svhn,
            sst2, ...) or a published corruption set (cifar10-c, imagenet-c).
        root: the data root (``--data-root`` / ``$HARNESS_DATA_ROOT`` / the default cache).

    Returns:
        The root it was written to.

    Raises:
        ValueError: unknown name.
        DownloadError: the network is unreachable, the transfer failed, a checksum does not
            match or the root is not writable (always a one-line message).
    """
    source = declared().get(name)
    if isinstance(source, Instructions):  # behind a login or a third-party script
        if source.ready(Path(root).expanduser()):
            return Path(root).expanduser()
        print(source.text(Path(root).expanduser()), flush=True)
        raise PrepareByHand(f"{name} cannot be downloaded here: prepare it with the commands above")
    if source is None:
        raise ValueError(
            f"nothing to download for {name!r}; choose from {', '.join(downloadable())}, or "
            "pretrained weights timm:<name> / torchvision:<Enum>.<VALUE>"
        )
    root = Path(root).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DownloadError(
            f"cannot write the data root {root}: {one_line(err)}; give a writable "
            f"--data-root DIR (or set ${DATA_ROOT_ENV})"
        ) from None
    what = _what(name, source)
    try:
        if isinstance(source, Torchvision):
            _run_torchvision(source, root)
        elif isinstance(source, Archives):
            _run_archives(name, source, root)
        else:
            raise DownloadError(f"{name}: unknown kind of download declaration {source!r}")
    except DownloadError:
        raise
    except RuntimeError as err:  # torchvision's "File not found or corrupted." (md5 check)
        raise DownloadError(
            f"could not download {name} ({what}) into {root}: {one_line(err)} (the file failed "
            "torchvision's md5 check or is missing after the transfer); run the command again: "
            "torchvision fetches a file whose md5 does not match anew"
        ) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        raise DownloadError(
            f"could not download {name} ({what}) into {root}: {one_line(err)}. This machine "
            f"may have no internet access: run `harness data download {name} --data-root DIR` "
            f"on one that has, then copy DIR here and point --data-root / ${DATA_ROOT_ENV} at it."
        ) from None
    return root
