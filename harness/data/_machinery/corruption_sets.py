"""Which corruptions exist, which a dataset evaluates, and whether this machine can produce them.

The published protocol (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations", ICLR 2019) has 15 benchmark corruptions × 5 severities; the
CIFAR-10-C / CIFAR-100-C downloads also hold 4 extra corruptions (speckle_noise, gaussian_blur,
spatter, saturate), which the paper kept apart as a validation set. So:

- ``corruptions: [all]`` means a dataset's **benchmark set**, fixed by the dataset, never by what
  this machine can generate: for CIFAR-10/100 (published files) the 15 benchmark corruptions; for
  a dataset whose corrupted copies are generated here (the built-in ``digits``) the benchmark
  corruptions whose transform works at its image shape (8×8 grey digits: 10 — gaussian_noise,
  shot_noise, impulse_noise, zoom_blur, frost, fog, brightness, contrast, pixelate,
  jpeg_compression; the blurs, snow, glass and elastic need larger images, see ``_MIN_SIDE``).
- Extras enter only when named (``[all, spatter]``) and are reported apart: cAcc / cNLL / cECE are
  means over the benchmark corruptions evaluated (the record's ``corruption_mean_over`` says which).
- A name that is unknown, that does not apply to the dataset's images, or whose generator cannot
  run on this machine (a missing optional dependency) is a validation error
  (:func:`check_corruptions`), never a silently shorter list.

Generation uses torch-uncertainty's corruption transforms (``torch_uncertainty.transforms.
corruption``); some need the ``torch-uncertainty[image]`` extras (opencv for elastic_transform).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.data._machinery.sources import PublishedCorruptions

CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
EXTRA_CORRUPTIONS: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
ALL_CORRUPTIONS: tuple[str, ...] = CORRUPTIONS + EXTRA_CORRUPTIONS
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
ALL = "all"  # the suite keyword for a dataset's benchmark set


def published_sets() -> dict[str, PublishedCorruptions]:
    """Every published corruption set, by name, as the datasets declare them
    (``DatasetSpec.published_corruptions``): adding one is a field of its dataset's spec."""
    from harness.registry import DATASETS

    found = (spec.published_corruptions for _, spec in DATASETS.items())
    return {p.name: p for p in found if p is not None}


def published_set(name: str) -> PublishedCorruptions:
    """The published corruption set ``name`` (ValueError naming the known ones)."""
    sets = published_sets()
    if name not in sets:
        raise ValueError(f"unknown corruption set {name!r}; choose from {sorted(sets)}")
    return sets[name]


# Class names in torch_uncertainty.transforms.corruption. "spatter" has no port there: it exists
# only in the published files.
_TRANSFORMS = {
    "gaussian_noise": "GaussianNoise",
    "shot_noise": "ShotNoise",
    "impulse_noise": "ImpulseNoise",
    "defocus_blur": "DefocusBlur",
    "glass_blur": "GlassBlur",
    "motion_blur": "MotionBlur",
    "zoom_blur": "ZoomBlur",
    "snow": "Snow",
    "frost": "Frost",
    "fog": "Fog",
    "brightness": "Brightness",
    "contrast": "Contrast",
    "elastic_transform": "Elastic",
    "pixelate": "Pixelate",
    "jpeg_compression": "JPEGCompression",
    "speckle_noise": "SpeckleNoise",
    "gaussian_blur": "GaussianBlur",
    "saturate": "Saturation",
}

# Smallest image side each transform works on, found by running every transform at every
# severity on 1×8×8 digits and 3×32×32 images (torch-uncertainty 0.13):
# - defocus_blur: its disk kernel is 17×17 (21×21 at severity 5) and reflect padding needs the
#   side to exceed half the kernel: crashes below 11.
# - gaussian_blur: kernel 25×25 at severity 5: crashes below 13.
# - snow: motion-blurs its snow layer with a 25-pixel kernel at severity 5: crashes below 13.
# - motion_blur: kernel 31 at severity 5: crashes below 16.
# - glass_blur, elastic_transform: ImageNet-sized parameters. They run on 8×8 but destroy the
#   image (a logistic-regression digits classifier at 98 % clean falls to 33 % / 22 % at
#   severity 1, and elastic's severities 1–2 are far stronger than 3–5); they are sensible at
#   CIFAR's 32×32, where CIFAR-10-C uses them, and are left out below that.
# - pixelate: shrinks to 25 % of the side at severity 5 (8×8 → 2×2, already harsh).
_MIN_SIDE = {
    "defocus_blur": 11,
    "gaussian_blur": 13,
    "snow": 13,
    "motion_blur": 16,
    "glass_blur": 32,
    "elastic_transform": 32,
}
_ANY_MIN_SIDE = 4  # fog's plasma fractal and pixelate's 25 % shrink need a few pixels
# saturate is a no-op on grey images (identical output at every severity).
_COLOUR_ONLY = {"saturate"}
INSTALL_HINT = 'pip install "torch-uncertainty[image]"'


def check_corruption(corruption: str, severity: int) -> None:
    """Raise ValueError unless ``corruption`` is one of the 19 names and ``severity`` in 1..5."""
    if corruption not in ALL_CORRUPTIONS:
        raise ValueError(
            f"unknown corruption {corruption!r}; choose from {', '.join(ALL_CORRUPTIONS)}"
        )
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of 1..5, got {severity!r}")


# --------------------------------------------------------------------------------------------
# Which corruptions a shape admits, and which this machine can generate


def why_not_applicable(corruption: str, in_shape: tuple[int, int, int]) -> str | None:
    """Why a corruption cannot be generated for images of ``in_shape`` (None if it can)."""
    if len(in_shape) != 3:  # token ids (L,) and other non-image inputs
        return f"inputs of shape {tuple(in_shape)} are not images"
    c, h, w = in_shape
    side = min(h, w)
    if corruption not in _TRANSFORMS:
        return f"torch-uncertainty has no {corruption!r} transform (published files only)"
    if c not in (1, 3):
        return f"the transforms take 1- or 3-channel images, not {c}"
    if corruption in _COLOUR_ONLY and c != 3:
        return "a no-op on grey images"
    need = max(_MIN_SIDE.get(corruption, 0), _ANY_MIN_SIDE)
    if side < need:
        return f"needs images of at least {need}×{need}, got {h}×{w}"
    return None


def build_transform(corruption: str, severity: int, seed: int):
    """torch-uncertainty's transform of one corruption at one severity (ImportError if an
    optional dependency is missing)."""
    from torch_uncertainty.transforms import corruption as tu

    cls = getattr(tu, _TRANSFORMS[corruption])
    if "seed" in inspect.signature(cls.__init__).parameters:
        transform = cls(severity, seed=seed)
    else:
        transform = cls(severity)
    if corruption == "frost":
        # Frost decodes one of its five large JPEG photos on every call; decode them once (the
        # same tensors, indexed as before).
        frost_ds = transform.frost_ds
        transform.frost_ds = [frost_ds[i] for i in range(len(frost_ds))]
    return transform


def _try_build(corruption: str) -> str | None:
    try:
        build_transform(corruption, 1, seed=0)
    except ImportError as err:
        return f"{corruption} needs torch-uncertainty's image extras ({err}): {INSTALL_HINT}"
    return None


#: The modules deciding which transforms build here: those torch-uncertainty 0.13's corruption
#: module (and its Frost images) look for with ``find_spec``, and this one (the name table).
_OPTIONAL_MODULES = ("cv2", "scipy", "kornia", "torch_uncertainty_assets", "PIL", __name__)


def requirement_inputs() -> list[object]:
    """What :func:`missing_requirement`'s answers depend on, found without importing
    torch-uncertainty: its version, Python's, and where each optional module is installed."""
    import importlib.metadata
    import sys

    from harness.registry.core import module_file_state

    tu = [d.version for d in importlib.metadata.distributions(name="torch-uncertainty")]
    return [tu, sys.version, *(module_file_state(m) for m in _OPTIONAL_MODULES)]


@cache
def missing_requirement(corruption: str) -> str | None:
    """None when the transform can be built here, else what to install.

    Building the transforms imports torch-uncertainty (lightning, torchmetrics: seconds, most
    of ``harness validate``), so every transform's answer is kept in the user cache
    (``corruption-requirements/``), keyed by :func:`requirement_inputs`.
    """
    from harness.storage.user_cache import cached_json

    answers = cached_json(
        "corruption-requirements",
        requirement_inputs(),
        lambda: {name: _try_build(name) for name in _TRANSFORMS},
    )
    return answers[corruption] if corruption in answers else _try_build(corruption)


def applicable_corruptions(
    in_shape: tuple[int, int, int], installed_only: bool = True
) -> list[str]:
    """Corruptions that can be generated for images of ``in_shape`` (C, H, W).

    With 8×8 grey digits: gaussian_noise, shot_noise, impulse_noise, zoom_blur, frost, fog,
    brightness, contrast, pixelate, jpeg_compression, speckle_noise; with 3×32×32 every corruption
    but spatter. ``installed_only`` also drops those whose optional dependencies are missing here.
    This is what *can be generated*; what a suite's ``all`` means is :func:`corruption_set`.
    """
    return [
        name
        for name in ALL_CORRUPTIONS
        if why_not_applicable(name, in_shape) is None
        and (not installed_only or missing_requirement(name) is None)
    ]


# --------------------------------------------------------------------------------------------
# A dataset's corruption set


@dataclass(frozen=True)
class CorruptionSet:
    """The corruptions a dataset is evaluated on.

    Attributes:
        benchmark: What ``all`` means; the only corruptions that enter cAcc / cNLL / cECE.
        extras: Corruptions evaluated only when named, reported apart from the means.
        source: Published folder name ("cifar10-c") or None when copies are generated here.
        in_shape: (C, H, W) of the dataset's images.
    """

    benchmark: tuple[str, ...]
    extras: tuple[str, ...]
    source: str | None
    in_shape: tuple[int, int, int]

    @property
    def choices(self) -> tuple[str, ...]:
        return (ALL, *self.benchmark, *self.extras)


def corruption_set(dataset: str) -> CorruptionSet:
    """The fixed corruption set of a registered dataset (never depends on installed packages).

    Published sets (CIFAR-10-C / CIFAR-100-C): the 15 benchmark corruptions, the 4 extras.
    Generated sets: the benchmark and extra corruptions whose transform works at the dataset's
    image shape (:func:`why_not_applicable`).
    """
    from harness.registry import DATASETS

    spec = DATASETS.get(dataset)
    if spec.corruption_source:
        return CorruptionSet(CORRUPTIONS, EXTRA_CORRUPTIONS, spec.corruption_source, spec.in_shape)

    def fits(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in names if why_not_applicable(n, spec.in_shape) is None)

    return CorruptionSet(fits(CORRUPTIONS), fits(EXTRA_CORRUPTIONS), None, spec.in_shape)


def resolve_corruptions(dataset: str, names: tuple[str, ...] | list[str]) -> list[str]:
    """Expand ``all`` to the dataset's benchmark set and keep named ones, in the suite's order
    (each once).

    Raises:
        ValueError: A name not in the dataset's set, listing the valid choices.
    """
    cset = corruption_set(dataset)
    out: list[str] = []
    for name in names:
        if name == ALL:
            out.extend(cset.benchmark)
        elif name in cset.benchmark or name in cset.extras:
            out.append(name)
        else:
            raise ValueError(_unknown(dataset, name, cset))
    return list(dict.fromkeys(out))


def _unknown(dataset: str, name: object, cset: CorruptionSet) -> str:
    if isinstance(name, str) and name in ALL_CORRUPTIONS and cset.source is None:
        reason = why_not_applicable(name, cset.in_shape)
        return (
            f"corruption {name!r} cannot be produced for {dataset!r}: {reason}; "
            f"choose from {', '.join(cset.choices)}"
        )
    return (
        f"unknown corruption {name!r} for dataset {dataset!r}; "
        f"choose from {', '.join(cset.choices)}"
    )


def check_corruptions(
    dataset: str, names: tuple[str, ...] | list[str], data_root: Path | None = None
) -> list[str]:
    """Every reason the requested corruptions cannot be evaluated on ``dataset`` here.

    Checks that each name is ``all`` or in the dataset's set (unknown names and names that do not
    apply to its images are listed with the valid choices); for generated sets, that this machine
    can build each transform; for published sets, when ``data_root`` is given, that each file
    exists (with the command that fetches it).

    Returns:
        One message per problem (empty when everything can be produced).
    """
    if not names:
        return []
    if len(corruption_set(dataset).in_shape) != 3:  # token ids: `all` would resolve to nothing
        return [f"dataset {dataset!r} has no corruptions (its inputs are not images); set []"]
    try:
        used = resolve_corruptions(dataset, names)
    except ValueError:  # list every bad name, not only the first
        cset = corruption_set(dataset)
        return [_unknown(dataset, n, cset) for n in names if n != ALL and n not in cset.choices]
    cset = corruption_set(dataset)
    problems = []
    if cset.source is None:
        for name in used:
            missing = missing_requirement(name)
            if missing:
                problems.append(
                    f"corruption {name!r} cannot be generated on this machine for "
                    f"{dataset!r}: {missing}"
                )
    elif data_root is not None and published_set(cset.source).read:  # a folder per corruption
        folder = Path(data_root) / published_set(cset.source).folder
        for name in used:
            if not (folder / name).is_dir():
                problems.append(
                    f"corruption {name!r} of {dataset!r} cannot be read: {folder / name} is "
                    f"missing. `harness data download {cset.source}` prints where to get it"
                )
    elif data_root is not None:
        folder = Path(data_root) / published_set(cset.source).folder
        for file in ("labels", *used):
            if not (folder / f"{file}.npy").is_file():
                problems.append(
                    f"corruption {file!r} of {dataset!r} cannot be read: {folder / file}.npy "
                    f"is missing. Fetch it with `harness data download {cset.source}`"
                )
    return problems


def mean_over(dataset: str, used: list[str], severities: tuple[int, ...]) -> str:
    """One line saying what cAcc / cNLL / cECE average, for records and leaderboards."""
    cset = corruption_set(dataset)
    bench = [c for c in used if c in cset.benchmark]
    where = published_set(cset.source).folder if cset.source else f"{dataset} (generated here)"
    what = (
        f"all {len(cset.benchmark)} benchmark corruptions of {where}"
        if bench == list(cset.benchmark)
        else f"{len(bench)} of the {len(cset.benchmark)} benchmark corruptions of {where} "
        f"({', '.join(bench)})"
    )
    extras = [c for c in used if c not in cset.benchmark]
    tail = f"; extras reported apart: {', '.join(extras)}" if extras else ""
    return f"{what} × severities {', '.join(map(str, severities))}{tail}"


def corruption_listing() -> list[tuple[str, str]]:
    """``(name, description)`` of every corruption set an in-distribution dataset evaluates on,
    for ``harness ls``: the published CIFAR-10-C / CIFAR-100-C (their folder and download
    command) and each dataset whose corrupted copies are generated here (listed by its name)."""
    from harness.registry import DATASETS

    users: dict[str, list[str]] = {}
    for name, spec in DATASETS.items():
        if spec.num_classes and len(spec.in_shape) == 3:  # OOD-only and text sets never are
            users.setdefault(corruption_set(name).source or name, []).append(name)
    out = []
    for key, names in sorted(users.items()):
        cset = corruption_set(names[0])
        counts = (
            f"{len(cset.benchmark)} benchmark + {len(cset.extras)} extra corruptions "
            f"× {len(SEVERITIES)} severities"
        )
        if cset.source:
            folder = published_set(cset.source).folder
            where = f"published files in {folder}/ for {', '.join(names)}"
            out.append((key, f"{counts}, {where}; `harness data download {cset.source}`"))
        else:
            out.append((key, f"{counts}, generated here (torch-uncertainty transforms)"))
    return out
