"""Image files read on demand: a :class:`~harness.data._machinery.base.LazySplit` over (path,
label) lists.

Datasets too large for memory (ImageNet: 1.28 M JPEGs, ~140 GB) are lists of relative file paths
plus int64 labels. :class:`FileSplit` holds them (paths as one NumPy bytes array, so forked loader
workers share it without Python reference counting touching every page); its loader decodes and
augments in ``torch.utils.data.DataLoader`` worker processes on the CPU and hands uint8 batches
to the device, where they are normalised (a quarter of the bytes of float32 on the host link).

Transforms (torchvision's functional ops on PIL images, the reference ImageNet recipe of He et al.
2016 / torchvision's ``references/classification``):

- training (``augment`` "imagenet" or "crop_flip"): ``RandomResizedCrop(size, scale=(0.08, 1),
  ratio=(3/4, 4/3))`` (bilinear, antialiased) + horizontal flip with probability ½;
- evaluation (and ``augment: none``): ``Resize(resize)`` of the short side + ``CenterCrop(size)``
  (224 from 256: the 0.875 crop ratio);
- pre-cropped sets (ImageNet-C ships 224×224 centre crops): no resize when the image already has
  the model's size, otherwise the evaluation transform.

Determinism: the order of an epoch is ``randperm`` from a CPU generator seeded by (seed, epoch,
stream) exactly as :class:`~harness.data._machinery.loader.DeviceLoader` seeds it, and the same
generator draws one 63-bit seed per position of the epoch; the crop and flip of an image come
from that seed alone. So the images, their order and their augmentation do not depend on the
number of loader workers nor on the world size: with ``shard=(rank, world)`` every rank draws
the same global order and decodes only its contiguous block ``[rank·B/world, (rank+1)·B/world)``
of each global batch (the same blocks as ``DeviceLoader``).

Throughput and cores (``benchmarks/bench_file_loader.py``, figures in docs/benchmarks.md): on an
AMD EPYC core, decode + RandomResizedCrop + flip of ImageNet-sized JPEGs (500×375, quality 90)
costs ~2.8 ms of CPU per image (~360 images per CPU-second; decode alone ~1.2 ms), and a worker
adds the batch collation (~300 per CPU-second). ResNet-50 trains at ~3,000 images/s in bf16 on one
H200, so one GPU needs ~10–12 decoding workers and an 8-GPU node ~90–100 cores: a 2×56-core H200
node keeps up with 12–13 workers per GPU (the default takes the node's cores / local ranks − 1, up
to 16), a smaller node does not, and the record's ``loader_images_per_s`` (cost block) says so
next to the model's throughput. ViT-B/16 (~1,000 images/s per GPU) needs a third of that. Where
the CPU is short: a copy of the training set pre-resized to a short side of ~256 px (decode
cost scales with pixels), or GPU decoding (``torchvision.io.decode_jpeg`` on CUDA, DALI, FFCV),
which this module does not do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from harness.contract.env import CONCURRENT_CELLS, LOADER_WORKERS
from harness.data._machinery.base import BatchLoader, LoaderOptions, OptionsLoader

#: Training augmentations a file split accepts (both mean RandomResizedCrop + flip here).
TRAIN_AUGMENTS = ("imagenet", "crop_flip")
#: Set by the local executor in its workers: how many cells run at once on this node.
CONCURRENT_ENV = CONCURRENT_CELLS.name
#: Splits this small are decoded in the main process (spawning workers costs more).
SMALL_SPLIT = 512
WORKERS_ENV = LOADER_WORKERS.name


@dataclass(frozen=True)
class ImageTransform:
    """The per-image transform of a split.

    Attributes:
        size: side of the square model input (224).
        resize: evaluation short-side resize before the centre crop (256).
        scale / ratio: RandomResizedCrop's area and aspect-ratio ranges.
        pre_cropped: images are stored at ``size`` already (ImageNet-C): no resize when they are.
    """

    size: int = 224
    resize: int = 256
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    pre_cropped: bool = False

    def __call__(self, path: str, seed: int | None) -> Tensor:
        """Decode one file and transform it: training when ``seed`` is given, else evaluation.

        Returns:
            uint8 (3, size, size).
        """
        import torchvision.transforms.functional as TF
        from PIL import Image
        from torchvision.transforms import InterpolationMode, RandomResizedCrop

        with Image.open(path) as im:
            img = im.convert("RGB")
        if seed is not None:
            # torchvision's own parameter sampler, fed from this image's seed; fork_rng keeps the
            # caller's generator untouched when decoding runs in the main process.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                i, j, h, w = RandomResizedCrop.get_params(img, list(self.scale), list(self.ratio))
                flip = bool(torch.rand(1) < 0.5)
            img = TF.resized_crop(
                img, i, j, h, w, [self.size, self.size], InterpolationMode.BILINEAR, antialias=True
            )
            if flip:
                img = TF.hflip(img)
        elif not (self.pre_cropped and img.size == (self.size, self.size)):
            img = TF.resize(img, self.resize, InterpolationMode.BILINEAR, antialias=True)
            img = TF.center_crop(img, [self.size, self.size])
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)


class _Decode(torch.utils.data.Dataset):
    """Map-style dataset whose items are ``(row, seed)`` pairs chosen by the loader's sampler."""

    def __init__(self, root: str, files: np.ndarray, labels: Tensor, transform: ImageTransform):
        self.root, self.files, self.labels, self.transform = root, files, labels, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, item: tuple[int, int | None]) -> tuple[Tensor, Tensor]:
        row, seed = item
        path = os.path.join(self.root, self.files[row].decode())
        return self.transform(path, seed), self.labels[row]


@dataclass(frozen=True, eq=False)
class FileSplit:
    """Image files under ``root`` with their labels: a lazy split (see the module docstring).

    Attributes:
        root: folder the relative paths start from.
        files: NumPy bytes array (N,) of relative paths (UTF-8).
        labels: int64 (N,); -1 for unlabelled (OOD) sets.
        transform: how each image becomes a model input.
    """

    root: Path
    files: np.ndarray
    labels: Tensor
    transform: ImageTransform = ImageTransform()

    def __post_init__(self) -> None:
        if len(self.files) != len(self.labels):
            raise ValueError(f"{len(self.files)} files but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> Path:
        """Absolute path of row ``i``."""
        return Path(self.root) / self.files[i].decode()

    def subset(self, idx: Tensor) -> FileSplit:
        """Rows ``idx`` (int64 indices) as a new split."""
        rows = idx.cpu().numpy()
        return replace(self, files=self.files[rows], labels=self.labels[idx.cpu()])

    def relocated(self, root: Path, transform: ImageTransform) -> FileSplit:
        """The same relative paths and labels under another root (ImageNet-C mirrors val/)."""
        return replace(self, root=Path(root), transform=transform)

    def loader(self, options: LoaderOptions) -> BatchLoader:
        return FileLoader(self, options)


def default_workers(n: int) -> int:
    """Loader workers when a suite does not say: 0 for small splits, else this process's share of
    the CPU cores less one for the training loop, capped at 16; ``$HARNESS_LOADER_WORKERS``
    overrides. The cores are shared by the ``$LOCAL_WORLD_SIZE`` ranks of a cell and by the
    ``$HARNESS_CONCURRENT_CELLS`` cells the local executor runs at once on the node (one
    decoder per core in every cell would oversubscribe the node)."""
    if (workers := LOADER_WORKERS.read(None)) is not None:
        return workers
    if n <= SMALL_SPLIT:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    cells = CONCURRENT_CELLS.read(1)
    share = (cores or 1) // (ranks * cells)
    return max(0, min(16, share - 1))


def _collate(size: int, items: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Stack decoded images; an empty block (a rank past the end of a short last global batch)
    is an empty batch, as :class:`~harness.data._machinery.loader.DeviceLoader` yields it."""
    if not items:
        return torch.empty((0, 3, size, size), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


class _Batches:
    """Batch sampler: for every global batch, this rank's ``(row, seed)`` items of every stream,
    streams concatenated (the loader splits them again)."""

    def __init__(self, loader: FileLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[list[tuple[int, int | None]]]:
        ld = self.loader
        n, b = len(ld.split), ld.options.batch_size
        plans = []
        for s in range(ld.options.streams):
            g = ld.generator(s)
            order = torch.randperm(n, generator=g) if ld.options.shuffle else torch.arange(n)
            seeds = torch.randint(0, 2**63 - 1, (n,), generator=g) if ld.augmenting else None
            plans.append((order.tolist(), None if seeds is None else seeds.tolist()))
        for i in range(len(ld)):
            items: list[tuple[int, int | None]] = []
            start = i * b
            size = min(b, n - start)
            lo, hi = ld.block(size)
            for order, seeds in plans:
                for p in range(start + lo, start + hi):
                    items.append((order[p], None if seeds is None else seeds[p]))
            yield items


class FileLoader(OptionsLoader):
    """Batches of a :class:`FileSplit`: ``(x (B, 3, H, W) float normalised on the device, y (B,))``
    — ``(S, B, ...)`` / ``(S, B)`` with several streams, this rank's block only when sharded."""

    def __init__(self, split: FileSplit, options: LoaderOptions) -> None:
        if options.train and options.augment not in (*TRAIN_AUGMENTS, "none"):
            raise ValueError(
                f"augment {options.augment!r} is not available for image files; choose from "
                f"{', '.join(TRAIN_AUGMENTS)} or none"
            )
        self.split, self.options = split, options
        self.augmenting = options.train and options.augment in TRAIN_AUGMENTS
        self.epoch = 0
        self.workers = default_workers(len(split)) if options.workers is None else options.workers
        device = options.device
        self.mean = torch.tensor(options.mean or (0.0,) * 3, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(options.std or (1.0,) * 3, device=device).view(1, -1, 1, 1)
        self._loader: torch.utils.data.DataLoader | None = None

    @property
    def labels(self) -> Tensor:  # read by OptionsLoader and the progress log
        return self.split.labels

    def _data_loader(self) -> torch.utils.data.DataLoader:
        if self._loader is None:  # made once: persistent workers survive the epochs
            s = self.split
            self._loader = torch.utils.data.DataLoader(
                _Decode(str(s.root), s.files, s.labels, s.transform),
                batch_sampler=_Batches(self),
                collate_fn=partial(_collate, s.transform.size),
                num_workers=self.workers,
                pin_memory=self.options.device.type == "cuda",
                persistent_workers=self.workers > 0,
                prefetch_factor=4 if self.workers > 0 else None,
            )
        return self._loader

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        streams, device = self.options.streams, self.options.device
        for x, y in self._data_loader():
            x = x.to(device, non_blocking=True).float().sub_(self.mean * 255).div_(self.std * 255)
            if self.options.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            if streams > 1:  # (S·b, ...) → (S, b, ...), stream-major as the sampler laid it out
                yield x.view(streams, -1, *x.shape[1:]), y.view(streams, -1)
            else:
                yield x, y
