"""Checks run by ``harness validate`` and ``harness run`` before the first cell starts, beyond
what parsing a suite already rejects (unknown names of methods, backbones, datasets, OOD sets and
corruptions): recipe sanity, a grid that expands to no cell, files the cells will read
(``pretrained:`` weights), and results folders that the reading commands need.

Every message starts with the suite file and the key path, so a problem is found before hours of
training rather than at evaluation.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

from harness.contract.config import Recipe


def recipe_problems(recipe: Recipe, where: str) -> list[str]:
    """Problems of one recipe (``where``: its key path, e.g. ``grid.methods[2].recipe``)."""
    out = []
    ms = list(recipe.milestones)
    if recipe.schedule == "multistep" and ms:
        outside = [m for m in ms if not 0 < m < recipe.epochs]
        if outside:
            out.append(
                f"{where}.milestones: {outside} not inside (0, epochs={recipe.epochs}); "
                "a milestone at or after the last epoch never decays the learning rate"
            )
        if any(b <= a for a, b in itertools.pairwise(ms)):
            out.append(f"{where}.milestones: {ms} must be strictly increasing")
    if recipe.warmup_epochs and recipe.warmup_epochs >= recipe.epochs:
        out.append(
            f"{where}.warmup_epochs: {recipe.warmup_epochs} is not below epochs={recipe.epochs}"
        )
    return out


def backbone_option_problems(entry: Any, dataset: Any, index: int) -> list[str]:
    """``grid.backbones[i].kwargs`` that the backbone's builder refuses, found by building it
    once on PyTorch's ``meta`` device (shapes only: no memory, no initialisation cost). The
    builders forward their options to torch-uncertainty, timm or torchvision constructors, so
    calling is the one check that sees the whole signature chain.

    Args:
        entry: a :class:`harness.contract.config.BackboneEntry` with ``kwargs``.
        dataset: the :class:`harness.data.base.DatasetSpec` of the grid's first dataset (the
            input shape and class count to build for).
        index: the entry's position in ``grid.backbones``, for the key path.
    """
    import torch

    from harness.registry import BACKBONES

    spec = BACKBONES.get(entry.name)
    try:
        with torch.device("meta"):
            spec.build(dataset.in_shape, dataset.num_classes or 2, **dict(entry.kwargs))
    except TypeError as exc:  # unknown keyword, or a value of the wrong type
        valid = _named_options(spec.build)
        hint = f" (this builder's own options: {', '.join(valid)})" if valid else ""
        # The key path of the option at fault when the error (or a lone option) tells which, so
        # that an override of it is the one named.
        named = [k for k in entry.kwargs if f"'{k}'" in str(exc)] or list(entry.kwargs)
        key = f".{named[0]}" if len(named) == 1 else ""
        where = f"grid.backbones[{index}].kwargs{key}"
        return [f"{where}: backbone {entry.name!r} refuses it: {exc}{hint}"]
    except Exception:  # anything else is not about the options; the cell will say what
        return []
    return []


def _named_options(build: Any) -> list[str]:
    import inspect

    try:
        params = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):
        return []
    skip = {"in_shape", "num_classes"}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name not in skip]


def suite_problems(suite: Any, check_files: bool = True) -> list[str]:
    """Everything knowable about a parsed suite before training, one message per problem.

    Args:
        suite: a :class:`harness.config.suite.Suite`.
        check_files: also check that ``pretrained:`` weights are on disk (a path, or named weights
            in the library's cache); ``harness validate --skip-data`` turns it off, since weights
            are data like the datasets (the names are still checked).

    Returns:
        Messages ``<file>: <key path>: <problem>``; empty when the suite is sound.
    """
    from harness.backbones.weights import WeightsError, is_named, named_problem, parse_pretrained
    from harness.storage.safe_files import weights_file_problem

    problems = recipe_problems(suite.recipe, "recipe")
    for i, me in enumerate(suite.grid.methods):
        if me.recipe:
            merged = dataclasses.replace(suite.recipe, **dict(me.recipe))
            problems += recipe_problems(merged, f"grid.methods[{i}].recipe")
        pretrained = dict(me.hparams).get("pretrained")
        for path in pretrained if isinstance(pretrained, list | tuple) else [pretrained]:
            if is_named(path):  # timm:NAME / torchvision:NAME: known name, file in the cache
                if not check_files:
                    try:
                        parse_pretrained(path)  # the name alone
                    except WeightsError as err:
                        problems.append(f"grid.methods[{i}].hparams.{err}")
                elif problem := named_problem(path):
                    problems.append(f"grid.methods[{i}].hparams.{problem}")
            elif check_files and path and not Path(str(path)).expanduser().is_file():
                problems.append(f"grid.methods[{i}].hparams.pretrained: no file {path}")
            elif check_files and path and (problem := weights_file_problem(str(path))):
                problems.append(f"grid.methods[{i}].hparams.pretrained: {path} {problem}")
    if not suite.cells():
        problems.append(
            "grid: expands to 0 cells (every method is excluded by its backbones or M, or a "
            "list is empty)"
        )
    source = suite.source or "suite"
    return [f"{source}: {p}" for p in dict.fromkeys(problems)]


def require_results(results_dir: Path, records: bool = True) -> Path:
    """The results folder a reading command needs, or a one-line ``FileNotFoundError``
    (the CLI prints it and exits 2).

    Args:
        results_dir: a suite's results folder (``results/<suite>``).
        records: also require at least one ``*/record.json`` (report, evaluate); ``status``
            only needs the suite's manifest, as a just-submitted array has no record yet.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(
            f"{results_dir}: no such results folder (harness run writes results/<suite name>)"
        )
    if records and not any(results_dir.glob("*/record.json")):
        raise FileNotFoundError(
            f"{results_dir}: holds no records yet (no */record.json); run the suite first, "
            f"or see where it stands with `harness status {results_dir}`"
        )
    if not records and not (results_dir / "suite.json").exists():
        raise FileNotFoundError(
            f"{results_dir}: holds no suite.json: is it a suite's results folder written by "
            "`harness run`?"
        )
    return results_dir
