"""The three registries of the harness and the modules that fill them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.registry import Registry

if TYPE_CHECKING:
    from harness.backbones import BackboneSpec
    from harness.data.base import DatasetSpec
    from methods.base import MethodSpec

METHODS: Registry[MethodSpec] = Registry(
    "method",
    modules=(
        "methods.single",
        "methods.deep_ensemble",
        "methods.sigma_ens",
        "methods.film_ensemble",
        "methods.batch_ensemble",
        "methods.packed_ensemble",
        "methods.mc_dropout",
        "methods.mimo",
        "methods.masksembles",
    ),
)
BACKBONES: Registry[BackboneSpec] = Registry("backbone", modules=("harness.backbones",))
DATASETS: Registry[DatasetSpec] = Registry(
    "dataset", modules=("harness.data.digits", "harness.data.torchvision_sets")
)
