"""``pretrained:`` by name: timm and torchvision weights, read from those libraries' own caches.

A method's ``pretrained`` hparam takes one of

- ``timm:<model>[.<tag>]`` (e.g. ``timm:vit_small_patch16_224.augreg_in21k``): timm's pretrained
  config names the Hugging Face Hub repository and file; the file is looked up in the Hub cache
  (``$HF_HUB_CACHE``, by default ``$HF_HOME/hub`` = ``~/.cache/huggingface/hub``, layout
  ``models--<org>--<repo>/refs/main`` + ``snapshots/<commit>/model.safetensors`` or
  ``pytorch_model.bin``) with ``huggingface_hub.try_to_load_from_cache``, loaded safely, and
  passed through ``timm.create_model(..., pretrained=True)`` so timm applies its own key
  mapping (its ``filter_fn``) exactly as for a download;
- ``torchvision:<Enum>.<VALUE>`` (e.g. ``torchvision:ResNet18_Weights.IMAGENET1K_V1``):
  ``torchvision.models.get_weight`` and ``weights.get_state_dict`` read
  ``$TORCH_HOME/hub/checkpoints/<file>`` (``~/.cache/torch/hub/checkpoints``);
- anything else: a path to a weights file (:func:`harness.engine.build.load_backbone_state`).

Runs never download (a Slurm node is often offline, and a run must not depend on the network):
a missing file is a one-line :class:`WeightsError` naming where it was looked for and the
command that fetches it, ``harness data download timm:<name>`` / ``torchvision:<name>``
(:func:`fetch_named`, run on a machine with internet, through the libraries' own downloaders).
Every load is ``weights_only=True`` or safetensors: nothing in a weights file can run code.

The published state dict is fitted to the harness backbone the cell builds
(:func:`fit_to_backbone`), as is a weights file given by path: key sets must match and at least
one tensor must have the backbone's shape; tensors whose shape differs (a classifier for another
number of classes, a stem for another number of input channels) keep the backbone's own seeded
initialisation, and the log says which. ``harness validate`` checks a file's fit on the ``meta``
device (:func:`file_fit_problem`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

TIMM, TORCHVISION = "timm", "torchvision"
PREFIXES = (TIMM, TORCHVISION)


class WeightsError(ValueError):
    """Named weights that are unknown, not in the cache, or do not fit the backbone (one line)."""


def parse_pretrained(value: str) -> tuple[str, str]:
    """Split a ``pretrained:`` value into (source, name).

    Returns:
        ``("timm", name)``, ``("torchvision", name)`` or ``("path", value)``.

    Raises:
        WeightsError: a library prefix with no name after it.
    """
    for prefix in PREFIXES:
        if value.startswith(prefix + ":"):
            name = value[len(prefix) + 1 :].strip()
            if not name:
                example = (
                    "timm:vit_small_patch16_224.augreg_in21k"
                    if prefix == TIMM
                    else "torchvision:ResNet18_Weights.IMAGENET1K_V1"
                )
                raise WeightsError(f"pretrained: {value!r} names no weights (e.g. {example})")
            return prefix, name
    return "path", value


def is_named(value: object) -> bool:
    """Whether a ``pretrained:`` value names library weights rather than a file."""
    return isinstance(value, str) and value.split(":", 1)[0] in PREFIXES and ":" in value


def _fetch_hint(value: str) -> str:
    return (
        f"fetch them with `harness data download {value}` on a machine with internet and copy "
        "the cache folder here"
    )


# --------------------------------------------------------------------------------------------
# timm (Hugging Face Hub cache)


def _timm_source(name: str) -> tuple[str, str | None, list[str]]:
    """(Hub repo id, revision, file names in timm's order of preference) of timm weights."""
    import timm
    from timm.models._hub import _get_safe_alternatives, hf_split

    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None:
        raise WeightsError(
            f"pretrained: timm:{name}: timm {timm.__version__} has no such pretrained weights "
            f"(list them with python -c \"import timm; print(timm.list_pretrained('{name}*'))\")"
        )
    if not cfg.hf_hub_id:
        raise WeightsError(
            f"pretrained: timm:{name}: timm serves these weights from {cfg.url}, not the Hugging "
            "Face Hub; download the file and give its path instead"
        )
    repo, revision = hf_split(cfg.hf_hub_id)
    filename = cfg.hf_hub_filename or "pytorch_model.bin"  # timm's HF_WEIGHTS_NAME default
    return repo, revision, [*_get_safe_alternatives(filename), filename]


def timm_cached_file(name: str) -> Path:
    """The cached weights file of timm weights ``name`` (safetensors preferred, as timm does).

    Raises:
        WeightsError: unknown name, or no file in the Hub cache (names where it looked).
    """
    from huggingface_hub import constants, try_to_load_from_cache

    repo, revision, files = _timm_source(name)
    for filename in files:
        found = try_to_load_from_cache(repo, filename, revision=revision)
        if isinstance(found, str):
            return Path(found)
    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    raise WeightsError(
        f"pretrained: timm:{name} is not in the Hugging Face cache: looked for "
        f"{folder}/snapshots/<refs/{revision or 'main'}>/{' or '.join(files)} "
        f"($HF_HUB_CACHE / $HF_HOME); {_fetch_hint(f'timm:{name}')}"
    )


def _read_state(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    from harness.storage.checkpoint import load_weights  # weights_only=True; pickles are refused

    return load_weights(path, map_location="cpu")


def load_timm(name: str) -> dict[str, Tensor]:
    """State dict of timm pretrained weights from the Hub cache, mapped by timm's own loader."""
    import timm

    state = _read_state(timm_cached_file(name))
    # source="" makes timm take the given state dict (its highest-priority source) and run its
    # usual filter_fn / load path on it, with the model's published classifier.
    overlay = {"source": "", "state_dict": state}
    with torch.random.fork_rng(devices=[]):  # building draws an init; leave the caller's RNG
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------
# torchvision ($TORCH_HOME/hub/checkpoints)


def _torchvision_weights(name: str):
    from torchvision.models import get_weight

    try:
        return get_weight(name)
    except (ValueError, KeyError, AttributeError):
        raise WeightsError(
            f"pretrained: torchvision:{name}: no such torchvision weights (give "
            "<Enum>.<VALUE>, e.g. ResNet18_Weights.IMAGENET1K_V1; list them with "
            "torchvision.models.get_model_weights('resnet18'))"
        ) from None


def torchvision_cached_file(name: str) -> Path:
    """Where torchvision keeps weights ``name``: ``<torch.hub.get_dir()>/checkpoints/<file>``."""
    from urllib.parse import urlparse

    weights = _torchvision_weights(name)
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name


def _require_torchvision_file(name: str) -> Path:
    path = torchvision_cached_file(name)
    if not path.is_file():
        raise WeightsError(
            f"pretrained: torchvision:{name} is not in the torch hub cache: looked for {path} "
            f"($TORCH_HOME); {_fetch_hint(f'torchvision:{name}')}"
        )
    return path


def load_torchvision(name: str) -> dict[str, Tensor]:
    """State dict of torchvision weights from the torch hub cache (never downloads)."""
    _require_torchvision_file(name)
    # The library's own loader: it reads the cached file (present, so nothing is fetched).
    return _torchvision_weights(name).get_state_dict(progress=False, weights_only=True)


# --------------------------------------------------------------------------------------------
# Entry points


def load_named(value: str) -> dict[str, Tensor]:
    """State dict of ``timm:<name>`` or ``torchvision:<name>`` weights, as the library publishes
    it (its classifier included). Raises :class:`WeightsError` (one line)."""
    source, name = parse_pretrained(value)
    if source == TIMM:
        return load_timm(name)
    if source == TORCHVISION:
        return load_torchvision(name)
    raise WeightsError(f"pretrained: {value!r} is a path, not timm:<name> or torchvision:<name>")


def named_problem(value: str) -> str | None:
    """What stops named weights from loading on this machine (None when they will load): a bad
    name or a file missing from the cache. For ``harness validate``; reads no weights."""
    try:
        source, name = parse_pretrained(value)
        if source == TIMM:
            timm_cached_file(name)
        elif source == TORCHVISION:
            _require_torchvision_file(name)
    except WeightsError as err:
        return str(err)
    return None


def fit_problem(state: Mapping[str, Tensor], target: Mapping[str, Tensor], what: str) -> str | None:
    """Why ``state`` cannot initialise a backbone whose own state is ``target`` (None when it
    can): other tensor names (another architecture), or not one tensor of the backbone's shape
    (the same names at another width). Reads only names and shapes, so both may be on the
    ``meta`` device (``harness validate``)."""
    missing = [k for k in target if k not in state]
    unexpected = [k for k in state if k not in target]
    if missing or unexpected:
        return (
            f"pretrained: {what} does not fit the backbone: {len(missing)} of its tensors are "
            f"missing (first: {missing[:3]}) and {len(unexpected)} are extra (first: "
            f"{unexpected[:3]}); pick weights of the same architecture"
        )
    # Scalars (BatchNorm's num_batches_tracked) fit any backbone: they do not count as a fit.
    shaped = [k for k in target if target[k].dim() > 0]
    if shaped and all(state[k].shape != target[k].shape for k in shaped):
        first = shaped[0]
        return (
            f"pretrained: {what} does not fit the backbone: none of its {len(shaped)} tensors "
            f"has the backbone's shape (first: {first} {tuple(state[first].shape)} vs "
            f"{tuple(target[first].shape)}); pick weights of the same architecture and width"
        )
    return None


def backbone_file_state(path: str | Path, map_location: str = "cpu") -> dict[str, Tensor]:
    """A plain backbone's state dict from a weights file: a harness ``final.pt``/``checkpoint.pt``
    of a `single` cell (keys prefixed ``net.``, or under ``model``), a ``{"state_dict": ...}``
    file, or any state dict. Loaded without running code from the file: one that needs full
    unpickling raises ``UnsafeWeightsError``; a damaged one ``DamagedFile``."""
    from harness.storage.checkpoint import load_weights

    state = load_weights(path, map_location=map_location)
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if state and all(k.startswith("net.") for k in state):
        state = {k[len("net.") :]: v for k, v in state.items()}
    return state


def file_fit_problem(path: str | Path, build: Callable[[], nn.Module]) -> str | None:
    """What :func:`fit_to_backbone` would refuse in the weights file ``path`` for the backbone
    ``build`` makes, found on the ``meta`` device (names and shapes: no tensor data read, no
    memory); None when it fits or when the backbone cannot be built there (the cell will say)."""
    from harness.contract.errors import DamagedFile
    from harness.storage.checkpoint import UnsafeWeightsError

    try:
        state = backbone_file_state(path, map_location="meta")
    except (DamagedFile, UnsafeWeightsError) as exc:
        return f"pretrained: {exc}"
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        return f"pretrained: {path} does not hold a state dict (names → tensors)"
    try:
        with torch.device("meta"):
            target = build().state_dict()
    except Exception:  # a builder that needs real tensors: the cell checks when it runs
        return None
    return fit_problem(state, target, str(path))


def fit_to_backbone(
    state: dict[str, Tensor], build: Callable[[], nn.Module], seed: int, what: str
) -> dict[str, Tensor]:
    """Fit a published state dict to the harness backbone a cell builds.

    Args:
        state: the library's state dict.
        build: builds the cell's plain backbone (``BackboneSpec.build`` with its arguments).
        seed: the cell's seed: tensors kept from the backbone's own initialisation are the same
            in every run (the caller's random state is left untouched).
        what: the ``pretrained:`` value, for messages.

    Returns:
        ``state`` with the backbone's own tensors where shapes differ (e.g. the classifier of a
        1000-class model on a 100-class task), logged.

    Raises:
        WeightsError: the key sets differ, or no tensor has the backbone's shape (weights of
            another architecture).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = build().state_dict()
    if problem := fit_problem(state, target, what):
        raise WeightsError(problem)
    reshaped = [k for k in target if state[k].shape != target[k].shape]
    if reshaped:
        log.warning(
            "pretrained %s: kept the backbone's own initialisation for %s (shapes differ)",
            what,
            ", ".join(reshaped),
        )
    return {k: (target[k] if k in reshaped else state[k]) for k in target}


def fetch_named(value: str) -> Path:
    """Download named weights into the library's cache through the library itself (timm via the
    Hugging Face Hub, torchvision via ``torch.hub`` with its hash check), with its progress bar.
    For ``harness data download timm:<name>`` on a machine with internet.

    Returns:
        The cached file a run will read.
    """
    source, name = parse_pretrained(value)
    if source == TIMM:
        import timm

        _timm_source(name)  # a clear error for an unknown name before any network access
        with torch.random.fork_rng(devices=[]):
            timm.create_model(name, pretrained=True)
        return timm_cached_file(name)
    if source == TORCHVISION:
        weights = _torchvision_weights(name)
        weights.get_state_dict(progress=True, check_hash=True, weights_only=True)
        return _require_torchvision_file(name)
    raise WeightsError(f"{value!r} is not timm:<name> or torchvision:<name>")


def download_named(value: str) -> Path:
    """:func:`fetch_named` for ``harness data download``: every failure one
    :class:`harness.data._machinery.download.DownloadError` line (the data downloads' error), so the
    command treats weights and datasets alike."""
    from harness.data._machinery.download import DownloadError, one_line

    try:
        return fetch_named(value)
    except WeightsError as err:  # an unknown name: already one line, nothing to retry
        raise DownloadError(str(err)) from None
    except Exception as err:  # the hub's and torch.hub's HTTP errors share no base class
        raise DownloadError(
            f"could not download {value} into the library's cache: {one_line(err)}. This "
            f"machine may have no internet access: run `harness data download {value}` on one "
            "that has, then copy its cache ($HF_HOME/hub for timm, $TORCH_HOME/hub/checkpoints "
            "for torchvision) here."
        ) from None


def backbone_state(value: str, cell, spec) -> dict[str, Tensor]:
    """Named weights or a weights file fitted to a cell's plain backbone (the one a conversion
    method builds): tensors of another shape keep the seeded initialisation (logged); other
    names, or no tensor that fits, raise :class:`WeightsError` (one line, naming ``value``).

    Args:
        value: ``timm:<name>``, ``torchvision:<name>`` or a path.
        cell: the :class:`harness.contract.Cell` (backbone, its options, seed).
        spec: the cell's :class:`harness.data._machinery.base.DatasetSpec` (input shape, classes).
    """
    from harness.registry import BACKBONES

    bspec = BACKBONES.get(cell.backbone)
    kwargs = dict(cell.backbone_kwargs)
    return fit_to_backbone(
        load_named(value) if is_named(value) else backbone_file_state(value),
        lambda: bspec.build(spec.in_shape, spec.num_classes, **kwargs),
        cell.seed,
        value,
    )
