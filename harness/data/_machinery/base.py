"""Dataset specs and the in-memory representation every loader produces.

Every dataset, built-in or downloaded, is materialised as uint8 image tensors (N, C, H, W) plus
int64 labels (N,). One representation keeps the loader generic (a device-resident fast path, the
same augmentation code for all datasets) and makes corrupted copies cacheable in the published
CIFAR-C layout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Union, runtime_checkable

import torch
from torch import Tensor

from harness.contract.env import DATA_ROOT
from harness.data._machinery.sources import PublishedCorruptions, Source
from harness.registry import DATASETS

DATA_ROOT_ENV = DATA_ROOT.name


class DataMissingError(FileNotFoundError):
    """A dataset is not on disk. The message names where we looked and how to fetch it."""


class DataFileError(DataMissingError):
    """A dataset file is on disk but damaged (truncated, not the expected format): as good as
    missing, so the same exit status and fix, fetching it again. The message names the file."""

    def __init__(self, path: Path, reason: str, fetch: str) -> None:
        super().__init__(f"{path}: damaged data file ({reason}); delete it and fetch it again "
                         f"with `{fetch}`")  # fmt: skip
        self.path = Path(path)


def damaged_data_file(
    paths: list[Path], exc: BaseException, fetch: str, probe: Callable[[Path], Any] | None = None
) -> DataFileError:
    """The :class:`DataFileError` for a loader that failed with ``exc`` while reading ``paths``:
    the first file ``probe`` (a reader of one file) fails on, else the first path. Only called on
    the error path: a whole dataset is never read twice."""
    reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    for path in paths if probe else ():
        try:
            probe(path)
        except Exception as err:  # the damaged one: say what reading it alone raised
            detail = (str(err).strip().splitlines() or [""])[0][:200]
            return DataFileError(path, f"{type(err).__name__}: {detail}".rstrip(": "), fetch)
    return DataFileError(paths[0], reason.rstrip(": "), fetch)


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

    def subset(self, idx: Tensor) -> ImageSet:
        """The rows ``idx`` (int64 indices) as a new set."""
        return ImageSet(self.images[idx], self.labels[idx])


@dataclass(frozen=True)
class LoaderOptions:
    """How a split is to be batched: the one argument every loader takes.

    Attributes:
        batch_size: the global batch B of one step (all ranks together).
        device: where batches are produced.
        mean / std: per-channel normalisation on the [0, 1] scale (images).
        augment: "none", "crop_flip" or a dataset-specific name (e.g. "imagenet").
        train: training transforms (True) or evaluation transforms (False).
        shuffle: reshuffle every epoch.
        seed: base seed of order and augmentation.
        drop_last: drop the last incomplete global batch.
        channels_last: produce channels_last image batches (GPU speed).
        streams: independent batches per step (methods whose members train on independent
            data); above 1, batches are (S, B, ...) and labels (S, B).
        shard: ``(rank, world)``: yield only the rank's contiguous block
            ``[rank·B/world, (rank+1)·B/world)`` of every global batch (multi-process cells); the
            global order and augmentation are the same whatever the world size.
        workers: loader worker processes; None lets the split choose.
    """

    batch_size: int
    device: torch.device
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    augment: str = "none"
    train: bool = False
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    channels_last: bool = False
    streams: int = 1
    shard: tuple[int, int] = (0, 1)
    workers: int | None = None

    def __post_init__(self) -> None:
        rank, world = self.shard
        if not 0 <= rank < world:
            raise ValueError(f"shard must be (rank, world), 0 <= rank < world; got {self.shard}")
        if self.streams < 1:
            raise ValueError(f"streams must be >= 1, got {self.streams}")


@runtime_checkable
class BatchLoader(Protocol):
    """What every loader is: batches ``(x on the device, y int64 (B,))`` (``(S, B, ...)``/
    ``(S, B)`` with several streams), a length in batches per epoch, and an epoch setter; order
    and augmentation are a function of (seed, epoch, stream) only.

    Attributes (read by the progress log to count the images an epoch fed):
        labels: int64 (N,) of the whole split.
        batch_size: the global batch B.
        drop_last: whether the last incomplete batch is dropped.
        streams: independent batches per step.
    """

    labels: Tensor
    batch_size: int
    drop_last: bool
    streams: int

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...


def stream_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """Seed of one stream's order and augmentation in one epoch, the same for every loader.

    Stream 0 keeps the seeding every method shares; stream s > 0 is offset by s times a large
    prime, far beyond any (seed, epoch) offset in use, so streams never share a seed.
    """
    return seed * 100_003 + epoch + stream * 1_000_000_007


def shard_block(batch: int, shard: tuple[int, int]) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``batch`` rows that belong to rank ``shard[0]`` of
    ``shard[1]`` (the last ranks get one row fewer when the world size does not divide it)."""
    rank, world = shard
    base, extra = divmod(batch, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


class OptionsLoader:
    """What every loader built from :class:`LoaderOptions` shares: the attributes of
    :class:`BatchLoader`, batches per epoch, the epoch, the per-stream generators and the rank's
    block of a global batch. Subclasses set ``options`` and ``labels`` and yield the batches."""

    options: LoaderOptions
    labels: Tensor
    epoch: int = 0

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    @property
    def drop_last(self) -> bool:
        return self.options.drop_last

    @property
    def streams(self) -> int:
        return self.options.streams

    def __len__(self) -> int:
        n, b = len(self.labels), self.options.batch_size
        return n // b if self.options.drop_last else -(-n // b)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def generator(self, stream: int = 0) -> torch.Generator:
        """The CPU generator of one stream for the current epoch (order and augmentation)."""
        return torch.Generator().manual_seed(stream_seed(self.options.seed, self.epoch, stream))

    def block(self, batch: int) -> tuple[int, int]:
        """This rank's rows ``[lo, hi)`` of a global batch of ``batch`` rows."""
        return shard_block(batch, self.options.shard)


@runtime_checkable
class LazySplit(Protocol):
    """A split that is not an in-memory :class:`ImageSet`: images read from files as they are
    needed (ImageNet) or inputs that are not images (token ids). It knows its labels, can be
    subset (validation hold-out), and makes its own loader.

    Attributes:
        labels: int64 (N,); -1 where a set has no labels (OOD sets).
    """

    labels: Tensor

    def __len__(self) -> int: ...

    def subset(self, idx: Tensor) -> LazySplit: ...

    def loader(self, options: LoaderOptions) -> BatchLoader: ...


#: Any split a dataset's ``load`` may return.
Split = Union[ImageSet, LazySplit]  # noqa: UP007 - a runtime alias, read by isinstance users


@dataclass(frozen=True)
class DatasetSpec:
    """Registration record of a dataset.

    Attributes:
        name: Registry name.
        in_shape: the model input's shape: (C, H, W) of its images, (L,) for token ids.
        num_classes: K for in-distribution use; None for OOD-only sets.
        mean / std: per-channel normalisation on the [0, 1] scale.
        load: ``load(root) -> {"train", "test"[, "spare"]: Split}`` (the whole training pool,
            the test set and, for a dataset that trains on a subset, ``spare``: images of the
            training distribution it never trains on; a validation or calibration split is
            carved by :func:`training_splits`, only when a suite asks for one); OOD-only sets
            return "test".
        location: ``location(root) -> Path`` the files it needs (for error messages).
        fetch: shell command that downloads it (empty for built-in data).
        augment: default training augmentation ("none" or "crop_flip").
        description: one line for ``harness ls``.
        download: how ``harness data download <name>`` fetches it
            (:mod:`harness.data._machinery.sources`); None: nothing to download (built-in or
            generated data).
        published_corruptions: its published corruption set (CIFAR-10-C), read by the
            corruption evaluation and fetched by ``harness data download <set name>``; None:
            corrupted copies are generated with torch-uncertainty's transforms.
        spare_images: how many images its ``spare`` split holds (declared, so ``validate``
            needs no data; 0: none, every training image is in the pool). Validation and
            calibration splits are drawn from them.
        corruption_key: the name its generated corrupted copies are seeded and cached under,
            shared by datasets with one test set (the Fashion-MNIST variants); None: its own
            name.
        ood_groups: which OOD sets are near- (semantic shift) and which far-OOD (different
            image statistics) next to it, ``{set: "near" | "far"}``, as OpenOOD v1.5 (Zhang et
            al., 2023, Table 1) splits its benchmarks. The engine writes the evaluated sets'
            groups into each record (``evaluation.ood_groups``), where the reporter reads them
            for its near/far means; a set in neither group has its per-set columns only.
    """

    name: str
    in_shape: tuple[int, ...]
    num_classes: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    load: Callable[[Path], dict[str, Split]]
    location: Callable[[Path], Path]
    fetch: str = ""
    augment: str = "none"
    description: str = ""
    is_available: Callable[[Path], bool] = field(default=lambda root: True)
    download: Source | None = None
    published_corruptions: PublishedCorruptions | None = None
    spare_images: int = 0
    corruption_key: str | None = None
    ood_groups: Mapping[str, Literal["near", "far"]] = field(default_factory=dict)

    @property
    def corruption_source(self) -> str | None:
        """The published corruption set's name ("cifar10-c"), None when copies are generated."""
        return self.published_corruptions.name if self.published_corruptions else None

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
    """Register a dataset spec in the global dataset registry (what a dataset module or plugin
    calls at import). Raises ``DuplicateNameError`` for a name already registered."""
    DATASETS.register(spec.name, spec)
    return spec


def default_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """Resolve where data lives: explicit flag, then $HARNESS_DATA_ROOT, then the user cache."""
    if explicit:
        return Path(explicit).expanduser()
    if (root := DATA_ROOT.read(None)) is not None:
        return root
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "implicit-ensemble-harness" / "data"


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


#: Seed of the validation carve-out: fixed, independent of the cell's seed, so every method and
#: seed is selected on the same held-out images.
VALIDATION_SEED = 0


def stratified_holdout(labels: Tensor, count: int, seed: int = VALIDATION_SEED) -> Tensor:
    """Indices of exactly ``count`` samples, stratified by class (largest-remainder quotas),
    each class's share drawn by a seeded permutation.

    Args:
        labels: int64 ``(N,)`` class labels.
        count: how many to hold out, ``0 <= count < N``.
        seed: generator seed.

    Returns:
        Sorted int64 indices ``(count,)``.
    """
    n = len(labels)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < n:
        raise ValueError(f"validation must be an integer in [0, {n}), got {count!r}")
    classes, sizes = labels.unique(sorted=True, return_counts=True)
    exact = sizes.double() * count / n
    quota = exact.floor().long()
    # Largest remainders (ties: lower class first) receive the images rounding left over.
    short = count - int(quota.sum())
    order = sorted(range(len(classes)), key=lambda i: (-(exact[i] - quota[i]).item(), i))
    for i in order[:short]:
        quota[i] += 1
    g = torch.Generator().manual_seed(seed)
    picked = []
    for cls, q in zip(classes, quota.tolist()):
        idx = (labels == cls).nonzero().flatten()
        picked.append(idx[torch.randperm(len(idx), generator=g)[:q]])
    return torch.cat(picked).sort().values


#: Seed of the permutation whose first ``evaluation.limit`` images a limited evaluation scores:
#: fixed, independent of the cell's seed, so every cell and every run scores the same images.
LIMIT_SEED = 2


def limit_indices(n: int, limit: int | None) -> Tensor | None:
    """The images a limited evaluation (``evaluation.limit``) scores of a set of ``n``: the
    first ``limit`` of a permutation seeded :data:`LIMIT_SEED`, sorted into the set's order
    (nested: a smaller limit's images are among a larger one's), or None for the whole set
    (no limit, or one of ``n`` or more). Not stratified: OOD sets have no labels, and one rule
    serves the test set, every corruption of it and every OOD set."""
    if not limit or limit >= n:
        return None
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(LIMIT_SEED))
    return perm[:limit].sort().values


def limited(split: Split, limit: int | None) -> Split:
    """``split`` cut to :func:`limit_indices`' images (the split itself when it is whole)."""
    idx = limit_indices(len(split), limit)
    return split if idx is None else split.subset(idx)


#: Seed of the calibration carve-out (post-hoc calibration and conformal sets): fixed and
#: independent of the cell's seed, so every method of a suite is calibrated on the same images.
CALIBRATION_SEED = 1


def training_splits(
    splits: dict[str, Split],
    validation: int,
    seed: int = VALIDATION_SEED,
    calibration: int = 0,
) -> dict[str, Split]:
    """The splits a run trains, selects and calibrates on.

    Everything a loader returns besides ``test`` and ``spare`` is the training pool (a loader's
    own fixed ``val`` goes back into it). With ``validation == 0`` the whole pool trains and there
    is no ``val`` split (published CIFAR numbers train on all 50,000 images; nothing may be
    selected on the test set). With ``validation = n > 0``, exactly ``n`` images — stratified by
    class, drawn with a fixed seed independent of the cell's seed — are held out as ``val``: from
    the loader's ``spare`` images when it has them (a dataset that trains on a subset keeps its
    whole pool, e.g. ``fashion_mnist_10k``'s 10,000), otherwise from the pool.

    ``calibration = c > 0`` draws ``c`` further images (stratified, :data:`CALIBRATION_SEED`) from
    the ``spare`` images left after ``val`` as ``calibration``: held-out images of the training
    distribution on which post-hoc calibration is fitted, disjoint from ``train`` and ``val``.

    Args:
        splits: ``{"train", "test"[, "val"][, "spare"]}`` as a dataset's ``load`` returns.
        validation: images to hold out for validation (the recipe's ``validation``).
        seed: seed of the validation hold-out.
        calibration: images to hold out for calibration (the evaluation's ``calibration``).

    Returns:
        ``{"train", "test"}`` plus ``"val"`` when ``validation > 0`` and ``"calibration"``
        when ``calibration > 0``.

    Raises:
        ValueError: a count negative, not an integer, or not smaller than what it is drawn
            from; ``calibration > 0`` for a dataset without spare images.
    """
    pool = splits["train"]
    if "val" in splits:
        if not isinstance(pool, ImageSet):
            raise TypeError("a dataset of lazy splits returns its validation images in 'train'")
        pool = ImageSet(
            torch.cat([pool.images, splits["val"].images]),
            torch.cat([pool.labels, splits["val"].labels]),
        )
    out = {"train": pool, "test": splits["test"]}
    spare = splits.get("spare")
    if validation:
        source = spare if spare is not None else pool
        held = stratified_holdout(source.labels, validation, seed)
        rest = torch.ones(len(source), dtype=torch.bool)
        rest[held] = False
        out["val"] = source.subset(held)
        if spare is not None:  # the pool trains whole; val and calibration never overlap
            spare = spare.subset(rest.nonzero().flatten())
        else:
            out["train"] = pool.subset(rest.nonzero().flatten())
    if calibration:
        if spare is None:
            raise ValueError(
                "calibration: the dataset trains on every training image it has (no spare "
                "images); fit post-hoc calibration on the recipe's validation split instead"
            )
        if isinstance(calibration, bool) or not isinstance(calibration, int):
            raise ValueError(f"calibration must be an integer, got {calibration!r}")
        if not 0 < calibration <= len(spare):
            raise ValueError(
                f"calibration must be in [1, {len(spare)}] (the spare images left after "
                f"validation), got {calibration}"
            )
        held = (
            torch.arange(len(spare))
            if calibration == len(spare)
            else stratified_holdout(spare.labels, calibration, CALIBRATION_SEED)
        )
        out["calibration"] = spare.subset(held)
    return out
