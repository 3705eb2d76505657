"""The registries of the harness: seven, each a :class:`harness.registry.core.Registry`.

Here, in the one layer every other may import: the three whose entries a suite names —
``METHODS`` (a new method is one module in ``methods/``), ``BACKBONES`` (one module in
``harness/backbones/``), ``DATASETS`` (one module in ``harness/data/``), each found by scanning
its package, no list to edit — and the metric columns, ``METRICS`` (``register_metric``; the
built-ins registered by :mod:`harness.registry.metric_columns`). The other three live with the
layer that uses them: the executors (``harness.executors.EXECUTORS``, ``register_executor``),
the experiment trackers (``harness.storage.loggers.TRACKERS``, ``register_tracker``) and the
report's figures (``reports.figures.base.FIGURES``, ``register_figure``). A plugin imports
every ``register_*`` function and the types it builds from :mod:`harness.plugins`.

Extra packages scanned like the built-in ones: ``Registry.add_package`` or the variables
``HARNESS_METHOD_PACKAGES``, ``HARNESS_BACKBONE_PACKAGES``, ``HARNESS_DATASET_PACKAGES``
(comma-separated importable package names). Installed plugins: entry points in the groups
``harness.methods``, ``harness.backbones``, ``harness.datasets``, ``harness.metrics``,
``harness.executors``, ``harness.trackers``, ``harness.figures``; single modules: ``--plugin
MODULE`` (``$HARNESS_PLUGINS``). See :mod:`harness.registry.core`.

Also here: :func:`resolved`, a cell with what its method's registration gives it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.contract.config import Cell, hparam_defaults
from harness.contract.metric_spec import MetricSpec
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

#: Metric columns: the built-in ones (``harness.registry.metric_columns``) and plugins', which
#: register the same way (``register_metric``, ``--plugin``, entry points ``harness.metrics``).
#: Here, in the one layer both the engine (which computes a plugin's metric) and the reporter
#: (which shows every one) may import.
METRICS: Registry[MetricSpec] = Registry(
    "metric", group="harness.metrics", modules=("harness.registry.metric_columns",)
)


def register_metric(spec: MetricSpec) -> MetricSpec:
    """Add a metric column (what a plugin module calls at import). Raises
    ``DuplicateNameError`` for a key already registered."""
    METRICS.load_modules()  # the built-ins first among the columns, whichever is imported first
    METRICS.register(spec.key, spec)
    return spec


def computed_metrics() -> list[MetricSpec]:
    """The registered metrics the engine computes itself on the clean test set (those with a
    ``compute``: plugins'), in registration order."""
    return [spec for _, spec in METRICS.registered() if spec.compute is not None]


def method_defaults(method: str) -> dict[str, Any]:
    """Every hyper-parameter of a registered method at its default value (JSON form).

    Raises:
        UnknownNameError: ``method`` is not registered.
    """
    return hparam_defaults(METHODS.get(method).hparams)


def resolved(cell: Cell) -> Cell:
    """``cell`` with what its method's registration gives it: the hyper-parameter defaults
    (which fix its label) and its typed hyper-parameters. A cell of a suite's expansion has
    both and is returned as it is; a cell rebuilt from JSON (a worker, a rank, a Slurm task,
    a ``cell.json`` read back) gets them here, once per process.

    Raises:
        UnknownNameError: ``cell.method`` is not registered.
    """
    if cell.defaults and cell.typed_hparams is not None:
        return cell
    spec = METHODS.get(cell.method)
    return dataclasses.replace(
        cell,
        defaults=cell.defaults or hparam_defaults(spec.hparams),
        typed_hparams=(
            cell.typed_hparams
            if cell.typed_hparams is not None
            else spec.make_hparams(cell.hparams)
        ),
    )
