"""The checks of a parsed suite beyond its structure, and the attribution of every problem.

:func:`harness.config.parse.load_suite` is the one entry point: it parses the mapping (unknown
keys, types, bounds, unknown names of methods, backbones, datasets, OOD sets and corruptions),
then asks :func:`suite_problems` for what only the whole suite shows (recipe sanity, a grid that
expands to no cell, ``pretrained:`` weights and, on request, their files), and names the origin
of every problem once, with :func:`attribute`: the file and key that set the value, or the
command-line override that did (also when the override set a *related* key: ``recipe.epochs=1``
makes an included file's ``warmup_epochs: 2`` wrong, and the message names the override).

Also :func:`require_results`, the results folder the reading commands need.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.includes import Origins
from harness.config.overrides import override_of
from harness.contract.config import Recipe


@dataclass(frozen=True)
class Problem:
    """One problem at a key path, in words.

    Attributes:
        key: the key path whose value is wrong (``recipe.warmup_epochs``).
        text: what is wrong.
        related: other key paths whose values make it wrong (``recipe.epochs``): an override of
            one of them is named as the cause.
        origin: the key path that set the value, when it is not ``key`` (a method's recipe
            inherits the suite's ``recipe.warmup_epochs``): its file is the one named.
    """

    key: str
    text: str
    related: tuple[str, ...] = ()
    origin: str | None = None

    def __str__(self) -> str:
        return f"{self.key}: {self.text}"


def recipe_problems(
    recipe: Recipe, where: str, origin_of: Callable[[str], str] | None = None
) -> list[Problem]:
    """Problems of one recipe at key path ``where`` (``recipe``, ``grid.methods[2].recipe``);
    ``origin_of(field)`` is the key path that set a field (a method's recipe delta, or the
    suite's recipe it inherits), by default ``where.field``."""
    origin = origin_of or (lambda f: f"{where}.{f}")

    def problem(field: str, text: str, *others: str) -> Problem:
        return Problem(f"{where}.{field}", text, tuple(origin(o) for o in others), origin(field))

    out = []
    ms = list(recipe.milestones)
    if recipe.schedule == "multistep" and not ms:
        out.append(problem("milestones", "required when schedule is 'multistep'", "schedule"))
    if recipe.schedule == "multistep" and ms:
        outside = [m for m in ms if not 0 < m < recipe.epochs]
        if outside:
            text = (
                f"{outside} not inside (0, epochs={recipe.epochs}); a milestone at or after the "
                "last epoch never decays the learning rate"
            )
            out.append(problem("milestones", text, "epochs"))
        if any(b <= a for a, b in itertools.pairwise(ms)):
            out.append(problem("milestones", f"{ms} must be strictly increasing"))
    if recipe.batch_size % recipe.processes:
        text = (
            f"{recipe.batch_size} is not divisible by processes {recipe.processes}: every "
            "process trains on an equal block of the global batch"
        )
        out.append(problem("batch_size", text, "processes"))
    if recipe.warmup_epochs and recipe.warmup_epochs >= recipe.epochs:
        text = f"{recipe.warmup_epochs} is not below epochs={recipe.epochs}"
        out.append(problem("warmup_epochs", text, "epochs"))
    return out


def attribute(
    problem: Problem | str, origins: Origins, source: Path, applied: dict[str, str]
) -> str:
    """``problem`` as the line a user reads: ``override K=V: ...`` when an override set its key
    (or a related one), else ``<file that set the key>: <key>: ...``.

    Args:
        problem: a :class:`Problem`, or a message ``"<key path>: <text>"``.
        origins: which file set each key (after ``include:`` composition).
        source: the suite file (for problems of no key).
        applied: canonical key path → override text (:func:`apply_overrides`).
    """
    message = str(problem)
    key, _, rest = (s.strip() for s in message.partition(":"))
    is_key = bool(key) and " " not in key
    structured = isinstance(problem, Problem)
    origin = (problem.origin if structured else None) or key
    found = override_of(origin, applied) if is_key else None
    if found:  # the problem is the override's: name it (its key only when the problem is deeper)
        canonical, text = found
        return f"override {text}: {rest}" if key == canonical else f"override {text}: {message}"
    file = origins.file_of(origin) if is_key else source
    for other in problem.related if structured else ():
        if found := override_of(other, applied):  # the override made this file's value wrong
            return f"override {found[1]}: {message} ({origin} set in {_rel(file)})"
    return f"{_rel(file)}: {message}"


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def backbone_option_problems(entry: Any, dataset: Any, index: int) -> list[str]:
    """``grid.backbones[i].kwargs`` that the backbone's builder refuses, found by building it
    once on PyTorch's ``meta`` device (shapes only: no memory, no initialisation cost). The
    builders forward their options to torch-uncertainty, timm or torchvision constructors, so
    calling is the one check that sees the whole signature chain.

    Args:
        entry: a :class:`harness.contract.config.BackboneEntry` with ``kwargs``.
        dataset: the :class:`harness.data._machinery.base.DatasetSpec` of the grid's first
            dataset (the input shape and class count to build for).
        index: the entry's position in ``grid.backbones``, for the key path.
    """
    import torch

    from harness.registry import BACKBONES

    spec = BACKBONES.get(entry.name)
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "zero-element tensors": reported below instead
            net = spec.build(dataset.in_shape, dataset.num_classes or 2, **dict(entry.kwargs))
        if empty := [n for n, p in net.named_parameters() if p.numel() == 0]:
            return [
                f"grid.backbones[{index}].kwargs: backbone {entry.name!r} with "
                f"{dict(entry.kwargs)} has an empty layer ({empty[0]}): nothing to train"
            ]
    except TypeError as exc:  # unknown keyword, or a value of the wrong type
        valid = _named_options(spec.build)
        hint = f" (this builder's own options: {', '.join(valid)})" if valid else ""
        # The key path of the option at fault when the error (or a lone option) tells which, so
        # that an override of it is the one named.
        named = [k for k in entry.kwargs if f"'{k}'" in str(exc)] or list(entry.kwargs)
        key = f".{named[0]}" if len(named) == 1 else ""
        where = f"grid.backbones[{index}].kwargs{key}"
        return [f"{where}: backbone {entry.name!r} refuses it: {exc}{hint}"]
    except Exception as exc:
        # About the options only if the builder succeeds without them (`width: -3` fails in
        # torch's layer constructor); otherwise the meta device is at fault and the cell says.
        try:
            with torch.device("meta"):
                spec.build(dataset.in_shape, dataset.num_classes or 2)
        except Exception:
            return []
        first = " ".join(str(exc).split())[:200] or type(exc).__name__
        return [
            f"grid.backbones[{index}].kwargs: backbone {entry.name!r} cannot be built with "
            f"{dict(entry.kwargs)}: {type(exc).__name__}: {first}"
        ]
    return []


def method_build_problems(
    spec: Any,
    settings: Sequence[Any],
    index: int,
    backbones: list[Any],
    datasets: list[str],
    members: Any,
) -> list[Problem]:
    """What a method's ``check_build`` finds for each backbone × dataset × M × hyper-parameter
    setting of ``grid.methods[index]``: problems only sizing the model shows, found before any
    cell trains instead of when that cell starts.

    Args:
        spec: the method's :class:`methods._base.MethodSpec` (with ``check_build`` set).
        settings: the entry's hyper-parameter settings (``MethodEntry.settings``: sweeps
            expanded, defaults filled in, each typed).
        index: the entry's position in ``grid.methods``, for the key path.
        backbones: the :class:`BackboneEntry` list the entry runs on.
        datasets: the grid's dataset names (input shape and class count of each).
        members: the entry's M values.
    """
    from harness.registry import DATASETS
    from methods._base import BuildContext

    key = f"grid.methods[{index}].hparams"
    # Any of the entry's hyper-parameters may be the cause: an override of one is named.
    related = tuple(f"{key}.{k}" for k in sorted({k for s in settings for k in s.values}))
    problems: list[Problem] = []
    for bb, name, m in itertools.product(backbones, datasets, members):
        ds = DATASETS.get(name)
        ctx = BuildContext(bb.name, tuple(ds.in_shape), ds.num_classes or 2, m, dict(bb.kwargs))
        for setting in settings:
            for text in spec.check_build(ctx, setting.typed):
                problems.append(Problem(key, f"{bb.name} on {name}, M={m}: {text}", related))
    return list(dict.fromkeys(problems))


def _named_options(build: Any) -> list[str]:
    import inspect

    try:
        params = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):
        return []
    skip = {"in_shape", "num_classes"}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name not in skip]


def suite_problems(suite: Any, check_files: bool = False) -> list[Problem | str]:
    """What only the whole parsed suite shows, one problem per key (not yet attributed).

    Args:
        suite: a :class:`harness.config.suite.Suite`.
        check_files: also check that ``pretrained:`` weights are on disk (a path, or named weights
            in the library's cache); off for ``harness validate --skip-data`` and for cells that
            run elsewhere, since weights are data like the datasets (the names are still checked).
    """
    problems: list[Problem | str] = list(recipe_problems(suite.recipe, "recipe"))
    for i, me in enumerate(suite.grid.methods):
        if me.recipe:
            where = f"grid.methods[{i}].recipe"
            problems += recipe_problems(
                suite.entry_recipe(me),
                where,
                lambda f, where=where, own=me.recipe: f"{where}.{f}" if f in own else f"recipe.{f}",
            )
        problems += _pretrained_problems(dict(me.hparams).get("pretrained"), i, check_files)
        problems += _pretrained_fit_problems(suite, i, me) if check_files else []
    if not suite.cells():
        problems.append(_empty_grid(suite.grid))
    problems += _pretrain_problems(suite)
    problems += calibration_problems(suite)
    return problems


def _pretrain_problems(suite: Any) -> list[Problem]:
    """Converting cells (``pretrain_epochs: N``) whose suite has no `single` cell of their
    dataset, backbone and seed trained for N epochs to convert
    (:func:`harness.config.suite.with_pretrain` found none): one problem per entry, saying
    what to add."""
    from harness.registry.conversion import missing_single, pretrain_epochs

    problems: list[Problem] = []
    for cell in suite.cells():
        epochs = pretrain_epochs(cell)
        if not epochs or cell.pretrain is not None:
            continue
        index = next(
            i
            for i, me in enumerate(suite.grid.methods)
            if me.name == cell.method and any(s.values == cell.hparams for s in me.settings)
        )
        problems.append(
            Problem(f"grid.methods[{index}].hparams.pretrain_epochs", missing_single(cell, epochs))
        )
    return list(dict.fromkeys(problems))


def calibration_problems(suite: Any) -> list[Problem]:
    """Post-hoc calibration needs held-out images of the training distribution, never the test
    set: the recipe's validation split (of every method) or ``evaluation.calibration`` images
    drawn from each dataset's spare images (which must hold that many)."""
    from harness.contract.config import conformal_alpha_problem
    from harness.registry import DATASETS

    ev = suite.evaluation
    out: list[Problem] = []
    if ev.calibration:
        for name in suite.grid.datasets:
            spare = DATASETS.get(name).spare_images
            if ev.calibration > spare:
                text = (
                    f"{ev.calibration} images asked for, but {name} has "
                    + (f"only {spare} spare images" if spare else "no spare images")
                    + " (training-distribution images it never trains on); "
                    + ("ask for fewer or " if spare else "")
                    + "hold out a validation split instead (recipe.validation: N)"
                )
                out.append(Problem("evaluation.calibration", text))
    recipes = [("recipe", suite.recipe)] + [
        (f"grid.methods[{i}].recipe", suite.entry_recipe(me))
        for i, me in enumerate(suite.grid.methods)
        if me.recipe
    ]
    if ev.calibrate:  # the sets fit on evaluation.calibration images, else on the validation split
        for n_cal in dict.fromkeys(ev.calibration or r.validation for _, r in recipes):
            if n_cal and (text := conformal_alpha_problem(ev.conformal_alpha, n_cal)):
                out.append(Problem("evaluation.conformal_alpha", text))
    if not ev.calibrate or ev.calibration:
        return out
    for where, recipe in recipes:
        if not recipe.validation:
            text = (
                "needs held-out images to fit on (never the test set): add "
                "`evaluation.calibration: N` (N spare images of the dataset) or "
                f"`{where}.validation: N`"
            )
            out.append(Problem("evaluation.calibrate", text, (f"{where}.validation",)))
            break
    return out


def _pretrained_problems(pretrained: Any, i: int, check_files: bool) -> list[str]:
    """``grid.methods[i].hparams.pretrained``: a known weights name, and its file when asked."""
    from harness.backbones._weights import WeightsError, is_named, named_problem, parse_pretrained
    from harness.storage.safe_files import weights_file_problem

    problems = []
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
    return problems


def _pretrained_fit_problems(suite: Any, i: int, entry: Any) -> list[str]:
    """``pretrained:`` files of ``grid.methods[i]`` that do not fit the backbone of a cell they
    initialise (another architecture, or no tensor of the backbone's shape): the cell would fail
    when it starts, so the file is named now. Names and shapes only (``meta`` device)."""
    from harness.backbones._weights import file_fit_problem, is_named
    from harness.registry import BACKBONES, DATASETS
    from harness.storage.safe_files import weights_file_problem

    given = entry.hparams.get("pretrained")
    paths = {str(p) for p in (given if isinstance(given, list | tuple) else [given]) if p}
    problems: dict[tuple, str] = {}
    for c in suite.cells():
        path = c.hparams.get("pretrained")
        key = (path, c.backbone, repr(sorted(c.backbone_kwargs.items())), c.dataset)
        if c.method != entry.name or str(path) not in paths or is_named(path) or key in problems:
            continue
        if not Path(str(path)).expanduser().is_file() or weights_file_problem(str(path)):
            continue  # named by _pretrained_problems
        ds, bb, kwargs = DATASETS.get(c.dataset), BACKBONES.get(c.backbone), c.backbone_kwargs
        problem = file_fit_problem(
            Path(str(path)).expanduser(),
            lambda ds=ds, bb=bb, kw=kwargs: bb.build(ds.in_shape, ds.num_classes or 2, **kw),
        )
        where = f"({c.backbone} on {c.dataset})"
        problems[key] = problem and f"grid.methods[{i}].hparams.{problem} {where}"
    return list(dict.fromkeys(p for p in problems.values() if p))


def _empty_grid(grid: Any) -> Problem:
    """The grid expands to no cell: the empty list if there is one, else why every method is
    left out."""
    for name in ("datasets", "backbones", "methods", "M", "seeds"):
        if not getattr(grid, name):
            return Problem(f"grid.{name}", "is empty, so the grid expands to 0 cells")
    return Problem("grid", "expands to 0 cells (every method is excluded by its backbones or M)")


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
