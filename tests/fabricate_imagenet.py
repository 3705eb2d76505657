"""Tiny ImageNet, ImageNet-C and OpenOOD trees in their published layouts, with real JPEGs.

- ImageNet: ``imagenet/{train,val}/<wnid>/*.JPEG`` (a plain folder tree) or, with
  ``layout="torchvision"``, the same plus ``imagenet/meta.bin`` as torchvision's ``ImageNet``
  writes it (``torch.save((wnid_to_classes, val_wnids))``).
- ImageNet-C: ``imagenet-c/<corruption>/<severity>/<wnid>/<val file name>``, 224×224 JPEGs.
- OpenOOD v1.5: ``openood/benchmark_imglist/imagenet/test_<name>.txt`` (``<path> -1`` lines) and
  the images under ``openood/images_largescale/`` or ``openood/images_classic/``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

WNIDS = ("n01440764", "n01443537", "n01484850")  # tench, goldfish, great white shark
OPENOOD = {  # harness name → (OpenOOD imglist name, images folder, first path component)
    "openood_ssb_hard": ("ssb_hard", "images_largescale", "ssb_hard"),
    "openood_ninco": ("ninco", "images_largescale", "ninco"),
    "openood_inaturalist": ("inaturalist", "images_largescale", "inaturalist"),
    "openood_textures": ("textures", "images_classic", "texture"),
    "openood_openimage_o": ("openimage_o", "images_largescale", "openimage_o"),
}


def _jpeg(path: Path, rng: np.random.Generator, h: int, w: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Smooth images (a colour gradient plus noise) so resizes and crops change pixel values.
    base = np.linspace(0, 200, w)[None, :, None] + np.linspace(0, 50, h)[:, None, None]
    img = base + rng.integers(0, 55, (h, w, 3))
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(path, quality=90)


def write_imagenet(
    root: Path,
    layout: str = "folder",
    wnids: tuple[str, ...] = WNIDS,
    train_per_class: int = 4,
    val_per_class: int = 2,
    seed: int = 0,
) -> Path:
    """Write ``root/imagenet`` (JPEGs of 40–70 × 50–90 px; class folders written in reverse wnid
    order so that sorting matters). Returns the imagenet folder."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "imagenet"
    val_index = 1
    for wnid in reversed(wnids):
        for i in range(train_per_class):
            h, w = rng.integers(40, 70), rng.integers(50, 90)
            _jpeg(folder / "train" / wnid / f"{wnid}_{10 * (train_per_class - i)}.JPEG", rng, h, w)
        for _ in range(val_per_class):
            h, w = rng.integers(40, 70), rng.integers(50, 90)
            _jpeg(folder / "val" / wnid / f"ILSVRC2012_val_{val_index:08d}.JPEG", rng, h, w)
            val_index += 1
    if layout == "torchvision":
        classes = {w: (f"class {w}",) for w in wnids}
        val_wnids = [w for w in reversed(wnids) for _ in range(val_per_class)]
        torch.save((classes, val_wnids), folder / "meta.bin")
    return folder


def write_imagenet_c(
    root: Path,
    corruptions: tuple[str, ...],
    severities: tuple[int, ...] = (1,),
    size: int = 224,
    seed: int = 1,
) -> None:
    """Write ``root/imagenet-c/<c>/<s>/<wnid>/<file>`` for every file of ``root/imagenet/val``."""
    rng = np.random.default_rng(seed)
    val = Path(root) / "imagenet" / "val"
    files = sorted(p.relative_to(val) for p in val.glob("*/*.JPEG"))
    for c in corruptions:
        for s in severities:
            for rel in files:
                _jpeg(Path(root) / "imagenet-c" / c / str(s) / rel, rng, size, size)


def write_openood(root: Path, per_set: int = 3, seed: int = 2) -> dict[str, list[str]]:
    """Write the five OpenOOD ImageNet OOD sets; returns each set's imglist paths in order."""
    rng = np.random.default_rng(seed)
    data = Path(root) / "openood"
    lists = data / "benchmark_imglist" / "imagenet"
    lists.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (openood, images, top) in OPENOOD.items():
        rels = [f"{top}/sub{i % 2}/img_{per_set - i}.jpg" for i in range(per_set)]
        for rel in rels:
            _jpeg(data / images / rel, rng, int(rng.integers(30, 60)), int(rng.integers(30, 60)))
        (lists / f"test_{openood}.txt").write_text("".join(f"{r} -1\n" for r in rels))
        out[name] = rels
    return out


def write_for_suites(root: Path) -> None:
    """Everything ``harness validate suites/imagenet_*.yaml --data-root root`` checks: ImageNet
    (plain layout), one severity of every ImageNet-C corruption folder (8×8 images: only the
    folders are checked) and the five OpenOOD lists."""
    from harness.data._machinery.corruption_sets import ALL_CORRUPTIONS

    write_imagenet(root, train_per_class=1, val_per_class=1)
    write_imagenet_c(root, ALL_CORRUPTIONS, size=8)
    write_openood(root, per_set=1)
