"""Suites: validated, frozen descriptions of a grid, expanded into cells.

A suite file declares a grid (datasets × backbones × methods with hyper-parameters × M × seeds),
the training recipe and the evaluations. ``load_suite`` validates everything that can be checked
without training and raises :class:`SuiteError` listing every problem with its file and key path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.registries import BACKBONES, DATASETS, METHODS
from harness.registry import UnknownNameError
from harness.schema import build_dataclass, check_constraints, coerce, unknown_keys
from harness.suite_io import Origins, SuiteError, load_suite_yaml

__all__ = ["Cell", "Evaluation", "Recipe", "Suite", "SuiteError", "load_suite"]


@dataclass(frozen=True)
class Recipe:
    """Training recipe shared by every cell of a suite (fair comparison: same for all methods)."""

    epochs: int = field(default=20, metadata={"ge": 0, "help": "training epochs"})
    batch_size: int = field(default=64, metadata={"ge": 1, "help": "images per step (B)"})
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = field(default=0.05, metadata={"gt": 0})
    momentum: float = field(default=0.9, metadata={"ge": 0, "lt": 1})
    nesterov: bool = False
    weight_decay: float = field(default=5e-4, metadata={"ge": 0})
    schedule: Literal["cosine", "multistep", "constant"] = "cosine"
    milestones: tuple[int, ...] = field(
        default=(), metadata={"ge": 1, "help": "epochs of lr decay (multistep)"}
    )
    lr_decay: float = field(default=0.2, metadata={"gt": 0, "help": "multistep factor"})
    warmup_epochs: int = field(default=0, metadata={"ge": 0})
    augment: Literal["default", "none", "crop_flip"] = field(
        default="default", metadata={"help": "default: the dataset's standard augmentation"}
    )
    label_smoothing: float = field(default=0.0, metadata={"ge": 0, "lt": 1})
    grad_clip: float | None = field(default=None, metadata={"gt": 0})
    amp: bool = field(default=True, metadata={"help": "bf16 autocast on GPU"})
    channels_last: bool = field(default=True, metadata={"help": "channels_last on GPU"})
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    eval_batch_size: int = field(default=512, metadata={"ge": 1})
    max_loss: float = field(
        default=1e4,
        metadata={"gt": 0, "help": "a loss above this (or non-finite) marks the cell failed"},
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"


@dataclass(frozen=True)
class Evaluation:
    """What to evaluate after training. Not part of the cell id: adding an OOD set or a
    corruption re-evaluates finished cells (``harness evaluate``) instead of retraining them."""

    corruptions: tuple[str, ...] = field(
        default=(),
        metadata={"help": "corruption names, or [all] for every one that applies to the dataset"},
    )
    severities: tuple[int, ...] = field(default=(1, 2, 3, 4, 5), metadata={"ge": 1, "le": 5})
    ood: tuple[str, ...] = field(default=(), metadata={"help": "OOD dataset names"})
    cost: bool = field(default=True, metadata={"help": "measure params, FLOPs, throughput"})
    cost_steps: int = field(default=5, metadata={"ge": 1, "help": "timed steps after warm-up"})


@dataclass(frozen=True)
class MethodEntry:
    """One method of the grid with the values to sweep (each hparam value list → product)."""

    name: str
    M: tuple[int, ...] | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)  # this method's recipe deltas


@dataclass(frozen=True)
class BackboneEntry:
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


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

    def cells(self) -> list[Cell]:
        """Expand the grid: datasets × backbones × methods × hparam product × M × seeds."""
        out: list[Cell] = []
        for ds, bb, me in itertools.product(
            self.grid.datasets, self.grid.backbones, self.grid.methods
        ):
            spec = METHODS.get(me.name)
            for hp in expand_hparams(spec, me.hparams):
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
                                hp,
                                seed,
                                dataclasses.replace(self.recipe, **me.recipe),
                                self.evaluation,
                            )
                        )
        seen: dict[str, Cell] = {}
        for c in out:  # the same config listed twice is one cell
            seen.setdefault(c.cell_id, c)
        return list(seen.values())


@dataclass(frozen=True)
class Cell:
    """One resolved configuration: the unit of training, scheduling and result records."""

    suite: str
    dataset: str
    backbone: str
    backbone_kwargs: dict[str, Any]
    method: str
    M: int
    hparams: dict[str, Any]
    seed: int
    recipe: Recipe
    evaluation: Evaluation

    def config(self) -> dict[str, Any]:
        """The training-relevant configuration; its hash is the cell id."""
        return {
            "dataset": self.dataset,
            "backbone": self.backbone,
            "backbone_kwargs": dict(sorted(self.backbone_kwargs.items())),
            "method": self.method,
            "M": self.M,
            "hparams": dict(sorted(self.hparams.items())),
            "seed": self.seed,
            "recipe": _jsonable(dataclasses.asdict(self.recipe)),
        }

    @property
    def cell_id(self) -> str:
        blob = json.dumps(self.config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        """Short human-readable name: hyper-parameters at their defaults are left out."""
        defaults = method_defaults(self.method)
        hp = ",".join(f"{k}={v}" for k, v in sorted(self.hparams.items()) if defaults.get(k) != v)
        return (
            f"{self.dataset}/{self.backbone}/{self.method}(M={self.M}"
            f"{',' + hp if hp else ''})/seed{self.seed}"
        )

    def to_json(self) -> dict[str, Any]:
        """Everything needed to rebuild the cell in another process (Slurm tasks, workers)."""
        return {
            "suite": self.suite,
            **self.config(),
            "evaluation": _jsonable(dataclasses.asdict(self.evaluation)),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        rec = dict(data["recipe"])
        rec["milestones"] = tuple(rec["milestones"])
        ev = {k: tuple(v) if isinstance(v, list) else v for k, v in data["evaluation"].items()}
        return cls(
            data["suite"],
            data["dataset"],
            data["backbone"],
            data["backbone_kwargs"],
            data["method"],
            data["M"],
            data["hparams"],
            data["seed"],
            Recipe(**rec),
            Evaluation(**ev),
        )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple | list):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    return obj


def expand_hparams(spec, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Product of swept hyper-parameter values, completed with the method's defaults."""
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(spec.hparams)
        if f.default is not dataclasses.MISSING
    }
    keys = sorted(values)
    lists = [v if isinstance(v, list | tuple) else [v] for v in (values[k] for k in keys)]
    out = []
    for combo in itertools.product(*lists):
        hp = {**defaults, **dict(zip(keys, combo))}
        out.append({k: list(v) if isinstance(v, tuple) else v for k, v in hp.items()})
    return out


def method_defaults(method: str) -> dict[str, Any]:
    """Every hyper-parameter of a registered method at its default value."""
    return expand_hparams(METHODS.get(method), {})[0]


def members_for(spec, entry: MethodEntry, grid_m: tuple[int, ...]) -> tuple[int, ...]:
    """The M values of a method: its own list, else the grid's; fixed-size methods use theirs."""
    if entry.M is not None:
        return entry.M
    if spec.max_members == 1:
        return (1,)
    return grid_m


# --- parsing and validation -------------------------------------------------------------------

TOP_KEYS = ["name", "description", "grid", "recipe", "evaluation"]
GRID_KEYS = ["datasets", "backbones", "methods", "M", "seeds"]
METHOD_KEYS = ["name", "M", "hparams", "recipe"]


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _lookup(registry, name: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(name, str):
        errors.append(f"{where}: expected a {registry.kind} name, got {name!r}")
        return None
    try:
        return registry.get(name)
    except UnknownNameError as exc:
        errors.append(f"{where}: {exc}")
        return None


def _parse_methods(raw: Any, errors: list[str]) -> list[MethodEntry]:
    entries = []
    for i, item in enumerate(_as_list(raw)):
        where = f"grid.methods[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or "name" not in item:
            errors.append(f"{where}: expected a method name or a mapping with 'name'")
            continue
        errors.extend(unknown_keys(item, METHOD_KEYS, where))
        spec = _lookup(METHODS, item["name"], f"{where}.name", errors)
        ms = None
        if "M" in item:
            ms = coerce(_as_list(item["M"]), tuple[int, ...], f"{where}.M", errors)
        hp = item.get("hparams") or {}
        if not isinstance(hp, dict):
            errors.append(f"{where}.hparams: expected a mapping, got {hp!r}")
            hp = {}
        if spec is not None:
            hp = _check_hparams(spec, hp, f"{where}.hparams", errors)
        delta: dict[str, Any] = {}
        if item.get("recipe") is not None:
            # A method's documented recipe delta (e.g. a short fine-tuning schedule): validated
            # against the same Recipe dataclass as the suite's recipe.
            checked = build_dataclass(Recipe, item["recipe"], f"{where}.recipe", errors)
            if checked is not None:
                delta = {k: getattr(checked, k) for k in item["recipe"] if hasattr(checked, k)}
        entries.append(MethodEntry(str(item["name"]), ms, hp, delta))
    return entries


def _check_hparams(spec, hp: dict[str, Any], where: str, errors: list[str]) -> dict[str, Any]:
    """Validate hyper-parameter values (scalars or sweep lists) against the method's dataclass."""
    import typing

    fields = spec.hparam_fields()
    errors.extend(unknown_keys(hp, list(fields), where))
    hints = typing.get_type_hints(spec.hparams)
    out = {}
    for key, value in hp.items():
        if key not in fields:
            continue
        tp = hints[key]
        is_tuple_type = typing.get_origin(tp) is tuple
        values = value if isinstance(value, list) and not is_tuple_type else [value]
        if isinstance(value, list) and is_tuple_type and value and isinstance(value[0], list):
            values = value  # a sweep over list-valued hparams
        coerced = []
        for j, v in enumerate(values):
            w = f"{where}.{key}" + (f"[{j}]" if len(values) > 1 else "")
            before = len(errors)
            cv = coerce(v, tp, w, errors)
            if len(errors) == before:
                check_constraints(cv, fields[key].metadata, w, errors)
            coerced.append(cv)
        out[key] = coerced if len(coerced) > 1 else coerced[0]
    return out


def parse_suite(data: dict[str, Any], origins: Origins, source: Path) -> Suite:
    """Validate a loaded mapping into a :class:`Suite` (raises SuiteError with every problem)."""
    errors: list[str] = []
    errors.extend(unknown_keys(data, TOP_KEYS, ""))
    name = data.get("name", source.stem)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        errors.append(f"name: must be letters, digits, '-' or '_', got {name!r}")
    grid_raw = data.get("grid")
    if not isinstance(grid_raw, dict):
        errors.append("grid: required mapping is missing (datasets, backbones, methods, M, seeds)")
        grid_raw = {}
    errors.extend(unknown_keys(grid_raw, GRID_KEYS, "grid"))
    for req in ("datasets", "backbones", "methods"):
        if req not in grid_raw and "grid" in data:
            errors.append(f"grid.{req}: required key is missing")

    datasets = [
        d
        for i, d in enumerate(_as_list(grid_raw.get("datasets", [])))
        if _lookup(DATASETS, d, f"grid.datasets[{i}]", errors) is not None
    ]
    for d in datasets:
        if DATASETS.get(d).num_classes is None:
            errors.append(f"grid.datasets: {d!r} is an OOD-only set and cannot be trained on")
    backbones = []
    for i, b in enumerate(_as_list(grid_raw.get("backbones", []))):
        entry = (
            BackboneEntry(b)
            if isinstance(b, str)
            else (build_dataclass(BackboneEntry, b, f"grid.backbones[{i}]", errors))
        )
        if entry and _lookup(BACKBONES, entry.name, f"grid.backbones[{i}]", errors):
            backbones.append(entry)
    methods = _parse_methods(grid_raw.get("methods", []), errors)
    grid_m = coerce(_as_list(grid_raw.get("M", [4])), tuple[int, ...], "grid.M", errors)
    seeds = coerce(_as_list(grid_raw.get("seeds", [0])), tuple[int, ...], "grid.seeds", errors)

    for me in methods:
        if me.name not in METHODS:
            continue
        spec = METHODS.get(me.name)
        where = f"grid.methods[{methods.index(me)}]"
        for m in members_for(spec, me, grid_m) if all(isinstance(x, int) for x in grid_m) else ():
            if not isinstance(m, int):
                continue
            if m < 1:
                errors.append(f"{where}.M: M must be >= 1, got {m}")
            elif m < spec.min_members or (spec.max_members and m > spec.max_members):
                hi = spec.max_members or "any"
                errors.append(
                    f"{where}.M: method {me.name!r} allows M in [{spec.min_members}, {hi}], got {m}"
                )
            elif spec.check:
                for hp in expand_hparams(spec, me.hparams):
                    errors.extend(
                        f"{where}: {p}"
                        for p in spec.check(
                            spec.hparams(
                                **{k: tuple(v) if isinstance(v, list) else v for k, v in hp.items()}
                            ),
                            m,
                        )
                    )
        for bb in backbones:
            if spec.backbones is not None and bb.name not in spec.backbones:
                errors.append(
                    f"{where}: method {me.name!r} does not support backbone "
                    f"{bb.name!r}; supported backbones: {', '.join(spec.backbones)}"
                )

    recipe = build_dataclass(Recipe, data.get("recipe"), "recipe", errors)
    evaluation = build_dataclass(Evaluation, data.get("evaluation"), "evaluation", errors)
    if evaluation is not None:
        for i, o in enumerate(evaluation.ood):
            _lookup(DATASETS, o, f"evaluation.ood[{i}]", errors)
        from harness.data.corruption_sets import check_corruptions  # names, generators here

        for d in datasets:
            errors.extend(
                f"evaluation.corruptions: {p}" for p in check_corruptions(d, evaluation.corruptions)
            )
        if recipe is not None and recipe.schedule == "multistep" and not recipe.milestones:
            errors.append("recipe.milestones: required when schedule is 'multistep'")

    if errors:
        raise SuiteError([_with_file(e, origins, source) for e in dict.fromkeys(errors)])
    grid = Grid(tuple(datasets), tuple(backbones), tuple(methods), tuple(grid_m), tuple(seeds))
    return Suite(name, grid, recipe, evaluation, str(data.get("description", "")), source)


def _with_file(message: str, origins: Origins, source: Path) -> str:
    key = message.split(":", 1)[0].strip()
    file = origins.file_of(key) if key and " " not in key else source
    return f"{_rel(file)}: {message}"


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_suite(path: str | Path) -> Suite:
    """Load, compose and validate a suite file."""
    data, origins = load_suite_yaml(path)
    return parse_suite(data, origins, Path(path).resolve())
