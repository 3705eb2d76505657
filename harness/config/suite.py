"""Suites: validated, frozen descriptions of a grid, expanded into cells (the model).

A suite file declares a grid (datasets × backbones × methods with hyper-parameters × M × seeds),
the training recipe and the evaluations. :func:`harness.config.parse.load_suite` builds a
:class:`Suite` after checking everything that can be checked without training; this module only
holds the model and its expansion into cells.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.config import (
    BackboneEntry,
    Cell,
    Evaluation,
    HparamSetting,
    MethodEntry,
    Recipe,
    expand_values,
    hparam_defaults,
)
from harness.registry import METHODS
from harness.registry.conversion import converted_single, pretrain_epochs


@dataclass(frozen=True)
class Grid:
    datasets: tuple[str, ...]
    backbones: tuple[BackboneEntry, ...]
    methods: tuple[MethodEntry, ...]
    M: tuple[int, ...] = (4,)
    seeds: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class Suite:
    name: str
    grid: Grid
    recipe: Recipe
    evaluation: Evaluation
    description: str = ""
    source: Path | None = None
    overrides: tuple[str, ...] = ()  # command-line KEY=VALUE overrides applied to the file
    #: ``methods: [all]``: each registered method it left out, and why (``harness validate``).
    left_out: tuple[tuple[str, str], ...] = ()

    def cells(self) -> list[Cell]:
        """Expand the grid: datasets × backbones × methods × hparam product × M × seeds.

        Expanded once per suite object (a command asks several times; the cells are frozen)."""
        if (cached := self.__dict__.get("_cells")) is not None:
            return list(cached)
        out: list[Cell] = []
        for ds, me in itertools.product(self.grid.datasets, self.grid.methods):
            for bb in method_backbones(me, self.grid.backbones):
                out.extend(self._method_cells(ds, bb, me))
        seen: dict[str, Cell] = {}
        for c in out:  # the same config listed twice is one cell
            seen.setdefault(c.cell_id, c)
        cells = with_pretrain(list(seen.values()))
        object.__setattr__(self, "_cells", tuple(cells))  # frozen: set past __setattr__
        return cells

    def entry_recipe(self, entry: MethodEntry) -> Recipe:
        """The recipe a method entry's cells train with: the suite's, with the entry's recipe
        delta (e.g. a short fine-tuning schedule) applied. The one place the delta is merged:
        the cells and the validator's recipe checks both take it from here."""
        return (
            dataclasses.replace(self.recipe, **dict(entry.recipe)) if entry.recipe else self.recipe
        )

    def _method_cells(self, ds: str, bb: BackboneEntry, me: MethodEntry) -> list[Cell]:
        """Cells of one (dataset, backbone, method entry): hparam product × M × seeds."""
        out: list[Cell] = []
        spec = METHODS.get(me.name)
        defaults = hparam_defaults(spec.hparams)
        recipe = self.entry_recipe(me)  # one per entry, not per cell
        for setting in me.settings or entry_settings(spec, me):  # parsed suites carry them
            for m in members_for(spec, me, self.grid.M):
                for seed in self.grid.seeds:
                    out.append(
                        Cell(
                            self.name,
                            ds,
                            bb.name,
                            dict(bb.kwargs),
                            me.name,
                            m,
                            setting.values,
                            seed,
                            recipe,
                            self.evaluation,
                            defaults,
                            typed_hparams=setting.typed,
                        )
                    )
        return out


def method_backbones(
    entry: MethodEntry, grid_backbones: tuple[BackboneEntry, ...] | list[BackboneEntry]
) -> list[BackboneEntry]:
    """The backbones a method entry runs on: its own ``backbones:`` (a grid backbone of that name
    keeps its kwargs) or else the grid's."""
    if entry.backbones is None:
        return list(grid_backbones)
    by_name = {b.name: b for b in grid_backbones}
    return [by_name.get(n, BackboneEntry(n)) for n in entry.backbones]


def expand_hparams(spec: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Product of swept hyper-parameter values, completed with the method's defaults (JSON
    form; :func:`entry_settings` adds the typed object to each)."""
    return expand_values(hparam_defaults(spec.hparams), values)


def entry_settings(spec: Any, entry: MethodEntry) -> tuple[HparamSetting, ...]:
    """The one expansion of a method entry's sweep: the product of its swept values completed
    with the method's defaults, each with the typed hyper-parameters
    (:meth:`methods._base.MethodSpec.make_hparams`) built once. The parser stores the result on
    the entry (``MethodEntry.settings``), where the validator and the cells read it."""
    return tuple(
        HparamSetting(values, spec.make_hparams(values))
        for values in expand_hparams(spec, entry.hparams)
    )


def with_pretrain(cells: list[Cell]) -> list[Cell]:
    """The pre-training decision, made once for the whole suite and recorded on each cell
    (``Cell.pretrain``): a cell of a method that converts a trained single backbone
    (``MethodSpec.pretrained_conversion``) with ``pretrain_epochs: N`` and no ``pretrained``
    weights converts the suite's own `single` cell of the same dataset, backbone (and options)
    and seed trained for N epochs with the suite's recipe
    (:func:`harness.registry.conversion.converted_single`); when several match (two `single`
    entries of N epochs), the one of lowest cell id, so every converting cell of a seed names
    the same one. A converting cell with no such `single` cell
    keeps ``pretrain=None``; the validator refuses the suite
    (:func:`harness.config.validator.suite_problems`, with
    :func:`harness.registry.conversion.missing_single`)."""
    singles = sorted((c for c in cells if c.method == "single"), key=lambda c: c.cell_id)
    out = []
    for cell in cells:
        if epochs := pretrain_epochs(cell):
            cell = dataclasses.replace(cell, pretrain=converted_single(cell, singles, epochs))
        out.append(cell)
    return out


def members_for(spec, entry: MethodEntry, grid_m: tuple[int, ...]) -> tuple[int, ...]:
    """The M values of a method: its own list, else the grid's; fixed-size methods use theirs."""
    if entry.M is not None:
        return entry.M
    if spec.max_members == 1:
        return (1,)
    return grid_m
