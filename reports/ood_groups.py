"""Which OOD sets are near- and which far-OOD for each in-distribution dataset.

OpenOOD v1.5 (Zhang et al., "OpenOOD v1.5: Enhanced Benchmark for Out-of-Distribution Detection",
2023, Table 1) splits each benchmark's OOD sets into *near* (semantic shift, similar images) and
*far* (different image statistics) and reports the mean over each group. This is the one place the
reporter reads that split from; it needs no torch and no dataset registry. For CIFAR-10/100 it is
OpenOOD's split; for the built-in ``digits`` the held-out digits 8 and 9 are near and scikit-learn's
photo patches far (as their dataset descriptions say).

A record may override it: ``evaluation.ood_groups`` = ``{"<ood set>": "near" | "far"}`` (a suite
that brings its own OOD sets names their kind there). A set that is in neither group counts in its
own per-set columns only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["near", "far"]

_CIFAR_FAR = ("mnist", "svhn", "textures", "places365")
_FASHION: dict[str, Kind] = {
    **dict.fromkeys(("mnist", "kmnist", "digits_28", "letters_28"), "near"),
    "photos_28": "far",
}
OOD_GROUPS: dict[str, dict[str, Kind]] = {
    "cifar10": {
        **dict.fromkeys(("cifar100", "tinyimagenet"), "near"),
        **dict.fromkeys(_CIFAR_FAR, "far"),
    },
    "cifar100": {
        **dict.fromkeys(("cifar10", "tinyimagenet"), "near"),
        **dict.fromkeys(_CIFAR_FAR, "far"),
    },
    "digits": {"digits_heldout": "near", "sklearn_photos": "far"},
    # As OpenOOD v1.5's MNIST benchmark (near: notMNIST, Fashion-MNIST): the other 28×28 glyph
    # sets are near, natural-image patches far (harness/data/ood_28.py says what each stands for).
    **dict.fromkeys(("fashion_mnist", "fashion_mnist_10k"), _FASHION),
}

CONVENTION = (
    "near-/far-OOD: the mean over the near (semantic shift) or far OOD sets evaluated, OpenOOD "
    "v1.5's split — CIFAR-10: near CIFAR-100, TinyImageNet; far MNIST, SVHN, Textures, "
    "Places365 (CIFAR-100: near CIFAR-10, TinyImageNet); digits: near the held-out digits 8/9, "
    "far scikit-learn photo patches; Fashion-MNIST: near MNIST, KMNIST, digits_28, letters_28, far "
    "photos_28; a record's evaluation.ood_groups overrides it. A mean over "
    "fewer sets than the split names is still shown (the per-set columns say which were run)."
)


def ood_kind(dataset: str, ood_set: str, record: Mapping[str, Any] | None = None) -> Kind | None:
    """``"near"``, ``"far"`` or None (in neither group) for ``ood_set`` next to ``dataset``."""
    override = ((record or {}).get("evaluation") or {}).get("ood_groups")
    if isinstance(override, Mapping) and override.get(ood_set) in ("near", "far"):
        return override[ood_set]
    return OOD_GROUPS.get(dataset, {}).get(ood_set)
