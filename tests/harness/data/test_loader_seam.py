"""The data seam: one loader factory for in-memory image sets and lazy splits, validation
hold-out through ``subset``, and sharding of every global batch across the ranks of a cell."""

from __future__ import annotations

import pytest
import torch

from harness.data._machinery.base import ImageSet, LazySplit, LoaderOptions, training_splits
from harness.data._machinery.loader import DeviceLoader, make_loader

CPU = torch.device("cpu")


def _images(n: int = 10) -> ImageSet:
    images = torch.arange(n * 3 * 4 * 4).reshape(n, 3, 4, 4).to(torch.uint8)
    return ImageSet(images, torch.arange(n) % 2)


def _opts(**kw) -> LoaderOptions:
    base = dict(batch_size=4, device=CPU, mean=(0.0,) * 3, std=(1 / 255,) * 3, seed=3)
    return LoaderOptions(**{**base, **kw})


def test_shards_partition_each_global_batch_whatever_the_world_size():
    data = _images(10)
    train = dict(train=True, shuffle=True, augment="crop_flip")
    whole = list(make_loader(data, _opts(**train)))
    for world in (2, 3):
        parts = [list(make_loader(data, _opts(shard=(r, world), **train))) for r in range(world)]
        for step, (x, y) in enumerate(whole):
            xs = torch.cat([p[step][0] for p in parts])
            ys = torch.cat([p[step][1] for p in parts])
            # Same rows, same augmentation draws, in the global order: the world size changes
            # who computes a row, never which rows or how they were augmented.
            assert torch.equal(ys, y)
            assert torch.equal(xs, x)
    sizes = [len(b[1]) for b in make_loader(data, _opts(shard=(2, 3), **train))]
    assert sizes == [1, 1, 0]  # 4 = 2+1+1, 4 = 2+1+1, 2 = 1+1+0


def test_make_loader_trains_with_augmentation_only_in_training():
    data = _images(8)
    ev = make_loader(data, _opts(augment="crop_flip", train=False))
    assert isinstance(ev, DeviceLoader) and ev.augment == "none"
    tr = make_loader(data, _opts(augment="crop_flip", train=True))
    assert tr.augment == "crop_flip"


def test_bad_shard_is_rejected():
    with pytest.raises(ValueError, match="shard must be"):
        _opts(shard=(2, 2))


class _Tokens:
    """A minimal lazy split: rows of token ids, a loader that yields them in order."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx: torch.Tensor) -> _Tokens:
        return _Tokens(self.ids[idx], self.labels[idx])

    def loader(self, options: LoaderOptions):
        b = options.batch_size
        return [(self.ids[i : i + b], self.labels[i : i + b]) for i in range(0, len(self), b)]


def test_lazy_split_makes_its_own_loader_and_is_held_out_by_subset():
    ids = torch.arange(40).reshape(20, 2)
    split = _Tokens(ids, torch.arange(20) % 2)
    assert isinstance(split, LazySplit)
    out = training_splits({"train": split, "test": split.subset(torch.arange(4))}, validation=6)
    assert len(out["train"]) == 14 and len(out["val"]) == 6
    assert int(out["val"].labels.sum()) == 3  # stratified: 3 of each class
    # Disjoint and complete: every row is in exactly one of train / val.
    rows = torch.cat([out["train"].ids[:, 0], out["val"].ids[:, 0]]).sort().values
    assert torch.equal(rows, ids[:, 0])
    batches = make_loader(out["val"], _opts(batch_size=4))
    assert [len(y) for _, y in batches] == [4, 2]
