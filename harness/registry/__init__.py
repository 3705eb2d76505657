"""The three registries of the harness. Each finds its plugins by scanning a package: a new
method is one new module in ``methods/``, a new dataset one in ``harness/data/``, a new backbone
one module in ``harness/backbones/`` — no list to edit. Extra packages: ``Registry.add_package``
or the environment variables ``HARNESS_METHOD_PACKAGES``, ``HARNESS_BACKBONE_PACKAGES``,
``HARNESS_DATASET_PACKAGES`` (comma-separated importable package names). Installed plugins:
entry points in the groups ``harness.methods``, ``harness.backbones``, ``harness.datasets``;
single modules: ``--plugin MODULE`` (``$HARNESS_PLUGINS``). See :mod:`harness.registry.core`.
"""

from __future__ import annotations

from typing import Any

from harness.contract.config import hparam_defaults
from harness.registry.core import Registry

# The entries' types (methods._base.MethodSpec, harness.backbones.BackboneSpec,
# harness.data._machinery.base.DatasetSpec) live in the layers that register them, above this
# one: naming them here, even under TYPE_CHECKING, would be an import cycle
# (tests/test_import_graph.py).
METHODS: Registry[Any] = Registry(
    "method", packages=("methods",), env="HARNESS_METHOD_PACKAGES", group="harness.methods"
)
BACKBONES: Registry[Any] = Registry(
    "backbone",
    packages=("harness.backbones",),
    env="HARNESS_BACKBONE_PACKAGES",
    group="harness.backbones",
)
DATASETS: Registry[Any] = Registry(
    "dataset", packages=("harness.data",), env="HARNESS_DATASET_PACKAGES", group="harness.datasets"
)


def method_defaults(method: str) -> dict[str, Any]:
    """Every hyper-parameter of a registered method at its default value (JSON form).

    Raises:
        UnknownNameError: ``method`` is not registered.
    """
    return hparam_defaults(METHODS.get(method).hparams)
