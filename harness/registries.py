"""The three registries of the harness. Each finds its plugins by scanning a package: a new
method is one new module in ``methods/``, a new dataset one in ``harness/data/``, a new backbone
one ``harness/backbones*.py`` module — no list to edit. Extra packages: ``Registry.add_package``
or the environment variables ``HARNESS_METHOD_PACKAGES``, ``HARNESS_BACKBONE_PACKAGES``,
``HARNESS_DATASET_PACKAGES`` (comma-separated importable package names). Installed plugins:
entry points in the groups ``harness.methods``, ``harness.backbones``, ``harness.datasets``;
single modules: ``--plugin MODULE`` (``$HARNESS_PLUGINS``). See :mod:`harness.registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.contract.config import hparam_defaults
from harness.registry import Registry

if TYPE_CHECKING:
    from harness.backbones import BackboneSpec
    from harness.data.base import DatasetSpec
    from methods.base import MethodSpec

METHODS: Registry[MethodSpec] = Registry(
    "method", packages=("methods",), env="HARNESS_METHOD_PACKAGES", group="harness.methods"
)
BACKBONES: Registry[BackboneSpec] = Registry(
    "backbone",
    packages=("harness",),
    prefix="backbones",
    env="HARNESS_BACKBONE_PACKAGES",
    group="harness.backbones",
)
DATASETS: Registry[DatasetSpec] = Registry(
    "dataset", packages=("harness.data",), env="HARNESS_DATASET_PACKAGES", group="harness.datasets"
)


def method_defaults(method: str) -> dict[str, Any]:
    """Every hyper-parameter of a registered method at its default value (JSON form).

    Raises:
        UnknownNameError: ``method`` is not registered.
    """
    return hparam_defaults(METHODS.get(method).hparams)
