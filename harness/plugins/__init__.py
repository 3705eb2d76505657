"""The extension face: what a plugin imports, and nothing private.

A plugin is one module that registers at import (named with ``--plugin MODULE``, listed in
``$HARNESS_PLUGINS``, or an installed distribution's entry point; docs/architecture.md,
"Adding things", has a one-file example of each kind). Everything it registers with, and every
type it builds, is here::

    from harness.plugins import MethodSpec, EnsembleModel, BuildContext, register_method

=========  ==============================================================================
kind       names
=========  ==============================================================================
method     ``register_method``, ``MethodSpec``, ``EnsembleModel``, ``BuildContext``,
           ``TrainOutput``, ``BatchFeeding``, ``NoHparams``, ``to_members``,
           ``repeat_members``, ``pretrained_field``, ``pretrain_epochs_field``,
           ``count_parameters``, ``Diagnostic``, ``DiagnosticFigure``
backbone   ``register_backbone``, ``BackboneSpec``
dataset    ``register_dataset``, ``DatasetSpec``, ``ImageSet``, ``LazySplit``,
           ``LoaderOptions``, ``DataMissingError``, ``default_data_root``, and its download:
           ``Archive``, ``Archives``, ``Torchvision``, ``Instructions``,
           ``PublishedCorruptions``
executor   ``register_executor``, ``Executor``, ``ExecutorOptions``, ``RunOutcome``,
           ``run_one``
tracker    ``register_tracker``, ``TrackerRun``
figure     ``register_figure``, ``FigureSpec``
metric     ``register_metric``, ``MetricSpec``
=========  ==============================================================================

Each name is the object its layer defines (re-exported, not copied: ``harness.plugins.MethodSpec
is methods._base.MethodSpec``), resolved on first use (PEP 562), so a figure or metric plugin
imports no torch and an executor plugin no method.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.backbones import BackboneSpec, register_backbone
    from harness.contract import Diagnostic, DiagnosticFigure
    from harness.contract.metric_spec import MetricSpec
    from harness.data._machinery.base import (
        DataMissingError,
        DatasetSpec,
        ImageSet,
        LazySplit,
        LoaderOptions,
        default_data_root,
        register_dataset,
    )
    from harness.data._machinery.sources import (
        Archive,
        Archives,
        Instructions,
        PublishedCorruptions,
        Torchvision,
    )
    from harness.executors import register_executor
    from harness.executors.base import Executor, ExecutorOptions, RunOutcome
    from harness.executors.ranks import run_one
    from harness.registry import register_metric
    from harness.storage.loggers import register_tracker
    from harness.storage.tracked import TrackerRun
    from methods._base import (
        BatchFeeding,
        BuildContext,
        EnsembleModel,
        MethodSpec,
        NoHparams,
        TrainOutput,
        count_parameters,
        pretrain_epochs_field,
        pretrained_field,
        register_method,
        repeat_members,
        to_members,
    )
    from reports.figures.base import FigureSpec, register_figure

#: Name → ``"module:attribute"`` where its layer defines it (read by the import-graph test).
_WHERE = {
    # a method
    "register_method": "methods._base:register_method",
    "MethodSpec": "methods._base:MethodSpec",
    "EnsembleModel": "methods._base:EnsembleModel",
    "BuildContext": "methods._base:BuildContext",
    "TrainOutput": "methods._base:TrainOutput",
    "BatchFeeding": "methods._base:BatchFeeding",
    "NoHparams": "methods._base:NoHparams",
    "to_members": "methods._base:to_members",
    "repeat_members": "methods._base:repeat_members",
    "pretrained_field": "methods._base:pretrained_field",
    "pretrain_epochs_field": "methods._base:pretrain_epochs_field",
    "count_parameters": "methods._base:count_parameters",
    "Diagnostic": "harness.contract:Diagnostic",
    "DiagnosticFigure": "harness.contract:DiagnosticFigure",
    # a backbone
    "register_backbone": "harness.backbones:register_backbone",
    "BackboneSpec": "harness.backbones:BackboneSpec",
    # a dataset
    "register_dataset": "harness.data._machinery.base:register_dataset",
    "DatasetSpec": "harness.data._machinery.base:DatasetSpec",
    "ImageSet": "harness.data._machinery.base:ImageSet",
    "LazySplit": "harness.data._machinery.base:LazySplit",
    "LoaderOptions": "harness.data._machinery.base:LoaderOptions",
    "DataMissingError": "harness.data._machinery.base:DataMissingError",
    "default_data_root": "harness.data._machinery.base:default_data_root",
    "Archive": "harness.data._machinery.sources:Archive",
    "Archives": "harness.data._machinery.sources:Archives",
    "Torchvision": "harness.data._machinery.sources:Torchvision",
    "Instructions": "harness.data._machinery.sources:Instructions",
    "PublishedCorruptions": "harness.data._machinery.sources:PublishedCorruptions",
    # an executor
    "register_executor": "harness.executors:register_executor",
    "Executor": "harness.executors.base:Executor",
    "ExecutorOptions": "harness.executors.base:ExecutorOptions",
    "RunOutcome": "harness.executors.base:RunOutcome",
    "run_one": "harness.executors.ranks:run_one",
    # a tracker
    "register_tracker": "harness.storage.loggers:register_tracker",
    "TrackerRun": "harness.storage.tracked:TrackerRun",
    # a figure
    "register_figure": "reports.figures.base:register_figure",
    "FigureSpec": "reports.figures.base:FigureSpec",
    # a metric column
    "register_metric": "harness.registry:register_metric",
    "MetricSpec": "harness.contract.metric_spec:MetricSpec",
}

__all__ = [  # every name of _WHERE (tests/harness/registry/test_plugins_face.py)
    "Archive",
    "Archives",
    "BackboneSpec",
    "BatchFeeding",
    "BuildContext",
    "DataMissingError",
    "DatasetSpec",
    "Diagnostic",
    "DiagnosticFigure",
    "EnsembleModel",
    "Executor",
    "ExecutorOptions",
    "FigureSpec",
    "ImageSet",
    "Instructions",
    "LazySplit",
    "LoaderOptions",
    "MethodSpec",
    "MetricSpec",
    "NoHparams",
    "PublishedCorruptions",
    "RunOutcome",
    "Torchvision",
    "TrackerRun",
    "TrainOutput",
    "count_parameters",
    "default_data_root",
    "pretrain_epochs_field",
    "pretrained_field",
    "register_backbone",
    "register_dataset",
    "register_executor",
    "register_figure",
    "register_method",
    "register_metric",
    "register_tracker",
    "repeat_members",
    "run_one",
    "to_members",
]


def __getattr__(name: str) -> Any:
    """The object ``name`` stands for, imported from its layer on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'harness.plugins' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
