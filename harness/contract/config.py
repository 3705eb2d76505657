"""The configuration types every layer shares: training recipe, evaluation, grid entries, cell.

A :class:`Cell` is one resolved configuration — the unit of training, scheduling and result
records — identified by a hash of its training-relevant content (:attr:`Cell.cell_id`). The YAML
parser (``harness.config.suite``) produces these types; the engine, the executors and the reporter
consume them. Standard library only: reading a cell back from JSON never imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from harness.contract.build import build_dataclass

__all__ = [
    "SPEED_ONLY_RECIPE",
    "BackboneEntry",
    "Cell",
    "Evaluation",
    "HparamSetting",
    "MethodEntry",
    "Recipe",
    "cell_label",
    "expand_values",
    "format_hparams",
    "hparam_defaults",
    "hparams_json",
    "hparams_values",
    "identity_recipe",
    "jsonable",
    "shown_hparams",
]


@dataclass(frozen=True)
class Recipe:
    """Training recipe shared by every cell of a suite (fair comparison: same for all methods)."""

    epochs: int = field(default=20, metadata={"ge": 0, "help": "training epochs"})
    batch_size: int = field(default=64, metadata={"ge": 1, "help": "images per step (B)"})
    validation: int = field(
        default=0,
        metadata={
            "ge": 0,
            "help": "training images held out as the validation split (stratified by class, "
            "seed 0 whatever the cell's seed); 0: train on all of them, no validation metrics. "
            "A suite that selects anything selects on this split only",
        },
    )
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
    cuda_graph: Literal["auto", "off"] = field(
        default="auto",
        metadata={
            "help": "auto: on CUDA, capture the training step as a CUDA graph and replay it "
            "(eager steps when capture fails, with the reason; never on the CPU or with "
            "compile); off: eager steps"
        },
    )
    deterministic: bool = field(
        default=False,
        metadata={
            "help": "deterministic GPU kernels (cuDNN, cuBLAS, torch): a resumed GPU cell is "
            "then bit-identical to an uninterrupted one, at some speed (docs/benchmarks.md)"
        },
    )
    eval_batch_size: int = field(default=512, metadata={"ge": 1})
    max_loss: float = field(
        default=1e4,
        metadata={"gt": 0, "help": "a loss above this (or non-finite) marks the cell failed"},
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    processes: int = field(
        default=1,
        metadata={
            "ge": 1,
            "help": "processes (one GPU each) one cell trains on with DistributedDataParallel; "
            "batch_size stays the global batch, split evenly over them (docs/distributed.md)",
        },
    )


#: Recipe fields that change how fast a cell trains or evaluates, never what it computes (up to
#: floating-point summation order): left out of the cell id, so toggling one reuses finished
#: cells; the record's ``config.recipe`` still states the values used. ``amp`` is not among them:
#: bf16 autocast changes the numbers a run produces. ``device`` is not either (CPU and GPU
#: kernels differ, and a cell's cost metrics depend on it).
SPEED_ONLY_RECIPE: tuple[str, ...] = (
    "channels_last",
    "compile",
    "cuda_graph",
    "deterministic",
    "eval_batch_size",
)


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
    calibrate: bool = field(
        default=False,
        metadata={
            "help": "post-hoc calibration: temperature scaling of the ensemble's predictive "
            "distribution, conformal sets (THR, APS, RAPS) and reliability bins, fitted on the "
            "recipe's validation split or on `calibration` held-out images, never the test set"
        },
    )
    calibration: int = field(
        default=0,
        metadata={
            "ge": 0,
            "help": "images of the dataset's spare training-distribution images (never trained "
            "on; stratified, seed 1, the same for every cell) to fit post-hoc calibration on; "
            "0: the recipe's validation split",
        },
    )
    calibrate_members: bool = field(
        default=False,
        metadata={
            "help": "also calibrate-then-pool: one temperature per member before averaging "
            "(pool-then-calibrate, one temperature on the mean, is always computed)"
        },
    )
    conformal_alpha: float | tuple[float, ...] = field(
        default=0.1,
        metadata={
            "gt": 0,
            "lt": 1,
            "help": "conformal sets' target miscoverage (1 − coverage), or a list of them "
            "(e.g. [0.05, 0.1, 0.2]: one set predictor each, the sets nested)",
        },
    )

    limit: int | None = field(
        default=None,
        metadata={
            "ge": 0,
            "help": "a quick first look: score only N test images (the first N of a fixed "
            "permutation, seed 2, in the set's order: the same for every cell and run), and N of "
            "each OOD set and corruption; null or 0: the whole set. The held-out calibration and "
            "validation splits are not limited. Limited cells never pool or compare with full ones",
        },
    )

    def __post_init__(self) -> None:
        if self.limit == 0:  # 0 and null both mean the whole set: one value on the record
            object.__setattr__(self, "limit", None)
        alpha = self.conformal_alpha
        if isinstance(alpha, tuple) and not alpha:
            raise ValueError("conformal_alpha: an empty list (give one α or several)")
        if isinstance(alpha, tuple) and len(set(alpha)) != len(alpha):
            raise ValueError(f"conformal_alpha: {list(alpha)} repeats a value")


def conformal_alpha_problem(alpha: float | tuple[float, ...], n_cal: int) -> str | None:
    """Why ``alpha`` cannot mean what it says with ``n_cal`` calibration images, or None.

    Split conformal prediction thresholds at the ``⌈(n + 1)(1 − α)⌉``-th smallest of n
    calibration scores (Angelopoulos & Bates, 2021, §1.1); below ``α = 1/(n + 1)`` that rank
    exceeds n, the threshold is infinite and every set is the whole label set: the coverage
    figure would then describe no predictor at all. The rounding margin is the quantile's own
    (:func:`harness.metrics.posthoc.conformal_quantile`)."""
    alphas = alpha if isinstance(alpha, tuple) else (alpha,)
    low = [a for a in alphas if math.ceil((n_cal + 1) * (1.0 - a) - 1e-9) > n_cal]
    if not low or n_cal <= 0:
        return None
    return (
        f"{low[0]} leaves every conformal set the whole label set with {n_cal} calibration "
        f"images (the smallest usable α is 1/(n + 1) = {1 / (n_cal + 1):.3g}); raise α or "
        "calibrate on more images"
    )


class HparamSetting(NamedTuple):
    """One point of a method entry's sweep: its values in JSON form (what a cell stores and
    hashes) and the method's frozen dataclass built from them (what the code reads)."""

    values: dict[str, Any]
    typed: Any


@dataclass(frozen=True)
class MethodEntry:
    """One method of the grid with the values to sweep (each hparam value list → product).

    ``settings``: the sweep expanded (the product completed with the method's defaults), each
    with its typed hyper-parameters; the suite's parser fills it once, and the validator and
    the cells read it from here (:func:`harness.config.suite.entry_settings`).
    """

    name: str
    M: tuple[int, ...] | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)  # this method's recipe deltas
    # Backbone names this method runs on instead of the grid's (e.g. σN-Ens on WRN-28-8 beside
    # the WRN-28-10 comparators, for a comparison at a parameter budget); None = the grid's.
    backbones: tuple[str, ...] | None = None
    settings: tuple[HparamSetting, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class BackboneEntry:
    """One backbone of the grid with its constructor keyword arguments."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def jsonable(obj: Any) -> Any:
    """Tuples → lists, recursively: the JSON form of a dataclass's ``asdict``."""
    if isinstance(obj, tuple | list):
        return [jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    return obj


def hparams_json(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Hyper-parameters as stored in a cell (tuples → lists, so they hash and print as JSON)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in hparams.items()}


def hparams_values(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Hyper-parameters as a method's frozen dataclass takes them (lists → tuples).

    The inverse of :func:`hparams_json`; the one place the list → tuple conversion is written.
    """
    return {k: tuple(v) if isinstance(v, list) else v for k, v in hparams.items()}


def hparam_defaults(hparams_cls: type) -> dict[str, Any]:
    """Every field of a method's hyper-parameter dataclass that has a default, in JSON form."""
    return hparams_json(
        {
            f.name: f.default
            for f in dataclasses.fields(hparams_cls)
            if f.default is not dataclasses.MISSING
        }
    )


def expand_values(defaults: Mapping[str, Any], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Product of swept values (a list is a sweep, a scalar one value), completed with defaults."""
    keys = sorted(values)
    lists = [v if isinstance(v, list | tuple) else [v] for v in (values[k] for k in keys)]
    return [
        hparams_json({**defaults, **dict(zip(keys, combo))}) for combo in itertools.product(*lists)
    ]


def shown_hparams(hparams: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameters that differ from the method's defaults (sorted by name)."""
    return {
        k: hparams[k] for k in sorted(hparams) if k not in defaults or defaults[k] != hparams[k]
    }


def identity_recipe(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe's JSON form as identities hash it (the cell id, a tracker's configuration id):
    without the speed-only fields (:data:`SPEED_ONLY_RECIPE`), and without ``processes`` when
    it is 1. One process is how every cell ran before the field existed: leaving it out of the
    hash keeps their ids, so their records and new ones are the same cells. More processes
    change the numbers (per-process batch statistics): they are identity."""
    out = {k: v for k, v in recipe.items() if k not in SPEED_ONLY_RECIPE}
    if out.get("processes", 1) == 1:
        out.pop("processes", None)
    return out


@functools.lru_cache(maxsize=256)
def _plain_json(obj: Any) -> str:
    return json.dumps(jsonable(dataclasses.asdict(obj)))


def _plain(obj: Any) -> dict[str, Any]:
    """``jsonable(asdict(obj))``, a fresh copy, computed once per distinct (hashable) value:
    the cells of a suite share a few recipes."""
    try:
        return json.loads(_plain_json(obj))
    except TypeError:  # unhashable or not JSON: no cache
        return jsonable(dataclasses.asdict(obj))


@dataclass(frozen=True)
class Cell:
    """One resolved configuration: the unit of training, scheduling and result records.

    ``defaults`` (the method's hyper-parameter defaults when the cell was made) only shortens the
    human label; it is not part of the configuration or the id.

    Two fields carry what the suite's expansion decided, so that no later stage decides it again
    (neither is part of the configuration or the id):

    - ``typed_hparams``: the method's frozen hyper-parameter dataclass for ``hparams``, built
      once when the suite expands (a cell rebuilt from JSON in another process gets it once
      from :func:`harness.registry.resolved`); the validator, the loader's batch feeding, the
      model and the loss all read this object.
    - ``pretrain``: the suite's `single` cell whose trained model this cell converts
      (``pretrain_epochs: N``), which must be trained first; None when the cell converts
      nothing or starts from given weights. It travels in :meth:`to_json`.
    """

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
    defaults: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    typed_hparams: Any = field(default=None, compare=False, repr=False)
    pretrain: Cell | None = field(default=None, compare=False, repr=False)

    def config(self) -> dict[str, Any]:
        """The training-relevant configuration, every recipe field spelled out (``processes``
        included); the hash of its identity part (:meth:`identity_config`) is the cell id."""
        return {
            "dataset": self.dataset,
            "backbone": self.backbone,
            "backbone_kwargs": dict(sorted(self.backbone_kwargs.items())),
            "method": self.method,
            "M": self.M,
            "hparams": dict(sorted(self.hparams.items())),
            "seed": self.seed,
            "recipe": _plain(self.recipe),
        }

    def identity_config(self) -> dict[str, Any]:
        """:meth:`config` with its recipe as the cell id hashes it (:func:`identity_recipe`)."""
        config = self.config()
        config["recipe"] = identity_recipe(config["recipe"])
        return config

    @functools.cached_property  # a 10,000-cell plan asks for each id several times
    def cell_id(self) -> str:
        """16 hex digits of the SHA-256 of the canonical JSON of :meth:`identity_config`."""
        blob = json.dumps(self.identity_config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def shown_hparams(self) -> dict[str, Any]:
        """The hyper-parameters that differ from the method's defaults."""
        return shown_hparams(self.hparams, self.defaults)

    @functools.cached_property
    def label(self) -> str:
        """Short human-readable name: hyper-parameters at their defaults are left out."""
        return cell_label(self.config(), self.shown_hparams())

    def to_json(self) -> dict[str, Any]:
        """Everything needed to rebuild the cell in another process (Slurm tasks, workers)."""
        out = {
            "suite": self.suite,
            **self.config(),
            "evaluation": jsonable(dataclasses.asdict(self.evaluation)),
            "hparam_defaults": dict(sorted(self.defaults.items())),
        }
        if self.pretrain is not None:  # the decision travels; cells converting nothing omit it
            out["pretrain"] = self.pretrain.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], validated: bool = False) -> Cell:
        """Rebuild a cell from :meth:`to_json` (or a ``cell.json`` written before defaults were
        stored, or without every recipe field).

        Args:
            validated: ``data`` is :meth:`to_json` of a cell of a validated suite, handed to
                a worker process, a rank or a Slurm task by its executor: recipe and evaluation
                are rebuilt as they are, not validated again at every process boundary.
                Otherwise (a ``cell.json`` read back from disk) they go through the same
                validating builder as the YAML.

        Raises:
            ValueError: naming every invalid recipe or evaluation entry (``validated=False``).
        """
        if validated:
            recipe = _rebuilt(Recipe, data.get("recipe") or {})
            evaluation = _rebuilt(Evaluation, data.get("evaluation") or {})
        else:
            errors: list[str] = []
            recipe = build_dataclass(Recipe, data.get("recipe"), "recipe", errors)
            evaluation = build_dataclass(Evaluation, data.get("evaluation"), "evaluation", errors)
            if errors:
                raise ValueError("invalid cell JSON: " + "; ".join(errors))
        return cls(
            data["suite"],
            data["dataset"],
            data["backbone"],
            dict(data["backbone_kwargs"]),
            data["method"],
            data["M"],
            dict(data["hparams"]),
            data["seed"],
            recipe,
            evaluation,
            dict(data.get("hparam_defaults") or {}),
            pretrain=cls.from_json(data["pretrain"], validated) if data.get("pretrain") else None,
        )


def _rebuilt(cls: type, data: Mapping[str, Any]) -> Any:
    """A frozen dataclass from its JSON form, lists back to the tuples its fields hold."""
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def format_value(value: Any) -> str:
    """One hyper-parameter value for labels and tables (floats in their shortest exact form, so
    two different values never print the same)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str | int | bool):
        return str(value)
    return json.dumps(value, sort_keys=True)


def format_hparams(shown: Mapping[str, Any], sep: str = ", ") -> str:
    """``lam=0.1, tau=0.5``: sorted, order-independent, one-to-one for a given method."""
    return sep.join(f"{k}={format_value(shown[k])}" for k in sorted(shown))


def cell_label(config: Mapping[str, Any], shown: Mapping[str, Any]) -> str:
    """``dataset/backbone/method(M=4,tau=0.5)/seed0``: the label logs and records carry."""
    hp = format_hparams(shown, sep=",")
    return (
        f"{config.get('dataset')}/{config.get('backbone')}/{config.get('method')}"
        f"(M={config.get('M')}{',' + hp if hp else ''})/seed{config.get('seed')}"
    )


#: The prefix of an outside model's record id: a namespace no trained cell's id (16 hex digits)
#: can enter, so an evaluation from outside never writes into a trained cell's folder.
EXTERNAL_ID_PREFIX = "ext-"


@dataclass(frozen=True)
class ExternalCell(Cell):
    """The configuration a model trained outside the harness is evaluated under
    (:func:`harness.api.evaluate`).

    Its id is :data:`EXTERNAL_ID_PREFIX` and 12 hex digits of the SHA-256 of the identity
    configuration and the model's ``fingerprint`` (a hash of its weights): another model under
    the same name gets another id, and no id can equal a trained cell's.
    """

    fingerprint: str = ""

    @functools.cached_property
    def cell_id(self) -> str:
        """``ext-`` and 12 hex digits (see the class)."""
        config = {"cell": self.identity_config(), "fingerprint": self.fingerprint}
        blob = json.dumps(config, sort_keys=True, separators=(",", ":"))
        return EXTERNAL_ID_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:12]
