"""The benchmark's data for your own training loop: :func:`data` gives a dataset's train,
validation, calibration and test splits, a corrupted copy of its test set, or an OOD set, as the
harness feeds them to its cells (the same held-out images, normalisation, subsets and order).

    import harness.api as h

    train = h.data("digits", "train", validation=100)  # or suite="suites/smoke.yaml"
    x, y = train[0]                      # float32 (C, H, W) normalised, int64 ()
    for x, y in torch.utils.data.DataLoader(train, batch_size=64, shuffle=True): ...
    loader = train.loader(train=True, seed=0)   # the harness's own: its order and augmentation
    test = h.data("digits", "test"); x, y = test.tensors()   # (N, C, H, W), (N,)
    h.data("digits", "test", corruption="gaussian_noise", severity=3)
    h.data("digits", "digits_heldout")   # an OOD set, adapted to digits' input shape

The splits are carved by the code a cell's are (``harness.engine.build.dataset_splits``), the
OOD sets adapted and the corrupted copies made by the evaluation's (``ood_split``,
``corrupted_split``), and :meth:`BenchmarkData.loader` is the harness's loader with a cell's
options (``training_options``, ``evaluation_options``). Torch is imported here, so
``harness.api`` imports this module only when :func:`data` is first used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from harness.api._common import HarnessError, PathLike

if TYPE_CHECKING:
    from harness.contract import Recipe
    from harness.data._machinery.base import BatchLoader, DatasetSpec, Split

#: The splits of the dataset itself; any other ``split`` names an OOD set.
SPLITS = ("train", "val", "calibration", "test")


class BenchmarkData(Dataset):
    """One split of a benchmark dataset as the harness feeds it: a map-style torch ``Dataset``
    of ``(x, y)`` pairs in the split's order.

    ``x`` is what a harness model receives: for images float32 ``(C, H, W)`` at the dataset's
    input shape, scaled to [0, 1] and normalised with :attr:`mean` and :attr:`std` (per
    channel, the loader's arithmetic, so the values are the loader's to the bit); for a text
    dataset int64 token ids ``(L,)``. ``y`` is an int64 scalar tensor: the class in
    ``0 … num_classes − 1``, or ``-1`` for an OOD set's images (the task's classes do not
    apply to them). Nothing is augmented here: :meth:`loader` with ``train=True`` gives the
    harness's training batches (shuffled by seed and epoch, the dataset's augmentation).

    Attributes:
        dataset: the dataset's registered name (the task's: an OOD split is fed next to it).
        split: ``train``, ``val``, ``calibration``, ``test`` or the OOD set's name.
        corruption / severity: the corruption of the test set, or None.
        validation / calibration: the images held out as ``val`` and ``calibration`` when the
            splits were carved (``train`` is what is left of the training pool).
        num_classes: K, the task's classes.
        in_shape: ``(C, H, W)`` of an image input, ``(L,)`` of token ids.
        mean / std: the per-channel normalisation on the [0, 1] scale (empty for text).
        labels: int64 ``(N,)``.
        images: the raw uint8 images ``(N, C, H, W)`` of an in-memory image split, else None
            (files read on demand, token ids).
    """

    def __init__(
        self,
        data: Split,
        spec: DatasetSpec,
        recipe: Recipe,
        split: str,
        sizes: tuple[int, int],
        corruption: tuple[str, int] | None = None,
    ) -> None:
        from harness.data._machinery.base import ImageSet

        self._data, self._spec, self._recipe = data, spec, recipe
        self.dataset, self.split = spec.name, split
        self.corruption, self.severity = corruption if corruption else (None, None)
        self.validation, self.calibration = sizes
        self.num_classes = int(spec.num_classes or 0)
        self.in_shape = tuple(spec.in_shape)
        self.mean, self.std = tuple(spec.mean), tuple(spec.std)
        self.labels = data.labels
        self.images = data.images if isinstance(data, ImageSet) else None
        if self.images is not None:  # DeviceLoader.normalize's constants and arithmetic
            c = self.images.shape[1]
            self._shift = torch.tensor(self.mean).view(c, 1, 1) * 255
            self._scale = torch.tensor(self.std).view(c, 1, 1) * 255

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of row ``index`` (see the class docstring for shapes and dtypes)."""
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"index: {index!r}: pass an integer row number")
        n = len(self)
        i = index.__index__()
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for a split of {n} rows")
        i %= n
        if self.images is not None:
            return (self.images[i].float() - self._shift) / self._scale, self.labels[i]
        from harness.data._machinery.loader import make_loader
        from harness.engine.evaluate import evaluation_options

        one = self._data.subset(torch.tensor([i]))
        options = evaluation_options(self._recipe, self._spec, torch.device("cpu"), batch_size=1)
        x, y = next(iter(make_loader(one, options)))
        return x[0], y[0]

    def __repr__(self) -> str:
        shown = f"{self.corruption}@{self.severity}" if self.corruption else self.split
        return (f"BenchmarkData({self.dataset!r}, {shown!r}: {len(self)} rows, x "
                f"{'float32' if len(self.in_shape) == 3 else 'int64'} {self.in_shape}, "
                f"K={self.num_classes})")  # fmt: skip

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole split at once, as the evaluation batches it: ``x`` float32
        ``(N, C, H, W)`` normalised (int64 ``(N, L)`` for text) and ``y`` int64 ``(N,)``, on
        the CPU. A split of image files (ImageNet) is decoded whole: iterate :meth:`loader`
        there instead."""
        batches = list(self.loader())
        return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])

    def loader(
        self,
        batch_size: int | None = None,
        *,
        train: bool = False,
        seed: int = 0,
        device: str | torch.device = "cpu",
        streams: int = 1,
    ) -> BatchLoader:
        """The harness's own loader of this split: an iterable of ``(x, y)`` batches on
        ``device`` with ``len()`` (batches per epoch) and ``set_epoch(epoch)``.

        ``train=False`` (default): the evaluation's batches, in the split's order, no
        augmentation, ``batch_size`` default the recipe's ``eval_batch_size`` (512 without a
        suite). ``train=True``: a cell's training batches: shuffled by ``(seed, epoch)`` —
        call ``set_epoch(epoch)`` (from 0) before each epoch, as the harness does, for its
        order and augmentation draws — with the dataset's augmentation (or the suite's
        ``recipe.augment``), the last incomplete batch dropped when there are two full ones,
        ``batch_size`` default the recipe's (64 without a suite). ``streams = S > 1`` gives
        ``S`` independent batches per step, ``x (S, B, …)`` and ``y (S, B)``, as a deep
        ensemble's members are fed.

        Raises:
            HarnessError: an argument of the wrong type or out of range, or a device this
                machine does not have.
        """
        from harness.api.evaluate_checks import checked_device
        from harness.data._machinery.loader import make_loader
        from harness.engine.cell_setup import training_options
        from harness.engine.evaluate import evaluation_options

        problems = [
            *_whole("batch_size", batch_size, 1, allow_none=True),
            *_whole("seed", seed, 0),
            *_whole("streams", streams, 1),
        ]
        if not isinstance(train, bool):
            problems.append(f"train: {train!r}: pass True (training batches) or False")
        if problems:
            raise HarnessError(problems)
        where = checked_device(device, None)
        if not train:
            return make_loader(
                self._data, evaluation_options(self._recipe, self._spec, where, batch_size)
            )
        options = training_options(self._recipe, self._spec, len(self), where, seed, streams,
                                   batch_size=batch_size)  # fmt: skip
        try:
            return make_loader(self._data, options)
        except ValueError as exc:  # an augmentation the split cannot take (text)
            raise HarnessError([f"loader(train=True): {exc}"]) from None


def data(
    dataset: str | None = None,
    split: str = "train",
    *,
    suite: PathLike | None = None,
    overrides: Sequence[str] = (),
    validation: int | None = None,
    calibration: int | None = None,
    corruption: str | None = None,
    severity: int | None = None,
    data_root: PathLike | None = None,
) -> BenchmarkData:
    """One split of a benchmark dataset exactly as the harness feeds it to its cells.

    The splits: ``train`` (the training pool less the held-out images), ``val`` (``validation``
    images held out, stratified by class, seed 0 whatever the cell's seed: what a suite
    selects on), ``calibration`` (``calibration`` further images, from the dataset's spare
    images: what post-hoc calibration and conformal sets are fitted on), ``test``; the test set
    under ``corruption`` at ``severity`` (the corruption evaluation's copy, read from the
    published files or generated and cached under the data root as the evaluation does); or an
    OOD set by its registered name (its images adapted to the dataset's input shape, labels
    -1), as ``evaluation.ood`` lists them.

    Args:
        dataset: a registered dataset (``harness ls``); with ``suite``, needed only when the
            suite has several.
        split: ``train`` (default), ``val``, ``calibration``, ``test`` or an OOD set's name.
        suite: carve the splits as this suite's cells do: its ``recipe.validation`` and
            ``evaluation.calibration``, and its recipe's batch sizes and augmentation for
            :meth:`BenchmarkData.loader` (the suite-wide recipe: a method's own recipe
            deltas are not applied).
        overrides: ``KEY=VALUE`` overrides of the suite (``"recipe.validation=200"``).
        validation: without a suite: the images held out as ``val`` (default 0: none, the
            whole pool trains).
        calibration: without a suite: the images held out as ``calibration`` (default 0;
            only a dataset with spare images has them, e.g. ``digits_hard``).
        corruption: a corruption of the dataset's set (``gaussian_noise``), with
            ``split="test"``.
        severity: its severity, 1–5.
        data_root: where the data lives (default: ``$HARNESS_DATA_ROOT``, else the user cache).

    Returns:
        :class:`BenchmarkData`: a torch ``Dataset`` of ``(x float32 (C, H, W), y int64)``
        (token ids ``(L,)`` for text), with ``tensors()`` (the whole split) and ``loader()``
        (the harness's batches, for evaluation or training).

    Raises:
        HarnessError: before any data is read or written, one line per mistake naming the
            argument, its value and what to do: a wrong type, an unknown dataset, split, OOD
            set or corruption, a split the sizes do not hold out, sizes out of range, sizes
            given with a suite, a suite that does not load or lacks the dataset, data missing
            on this machine (naming the command that fetches it), a data root that is a file.
    """
    # Length: two thirds of it is the docstring (the API's reference); the body is the order
    # of the checks, every one before the first file is read.
    from harness.contract import Recipe
    from harness.data._machinery.base import DataMissingError, default_data_root
    from harness.engine.build import dataset_splits
    from harness.engine.evaluate import ood_split

    problems = _argument_problems(dataset, split, suite, overrides, validation, calibration,
                                  corruption, severity, data_root)  # fmt: skip
    if problems:
        raise HarnessError(problems)
    recipe, sizes, names = (
        Recipe(),
        (validation or 0, calibration or 0),
        ("validation", "calibration"),
    )
    if suite is not None:
        from harness.api.models import _load_suite

        loaded = _load_suite(suite, overrides)
        dataset = _suite_dataset(loaded, suite, dataset)
        recipe = loaded.recipe
        sizes = (recipe.validation, loaded.evaluation.calibration)
        names = ("recipe.validation", "evaluation.calibration")
    root = default_data_root(Path(data_root) if data_root else None)
    spec = _dataset_spec(str(dataset))
    problems = [*_size_problems(spec, sizes, names), *_split_problems(spec, split, sizes, names)]
    if corruption is not None and not problems:
        problems += _corruption_problems(spec, split, corruption, severity, root)
    if problems:
        raise HarnessError(problems)
    _require(spec, split, root)
    try:
        spec, splits = dataset_splits(spec.name, root, *sizes)
        if corruption is not None:
            from harness.data._machinery.corruptions import corrupted_split

            part = corrupted_split(spec.name, root, splits["test"], corruption, int(severity))
        else:
            part = splits[split] if split in SPLITS else ood_split(split, spec, root)
    except ValueError as exc:  # validation larger than a pool without spare images
        raise HarnessError([f"{names[0]}={sizes[0]}: {exc}"]) from None
    except DataMissingError as exc:  # a damaged file: as good as missing
        raise HarnessError([str(exc)]) from None
    shifted = (corruption, int(severity)) if corruption is not None else None
    return BenchmarkData(part, spec, recipe, split, sizes, shifted)


def _whole(name: str, value: Any, low: int, *, allow_none: bool = False) -> list[str]:
    """The line for ``name`` unless ``value`` is a whole number ≥ ``low`` (or None, allowed)."""
    if value is None and allow_none:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return [f"{name}: {value!r}: pass a whole number >= {low}"]
    return []


def _argument_problems(
    dataset: Any,
    split: Any,
    suite: Any,
    overrides: Any,
    validation: Any,
    calibration: Any,
    corruption: Any,
    severity: Any,
    data_root: Any,
) -> list[str]:
    """One line per argument of :func:`data` whose type or combination is wrong (no file is
    read)."""
    out = []
    if dataset is not None and not isinstance(dataset, str):
        out.append(f"dataset: {dataset!r} is not a dataset name (a string, e.g. 'digits')")
    if not isinstance(split, str):
        out.append(f"split: {split!r}: pass one of {', '.join(SPLITS)} or an OOD set's name")
    if isinstance(overrides, str) or not (
        isinstance(overrides, Sequence) and all(isinstance(o, str) for o in overrides)
    ):
        out.append(f"overrides: {overrides!r}: pass a list of 'KEY=VALUE' strings")
    elif overrides and suite is None:
        out.append(f"overrides: {list(overrides)} apply to a suite; pass suite= as well, or "
                   "validation= and calibration= without one")  # fmt: skip
    if suite is None and dataset is None:
        out.append("dataset: pass a registered dataset (dataset='digits') or suite=")
    for name, value in (("validation", validation), ("calibration", calibration)):
        out += _whole(name, value, 0, allow_none=True)
        if value is not None and suite is not None:
            key = "recipe.validation" if name == "validation" else "evaluation.calibration"
            out.append(f"{name}={value!r}: the suite sets {key}; pass "
                       f"overrides=['{key}={value}'] to change it, or leave suite out")  # fmt: skip
    if corruption is not None and not isinstance(corruption, str):
        out.append(f"corruption: {corruption!r}: pass a corruption's name (e.g. "
                   "'gaussian_noise')")  # fmt: skip
    if severity is not None and corruption is None:
        out.append(f"severity={severity!r}: only with corruption=; pass both, or neither")
    elif corruption is not None and (
        isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5
    ):
        out.append(f"severity: {severity!r}: pass 1, 2, 3, 4 or 5 with corruption=")
    if data_root is not None and Path(data_root).exists() and not Path(data_root).is_dir():
        out.append(f"data_root: {data_root} is a file, not a folder")
    return out


def _suite_dataset(loaded: Any, suite: PathLike, dataset: str | None) -> str:
    """The dataset of the suite's cells that ``data`` reads: ``dataset`` when the suite has
    it, else its only one."""
    datasets = list(loaded.grid.datasets)
    if dataset is None and len(datasets) == 1:
        return datasets[0]
    if dataset is None:
        raise HarnessError([f"dataset: the suite {suite} has datasets {datasets}; pass "
                            "dataset= one of them"])  # fmt: skip
    if dataset not in datasets:
        raise HarnessError([f"dataset: {dataset!r} is not one of the suite's datasets "
                            f"{datasets}; pass one of them, or leave suite out"])  # fmt: skip
    return dataset


def _dataset_spec(dataset: str) -> DatasetSpec:
    """The registered in-distribution dataset ``dataset`` (an unknown name or an OOD-only set
    is one line naming the choices)."""
    from harness.registry import DATASETS
    from harness.registry.core import RegistryError

    try:
        spec = DATASETS.get(dataset)
    except RegistryError as exc:
        raise HarnessError([f"dataset: {exc}"]) from None
    if spec.num_classes is None:
        raise HarnessError([f"dataset: {dataset!r} is an OOD set (it has no classes to train "
                            f"on); pass the dataset it is evaluated next to, with "
                            f"split={dataset!r}"])  # fmt: skip
    return spec


def _size_problems(spec: DatasetSpec, sizes: tuple[int, int], names: tuple[str, str]) -> list[str]:
    """What the declared spare images say about the held-out sizes (a pool's own size is
    known only once it is read: :func:`data` names it then)."""
    (validation, calibration), spare = sizes, spec.spare_images
    out = []
    if calibration and not spare:
        out.append(f"{names[1]}={calibration}: {spec.name!r} has no spare images (it trains on "
                   f"every training image); pass 0, and hold out {names[0]} images "
                   "instead")  # fmt: skip
    elif spare and validation >= spare:
        out.append(f"{names[0]}={validation}: {spec.name!r} holds validation images out of its "
                   f"{spare} spare images; pass 0 to {spare - 1}")  # fmt: skip
    elif spare and calibration > spare - validation:
        out.append(f"{names[1]}={calibration}: {spec.name!r} has {spare - validation} spare "
                   f"images left after {names[0]}={validation}; pass 0 to "
                   f"{spare - validation}")  # fmt: skip
    return out


def _split_problems(
    spec: DatasetSpec, split: str, sizes: tuple[int, int], names: tuple[str, str]
) -> list[str]:
    """``split`` is one of :data:`SPLITS` the sizes hold out, or a registered set."""
    from harness.registry import DATASETS
    from harness.registry.core import RegistryError

    for held, size, name, hint in (("val", sizes[0], names[0], "validation"),
                                   ("calibration", sizes[1], names[1], "calibration")):  # fmt: skip
        if split == held and not size:
            how = f"pass {hint}=N" if "." not in name else f"pass overrides=['{name}=N']"
            return [f"split {split!r}: no {hint} images are held out ({name}: 0); {how} "
                    f"(N > 0) to hold some out"]  # fmt: skip
    if split in SPLITS:
        return []
    try:
        DATASETS.get(split)
    except RegistryError as exc:
        return [f"split {split!r}: not one of {', '.join(SPLITS)}, nor an OOD set ({exc})"]
    return []


def _corruption_problems(
    spec: DatasetSpec, split: str, corruption: str, severity: Any, root: Path
) -> list[str]:
    """``corruption`` is one corruption of the dataset's set that this machine can produce,
    of the test set."""
    from harness.data._machinery.corruption_sets import ALL, check_corruptions, corruption_set

    if split != "test":
        return [f"corruption={corruption!r}: corruptions are of the test set; pass "
                f"split='test' (got {split!r})"]  # fmt: skip
    if corruption == ALL:
        choices = ", ".join(corruption_set(spec.name).benchmark)
        return [f"corruption='all': name one corruption (of {spec.name!r}: {choices})"]
    return [f"corruption: {line}" for line in check_corruptions(spec.name, [corruption], root)]


def _require(spec: DatasetSpec, split: str, root: Path) -> None:
    """The dataset and the OOD set ``split`` names are on this machine (one line each, naming
    the command that fetches it)."""
    from harness.data._machinery.base import DataMissingError
    from harness.registry import DATASETS

    names: Iterable[tuple[str, str]] = [("dataset", spec.name)]
    if split not in SPLITS:
        names = [*names, ("split", split)]
    problems = []
    for arg, name in names:
        try:
            DATASETS.get(name).require(root)
        except DataMissingError as exc:
            problems.append(f"{arg}: {exc}")
    if problems:
        raise HarnessError(problems)
