"""OOD partners of the 28×28 grey benchmarks (Fashion-MNIST), real and offline, plus KMNIST.

Each offline set stands in for a published OOD partner that needs a download:

- ``digits_28`` (near, for MNIST — Fashion-MNIST vs MNIST is DUQ's pair, van Amersfoort et al.
  2020): scikit-learn's 1,797 real handwritten digits 0–9. Each 8×8 image (bright strokes on
  black, the glyph filling the frame) is resized to 20×20 (bilinear, antialiased) and padded
  with 4 black pixels per side: MNIST's framing (a 20×20 box in a 28×28 image). It differs from
  MNIST in being blurrier (the 8×8 source) and in having 1,797 rather than 10,000 images.
- ``letters_28`` (near-far, for notMNIST, Bulatov 2011: letters A–J in many fonts): the
  letters A–J rendered from :data:`FONTS` (12 DejaVu faces: Sans, Sans Mono and Serif, each
  regular, bold, oblique/italic, bold oblique/italic), each at :data:`LETTER_SCALES` ×
  :data:`LETTER_ANGLES`, white on black, fitted into the same 20×20 box: 1,080 images.
  notMNIST has far more typefaces (thousands, many decorative) and glyphs that fill the frame.
  Fonts: Debian's ``fonts-dejavu-core`` (``/usr/share/fonts/truetype/dejavu``, or
  ``$HARNESS_FONT_DIR``), else the copy of the same faces matplotlib ships.
- ``photos_28`` (far, for natural-image sets shown in grey at 28×28, such as CIFAR-10 converted
  to grey): 2,000 patches of the two photographs scikit-learn ships (``china.jpg``,
  ``flower.jpg``), grey (ITU-R 601 luma), each patch a 56×56 region area-averaged to 28×28,
  contrast-stretched to 0..255, nearly flat patches dropped (as ``sklearn_photos`` does at 8×8).
  Two photographs are much less varied than a natural-image dataset.
- ``kmnist`` (Kuzushiji-MNIST, Clanuwat et al. 2018, test split, 10,000 images): for users with
  internet, ``harness data download kmnist`` (torchvision's ``KMNIST``, ``<root>/KMNIST/raw``).
  MNIST itself is ``mnist`` (:mod:`harness.data.torchvision_sets`).

Every offline set is deterministic (fixed seeds, fixed font list) and built in memory in about a
second; labels are the digit / letter index (photos: -1).
"""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from harness.contract.env import FONT_DIR as FONT_DIR_VARIABLE
from harness.data._machinery.base import DatasetSpec, ImageSet, damaged_data_file, register_dataset
from harness.data._machinery.sources import Torchvision

SEED = 0
BOX, SIDE = 20, 28  # MNIST's framing: the glyph fitted in a 20×20 box, centred in 28×28
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_DIR_ENV = FONT_DIR_VARIABLE.name
FONT_PACKAGE = "fonts-dejavu-core"
#: Faces present both in Debian's fonts-dejavu-core and in matplotlib's bundled copy.
FONTS = tuple(
    f"DejaVu{family}{style}.ttf"
    for family, styles in (
        ("Sans", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("SansMono", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("Serif", ("", "-Bold", "-Italic", "-BoldItalic")),
    )
    for style in styles
)
LETTERS = "ABCDEFGHIJ"  # notMNIST's ten classes
LETTER_SCALES = (0.7, 0.85, 1.0)  # of the 20-pixel box
LETTER_ANGLES = (-12.0, 0.0, 12.0)  # degrees
PHOTO_PATCHES = 2_000
PHOTO_MIN_STD = 20.0  # grey levels: flatter patches are trivially OOD and are dropped
# Each set's own statistics on the [0, 1] scale (for completeness: the harness normalises an
# OOD set with the in-distribution set's; tests/harness/data/test_ood_28.py recomputes them).
DIGITS_28_MEAN, DIGITS_28_STD = (0.1557,), (0.2773,)
LETTERS_28_MEAN, LETTERS_28_STD = (0.1153,), (0.2859,)
PHOTOS_28_MEAN, PHOTOS_28_STD = (0.4733,), (0.3080,)
# KMNIST's own statistics were not measured (no copy here); never read, as said above.
KMNIST_MEAN, KMNIST_STD = (0.5,), (0.5,)


def _frame(images: torch.Tensor) -> torch.Tensor:
    """float (N, 1, h, w) on 0..255 → uint8 (N, 1, 28, 28): resized to the 20×20 box, padded."""
    x = F.interpolate(images, size=(BOX, BOX), mode="bilinear", antialias=True, align_corners=False)
    pad = (SIDE - BOX) // 2
    x = F.pad(x, (pad, pad, pad, pad))
    return x.round().clamp(0, 255).to(torch.uint8)


def _sklearn_data(root: Path | None = None) -> Path:
    import sklearn

    return Path(sklearn.__file__).parent / "datasets" / "data"


@cache
def load_digits_28(root: Path | None = None) -> dict[str, ImageSet]:
    """scikit-learn's 1,797 digits (0–9) in MNIST's 28×28 framing, labels the digits."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(bunch.images * (255.0 / 16.0)).float().unsqueeze(1)  # (1797, 1, 8, 8)
    return {"test": ImageSet(_frame(x), torch.from_numpy(bunch.target).long())}


def font_dir() -> Path:
    """Where the DejaVu faces are read: ``$HARNESS_FONT_DIR``, Debian's folder when it has them
    all, else matplotlib's bundled copy."""
    if (folder := FONT_DIR_VARIABLE.read(None)) is not None:
        return folder
    if all((FONT_DIR / f).is_file() for f in FONTS):
        return FONT_DIR
    try:
        import matplotlib
    except ImportError:
        return FONT_DIR
    return Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"


def _fonts_available(root: Path | None = None) -> bool:
    return all((font_dir() / f).is_file() for f in FONTS)


def _glyph(font, letter: str, angle: float) -> np.ndarray:
    """One letter, white on black, rotated, cropped to its ink: float (h, w) on 0..255."""
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (160, 160), 0)
    ImageDraw.Draw(canvas).text((80, 80), letter, fill=255, font=font, anchor="mm")
    canvas = canvas.rotate(angle, resample=Image.BILINEAR)
    box = canvas.getbbox()
    return np.asarray(canvas.crop(box), dtype=np.float32)


def _fit(glyph: np.ndarray, scale: float) -> torch.Tensor:
    """A cropped glyph scaled (aspect kept) so its longer side is ``scale``·20 pixels, centred in
    28×28: float (28, 28)."""
    h, w = glyph.shape
    long_side = max(1, round(BOX * scale))
    th, tw = max(1, round(h * long_side / max(h, w))), max(1, round(w * long_side / max(h, w)))
    x = torch.from_numpy(glyph)[None, None]
    x = F.interpolate(x, size=(th, tw), mode="bilinear", antialias=True, align_corners=False)
    out = torch.zeros(SIDE, SIDE)
    top, left = (SIDE - th) // 2, (SIDE - tw) // 2
    out[top : top + th, left : left + tw] = x[0, 0]
    return out


@lru_cache(maxsize=1)
def _load_letters_cached(folder: str) -> dict[str, ImageSet]:
    from PIL import ImageFont

    images, labels = [], []
    paths = [Path(folder) / f for f in FONTS]
    for path in paths:
        try:
            font = ImageFont.truetype(str(path), 120)
        except OSError as exc:  # a damaged or non-font file
            fix = f"apt-get install --reinstall {FONT_PACKAGE}"
            raise damaged_data_file([path], exc, fix) from None
        for k, letter in enumerate(LETTERS):
            for angle in LETTER_ANGLES:
                glyph = _glyph(font, letter, angle)
                for scale in LETTER_SCALES:
                    images.append(_fit(glyph, scale))
                    labels.append(k)
    x = torch.stack(images).unsqueeze(1).round().clamp(0, 255).to(torch.uint8)
    return {"test": ImageSet(x, torch.tensor(labels, dtype=torch.int64))}


def load_letters_28(root: Path | None = None) -> dict[str, ImageSet]:
    """Letters A–J in 12 DejaVu faces × 3 angles × 3 sizes (1,080 images), labels 0–9 = A–J."""
    return _load_letters_cached(str(font_dir().resolve()))


@cache
def load_photos_28(root: Path | None = None) -> dict[str, ImageSet]:
    """2,000 grey 28×28 patches of scikit-learn's two sample photographs (labels -1)."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(SEED)
    luma = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    patches = []
    photos = load_sample_images().images  # two uint8 (427, 640, 3)
    per_photo = PHOTO_PATCHES // len(photos)
    for img in photos:
        grey = (torch.from_numpy(np.array(img)).permute(2, 0, 1).float() * luma).sum(0)
        small = F.avg_pool2d(grey[None, None], 2)[0, 0]  # one 28×28 patch covers 56×56 pixels
        h, w = small.shape
        taken = 0
        while taken < per_photo:
            y, x = int(rng.integers(0, h - SIDE)), int(rng.integers(0, w - SIDE))
            p = small[y : y + SIDE, x : x + SIDE]
            if p.std() > PHOTO_MIN_STD:
                patches.append(p)
                taken += 1
    pt = torch.stack(patches)  # (N, 28, 28)
    lo, hi = pt.amin((1, 2), keepdim=True), pt.amax((1, 2), keepdim=True)
    pt = (pt - lo) / (hi - lo).clamp_min(1) * 255
    images = pt.round().to(torch.uint8).unsqueeze(1)
    return {"test": ImageSet(images, torch.full((len(images),), -1, dtype=torch.int64))}


_KMNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@lru_cache(maxsize=1)
def _load_kmnist_cached(root: str) -> dict[str, ImageSet]:
    from torchvision.datasets import KMNIST

    try:
        ds = KMNIST(root, train=False, download=False)  # data: uint8 (N, 28, 28)
    except (ValueError, RuntimeError, IndexError) as exc:  # a short idx file fails in reshape
        raise damaged_data_file(
            [Path(root) / "KMNIST" / "raw"], exc, "harness data download kmnist"
        ) from None
    return {"test": ImageSet(ds.data.unsqueeze(1).contiguous(), ds.targets.long())}


def load_kmnist(root: Path) -> dict[str, ImageSet]:
    """KMNIST test split (10,000 images, 1×28×28) from the raw idx files."""
    return _load_kmnist_cached(str(Path(root).expanduser().resolve()))


def _offline(name: str, load, mean, std, location, what: str, **kw) -> DatasetSpec:
    return DatasetSpec(
        name=name,
        in_shape=(1, SIDE, SIDE),
        num_classes=None,
        mean=mean,
        std=std,
        load=load,
        location=location,
        description=f"OOD for 28×28 grey sets (offline): {what}",
        **kw,
    )


register_dataset(
    _offline(
        "digits_28",
        load_digits_28,
        DIGITS_28_MEAN,
        DIGITS_28_STD,
        _sklearn_data,
        "scikit-learn's 1,797 real digits in MNIST's framing (an MNIST stand-in)",
    )
)
register_dataset(
    _offline(
        "letters_28",
        load_letters_28,
        LETTERS_28_MEAN,
        LETTERS_28_STD,
        lambda root: font_dir(),
        f"letters A–J rendered from 12 DejaVu faces, {len(FONTS) * 90:,} images (a notMNIST "
        "stand-in)",
        fetch=f"apt-get install {FONT_PACKAGE}",
        is_available=_fonts_available,
    )
)
register_dataset(
    _offline(
        "photos_28",
        load_photos_28,
        PHOTOS_28_MEAN,
        PHOTOS_28_STD,
        _sklearn_data,
        f"{PHOTO_PATCHES:,} grey 28×28 patches of scikit-learn's two sample photographs",
    )
)
register_dataset(
    DatasetSpec(
        name="kmnist",
        in_shape=(1, SIDE, SIDE),
        num_classes=None,
        mean=KMNIST_MEAN,
        std=KMNIST_STD,
        load=load_kmnist,
        location=lambda root: Path(root) / "KMNIST" / "raw",
        fetch="harness data download kmnist",
        download=Torchvision("KMNIST", ({"train": True}, {"train": False})),  # <root>/KMNIST/raw
        description="OOD: Kuzushiji-MNIST test split (torchvision, KMNIST/raw idx files), 10,000",
        is_available=lambda root: all(
            (Path(root) / "KMNIST" / "raw" / n).is_file() for n in _KMNIST_FILES
        ),
    )
)
