"""Dataset specs and the in-memory representation every loader produces.

Every dataset, built-in or downloaded, is materialised as uint8 image tensors (N, C, H, W) plus
int64 labels (N,). One representation keeps the loader generic (a device-resident fast path, the
same augmentation code for all datasets) and makes corrupted copies cacheable in the published
CIFAR-C layout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.registries import DATASETS

DATA_ROOT_ENV = "HARNESS_DATA_ROOT"


class DataMissingError(FileNotFoundError):
    """A dataset is not on disk. The message names where we looked and how to fetch it."""


@dataclass(frozen=True)
class ImageSet:
    """Images and labels of one split.

    Attributes:
        images: uint8 (N, C, H, W).
        labels: int64 (N,); -1 where a set has no labels (OOD sets).
    """

    images: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise TypeError(
                f"images must be uint8 (N, C, H, W), got {self.images.dtype} "
                f"{tuple(self.images.shape)}"
            )
        if len(self.images) != len(self.labels):
            raise ValueError("images and labels differ in length")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class DatasetSpec:
    """Registration record of a dataset.

    Attributes:
        name: Registry name.
        in_shape: (C, H, W) of its images.
        num_classes: K for in-distribution use; None for OOD-only sets.
        mean / std: per-channel normalisation on the [0, 1] scale.
        load: ``load(root) -> {"train"|"val"|"test": ImageSet}``; OOD-only sets return "test".
        location: ``location(root) -> Path`` the files it needs (for error messages).
        fetch: shell command that downloads it (empty for built-in data).
        augment: default training augmentation ("none" or "crop_flip").
        corruption_source: "cifar10-c"/"cifar100-c" for published corruption files, or None to
            generate corrupted copies with torch-uncertainty's transforms.
        description: one line for ``harness ls``.
    """

    name: str
    in_shape: tuple[int, int, int]
    num_classes: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    load: Callable[[Path], dict[str, ImageSet]]
    location: Callable[[Path], Path]
    fetch: str = ""
    augment: str = "none"
    corruption_source: str | None = None
    description: str = ""
    is_available: Callable[[Path], bool] = field(default=lambda root: True)

    def require(self, root: Path) -> None:
        """Raise :class:`DataMissingError` unless the files are present."""
        if not self.is_available(root):
            where = self.location(root)
            raise DataMissingError(
                f"dataset {self.name!r} not found: looked in {where}. "
                f"Fetch it with `{self.fetch or 'harness data download ' + self.name}` "
                f"(or point --data-root / ${DATA_ROOT_ENV} at a folder that has it)."
            )


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    DATASETS.register(spec.name, spec)
    return spec


def default_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """Resolve where data lives: explicit flag, then $HARNESS_DATA_ROOT, then the user cache."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get(DATA_ROOT_ENV):
        return Path(os.environ[DATA_ROOT_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "implicit-ensemble-harness" / "data"


def adapt_images(images: Tensor, in_shape: tuple[int, int, int]) -> Tensor:
    """Make an OOD set look like the in-distribution inputs (channels and size).

    Args:
        images: uint8 (N, C', H', W').
        in_shape: target (C, H, W).

    Returns:
        uint8 (N, C, H, W): RGB↔grey by luminance/repetition, bilinear (antialiased) resize.
    """
    c, h, w = in_shape
    x = images.float()
    if x.shape[1] != c:
        if c == 1:  # ITU-R 601 luma, as PIL's convert("L")
            wts = torch.tensor([0.299, 0.587, 0.114])[: x.shape[1]].view(1, -1, 1, 1)
            x = (x * wts).sum(1, keepdim=True)
        else:
            x = x.mean(1, keepdim=True).expand(-1, c, -1, -1)
    if x.shape[-2:] != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)


def stratified_split(labels: Tensor, fractions: tuple[float, ...], seed: int) -> list[Tensor]:
    """Indices of a stratified split with the given fractions (last takes the rest)."""
    g = torch.Generator().manual_seed(seed)
    parts: list[list[Tensor]] = [[] for _ in fractions]
    for cls in labels.unique(sorted=True):
        idx = (labels == cls).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        start = 0
        for i, frac in enumerate(fractions):
            stop = len(idx) if i == len(fractions) - 1 else start + round(frac * len(idx))
            parts[i].append(idx[start:stop])
            start = stop
    return [torch.cat(p).sort().values for p in parts]
