"""Decode + augmentation throughput of the ImageNet file loader, per CPU core.

Builds a folder of ImageNet-like JPEGs (random 500×375 crops of the real photographs shipped with
scikit-learn and matplotlib, re-encoded at quality 90: ImageNet's typical size and quality, ~110 kB
each) and times, in one process with one torch thread (one core):

- PIL decode only (``Image.open(...).convert("RGB")``) and ``torchvision.io.decode_jpeg`` (CPU);
- the training transform (decode + RandomResizedCrop 224 + flip → uint8 tensor);
- the evaluation transform (decode + Resize 256 + CenterCrop 224);
- the whole :class:`~harness.data._machinery.file_loader.FileLoader` (batches of 64, normalised
  float32) with 0 workers and with ``--workers`` worker processes.

Usage::

    python benchmarks/bench_file_loader.py [--images 256] [--workers 2] [--repeats 3]

Prints one Markdown table (images/s; best of the repeats, since a shared machine only ever slows
a run down).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from harness.data._machinery.base import LoaderOptions
from harness.data._machinery.file_loader import FileSplit, ImageTransform

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photos() -> list[np.ndarray]:
    """Real photographs available offline (scikit-learn's and matplotlib's sample images)."""
    import matplotlib
    import sklearn.datasets

    paths = [
        Path(sklearn.datasets.__file__).parent / "images" / "china.jpg",
        Path(sklearn.datasets.__file__).parent / "images" / "flower.jpg",
        Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg",
    ]
    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(np.asarray(im.convert("RGB").resize((800, 600))))
    return out


def write_jpegs(folder: Path, n: int, seed: int = 0) -> np.ndarray:
    """n random 500×375 crops (half of them mirrored to 375×500) saved at quality 90."""
    rng = np.random.default_rng(seed)
    sources = photos()
    files = []
    for i in range(n):
        src = sources[i % len(sources)]
        h, w = (375, 500) if i % 2 == 0 else (500, 375)
        h, w = min(h, src.shape[0]), min(w, src.shape[1])
        y, x = rng.integers(0, src.shape[0] - h + 1), rng.integers(0, src.shape[1] - w + 1)
        name = f"n{i % 10:08d}/img_{i:05d}.JPEG"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(src[y : y + h, x : x + w]).save(folder / name, quality=90)
        files.append(name.encode())
    return np.array(files, dtype=bytes)


def best_rate(fn, n: int, repeats: int) -> tuple[float, float]:
    """(images per wall-clock second, images per CPU-second of this process), best of repeats.

    The CPU-time rate is what one core delivers even when other jobs share the machine (wall
    time then includes waiting for a core); with worker processes it does not count the
    workers' CPU, so only the wall-clock rate is meaningful there."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return n / wall, n / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torchvision
    from torchvision.io import decode_jpeg, read_file

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = write_jpegs(root, args.images)
        paths = [str(root / f.decode()) for f in files]
        size_kb = np.mean([os.path.getsize(p) for p in paths]) / 1024
        train, evaluate = ImageTransform(), ImageTransform()
        n = len(paths)

        def pil_decode():
            for p in paths:
                with Image.open(p) as im:
                    im.convert("RGB")

        def tv_decode():
            for p in paths:
                decode_jpeg(read_file(p))

        split = FileSplit(root, files, torch.zeros(n, dtype=torch.int64))

        def loader(workers: int, train_mode: bool):
            opts = LoaderOptions(
                64,
                torch.device("cpu"),
                MEAN,
                STD,
                augment="imagenet",
                train=train_mode,
                shuffle=True,
                workers=workers,
            )
            ld = split.loader(opts)
            return lambda: [None for _ in ld]

        rows = [
            ("PIL decode only", best_rate(pil_decode, n, args.repeats)),
            ("torchvision.io.decode_jpeg (CPU) only", best_rate(tv_decode, n, args.repeats)),
            (
                "train transform (decode + RandomResizedCrop 224 + flip)",
                best_rate(lambda: [train(p, i) for i, p in enumerate(paths)], n, args.repeats),
            ),
            (
                "eval transform (decode + Resize 256 + CenterCrop 224)",
                best_rate(lambda: [evaluate(p, None) for p in paths], n, args.repeats),
            ),
            ("FileLoader train, 0 workers (B=64)", best_rate(loader(0, True), n, args.repeats)),
            (
                f"FileLoader train, {args.workers} workers (B=64)",
                best_rate(loader(args.workers, True), n, args.repeats),
            ),
        ]
    cpu = platform.processor() or platform.machine()
    print(
        f"{n} JPEGs of 500×375/375×500, mean {size_kb:.0f} kB; {os.cpu_count()} CPUs ({cpu}); "
        f"load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, Pillow {Image.__version__}\n"
    )
    print("| stage | images/s (wall) | images per CPU-second |\n|---|---:|---:|")
    for name, (rate, per_cpu) in rows:
        cpu_cell = "(workers not counted)" if "workers" in name and " 0 " not in name else ""
        print(f"| {name} | {rate:.0f} | {cpu_cell or f'{per_cpu:.0f}'} |")


if __name__ == "__main__":
    main()
