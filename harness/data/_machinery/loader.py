"""A device-resident loader: uint8 images live on the accelerator, augmentation runs there.

When a dataset fits in device memory (CIFAR-10: 150 MB as uint8) keeping it there and augmenting
batched on the device removes the host→device copy and the per-image CPU transforms that
otherwise starve a fast model. The random crop offsets, flips and the order of samples come from a
CPU generator seeded by (seed, epoch), so every method sees the same data in the same order; they
are drawn once per epoch and reach the device in one transfer (no copy, so no synchronisation,
inside the training step).

Methods whose members train on independent data (deep ensembles, Lakshminarayanan et al. 2017)
ask for ``streams = M``: every step then yields M batches stacked as (M, B, C, H, W), stream s
with its own order and augmentation from its own generator (stream 0 is the shared stream every
other method of the seed sees), still fully determined by (seed, stream, epoch).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.data._machinery.base import (
    BatchLoader,
    ImageSet,
    LoaderOptions,
    Split,
    shard_block,
    stream_seed,
)


def make_loader(data: Split, options: LoaderOptions) -> BatchLoader:
    """The one place a loader is made: an in-memory :class:`ImageSet` gets the device-resident
    :class:`DeviceLoader`; any other split (files read on demand, token ids) makes its own.

    Args:
        data: the split.
        options: batching, transforms, seeding and sharding (``shard=(rank, world)``).

    Returns:
        An iterable of ``(x, y)`` batches with ``len`` and ``set_epoch``.
    """
    if not isinstance(data, ImageSet):
        return data.loader(options)
    augment = options.augment if options.train else "none"
    return DeviceLoader(
        data,
        options.batch_size,
        options.device,
        options.mean,
        options.std,
        augment=augment,
        shuffle=options.shuffle,
        seed=options.seed,
        drop_last=options.drop_last,
        channels_last=options.channels_last,
        streams=options.streams,
        shard=options.shard,
    )


class DeviceLoader:
    """Iterate normalised float batches from uint8 images kept on ``device``.

    Args:
        data: images uint8 (N, C, H, W) and labels (N,).
        batch_size: B.
        device: where images live and batches are produced.
        mean / std: per-channel normalisation on the [0, 1] scale.
        augment: "none" or "crop_flip" (4-pixel zero padding, random crop, horizontal flip).
        shuffle: reshuffle every epoch (training); sequential otherwise.
        seed: base seed of order and augmentation.
        drop_last: drop the last incomplete batch (training).
        channels_last: produce channels_last batches (GPU speed).
        streams: independent batches per step; above 1, batches are (S, B, C, H, W) and labels
            (S, B), stream s drawn from its own generator.
        shard: ``(rank, world)``: yield only the rank's contiguous block of every global batch
            (multi-process cells). Order and augmentation are drawn for the whole global batch,
            so they do not depend on the world size.
    """

    def __init__(
        self,
        data: ImageSet,
        batch_size: int,
        device: torch.device,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        augment: str = "none",
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        channels_last: bool = False,
        streams: int = 1,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        if augment not in ("none", "crop_flip"):
            raise ValueError(f"augment must be 'none' or 'crop_flip', got {augment!r}")
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        self.images = data.images.to(device)  # uint8 (N, C, H, W)
        self.labels = data.labels.to(device)
        self.batch_size = batch_size
        self.device = device
        c = self.images.shape[1]
        self.mean = torch.tensor(mean, device=device).view(1, c, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, c, 1, 1) * 255
        self.augment = augment
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.channels_last = channels_last
        self.streams = streams
        self.rank, self.world = shard
        if not 0 <= self.rank < self.world:
            raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, got {shard}")
        self.epoch = 0

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def generator(self, stream: int = 0) -> torch.Generator:
        """The CPU generator of one stream for the current epoch (order, crops and flips);
        :func:`harness.data._machinery.base.stream_seed` keeps streams apart."""
        return torch.Generator().manual_seed(stream_seed(self.seed, self.epoch, stream))

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        plan = self.epoch_plan()  # (S, 4, N'): order, row offset, column offset, flip
        for i in range(len(self)):
            xs, ys = [], []
            for s in range(self.streams):
                step = plan[s, :, i * self.batch_size : (i + 1) * self.batch_size]  # (4, B)
                idx = step[0]
                x = self.images[idx]  # uint8 (B, C, H, W)
                if self.augment == "crop_flip":
                    x = crop_flip(x, step[1], step[2], step[3].bool())  # global batch, then shard
                lo, hi = self.block(len(idx))
                xs.append(self.normalize(x[lo:hi]))
                ys.append(self.labels[idx[lo:hi]])
            if self.streams == 1:
                yield xs[0], ys[0]
            else:  # stacking keeps each stream's channels_last layout
                yield torch.stack(xs), torch.stack(ys)  # (S, B, C, H, W), (S, B)

    def epoch_plan(self) -> Tensor:
        """The epoch's whole draw, on the device in one transfer: (S, 4, N') int64 rows of
        sample index, crop row offset, crop column offset and flip (0/1) per position of the
        epoch order, N' the rows the epoch's batches use.

        Drawing per step (and copying each draw to the device) made 4 host→device copies per
        step and stream, each a device synchronisation from pageable memory. The draws are the
        same values in the same order as per-step drawing from the stream's CPU generator
        (order, then per batch row offsets, column offsets, flips), so the data of a seed do
        not change; on CUDA the plan is copied from pinned memory with ``non_blocking``.
        """
        n, b = len(self.labels), self.batch_size
        used = len(self) * b if self.drop_last else n
        plans = []
        for stream in range(self.streams):
            g = self.generator(stream)
            order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
            order = order[:used]
            offsets = torch.zeros(3, used, dtype=torch.int64)
            if self.augment == "crop_flip":
                for i in range(0, used, b):
                    rows = min(b, used - i)
                    offsets[0, i : i + rows] = torch.randint(0, 2 * PAD + 1, (rows,), generator=g)
                    offsets[1, i : i + rows] = torch.randint(0, 2 * PAD + 1, (rows,), generator=g)
                    offsets[2, i : i + rows] = torch.rand(rows, generator=g) < 0.5
            plans.append(torch.cat([order[None], offsets]))  # (4, N')
        plan = torch.stack(plans)  # (S, 4, N')
        if self.device.type == "cuda":
            return plan.pin_memory().to(self.device, non_blocking=True)
        return plan.to(self.device)

    def block(self, batch: int) -> tuple[int, int]:
        """This rank's rows ``[lo, hi)`` of a global batch of ``batch`` rows."""
        return shard_block(batch, (self.rank, self.world))

    def normalize(self, x: Tensor) -> Tensor:
        """uint8 (B, C, H, W) → normalised float32."""
        out = (x.float() - self.mean) / self.std
        if self.channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        return out


PAD = 4  # zero padding of the random crop (the CIFAR recipe's 4 pixels)


def crop_flip(x: Tensor, oy: Tensor, ox: Tensor, flip: Tensor, pad: int = PAD) -> Tensor:
    """Random crop after zero padding and random horizontal flip, batched on x's device.

    Args:
        x: uint8 (B, C, H, W).
        oy / ox: (B,) integer crop offsets in [0, 2·pad], on x's device.
        flip: (B,) bool, on x's device: mirror the row.

    Returns:
        uint8 (B, C, H, W).
    """
    b, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))  # (B, C, H+2p, W+2p)
    rows = oy[:, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = ox[:, None] + torch.arange(w, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(-1), cols)  # mirror the column index
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)
