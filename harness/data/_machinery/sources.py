"""How a dataset or a published corruption set is fetched: declarations, read by
``harness data download`` (:mod:`harness.data._machinery.download`, which holds the machinery:
md5 checks, ``.part`` transfers, safe extraction, progress, one-line errors).

A dataset module declares its download on its :class:`~harness.data._machinery.base.DatasetSpec`
(``download=``) and, when its corrupted test sets are published files, those too
(``published_corruptions=``), so adding a dataset with its download is one file. Plain data,
standard library only: declaring costs nothing at import and nothing here touches the network.

- :class:`Archives`: published files (URL + md5) fetched into ``<root>/<into>``, md5-checked,
  extracted (tar with tarfile's ``data`` filter, or zip) and deleted;
- :class:`Torchvision`: a ``torchvision.datasets`` class called with ``download=True`` (its own
  URLs and md5s) once per keyword set, under ``<root>/<into>``;
- :class:`Instructions`: a set behind a login or a third-party script: the commands to prepare
  it are printed, and the download succeeds only when the files are already there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union


@dataclass(frozen=True)
class Archive:
    """One published file: where it is served and its published md5."""

    url: str
    md5: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Archives:
    """Published archives, extracted into ``<root>/<into>`` (``""``: the data root itself).

    Attributes:
        files: the archives, or a function returning them when the list comes from a library
            at download time (ImageNet-C's, from torch-uncertainty): looked up only then.
        into: sub-folder of the data root the archives are extracted in.
        what: how error messages name the source when there are several archives.
    """

    files: tuple[Archive, ...] | Callable[[], Sequence[Archive]]
    into: str = ""
    what: str = ""

    def archives(self) -> list[Archive]:
        return list(self.files() if callable(self.files) else self.files)


@dataclass(frozen=True)
class Torchvision:
    """``torchvision.datasets.<cls>(<root>/<into>, download=True, **kwargs)`` per entry of
    ``calls`` (e.g. the train and the test split); ``note`` is added to the name in messages."""

    cls: str
    calls: tuple[Mapping[str, Any], ...] = ({},)
    into: str = ""
    note: str = ""

    @property
    def what(self) -> str:
        return f"torchvision {self.cls}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Instructions:
    """A set the harness cannot fetch: ``text(root)`` is printed (the commands that prepare it),
    and the download fails unless ``ready(root)``."""

    text: Callable[[Path], str]
    ready: Callable[[Path], bool]


#: What a spec's ``download`` may be.
Source = Union[Archives, Torchvision, Instructions]  # noqa: UP007 - a runtime alias


@dataclass(frozen=True)
class PublishedCorruptions:
    """A published corruption set (CIFAR-10-C, ImageNet-C) a dataset is evaluated on.

    Attributes:
        name: what suites, records and ``harness data download`` call it (``cifar10-c``).
        folder: its folder under the data root (``CIFAR-10-C``).
        download: how it is fetched.
        read: ``read(root, test, corruption, severity) -> split`` for a layout other than the
            CIFAR-C one; None: ``<folder>/<corruption>.npy`` (uint8 (5·N, H, W, C), severity s
            at rows (s−1)·N … s·N − 1) and ``<folder>/labels.npy``, read by
            :func:`harness.data._machinery.corruptions.read_cifar_c`. With ``read``, each
            corruption is a folder ``<folder>/<corruption>/``.
    """

    name: str
    folder: str
    download: Source
    read: Callable[..., Any] | None = field(default=None, compare=False)
