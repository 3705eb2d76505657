"""The arguments of :func:`harness.api.evaluate`, checked before any data is read and before the
model sees a batch: each mistake is one line naming the argument, its value and what to do,
all of them raised together as one :class:`~harness.api.HarnessError`.

What can only be seen on the model's outputs (NaN, probabilities passed as logits, a wrong
input size) is checked on the first test batch, before the evaluation proper and before anything
is written (:class:`harness.engine.external.ExternalEnsemble`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.api._common import HarnessError

if TYPE_CHECKING:
    import torch

    from harness.contract import Cell

#: The recipe fields that matter to evaluating a model trained elsewhere (the held-out split
#: post-hoc calibration fits on, the evaluation batch, precision and memory layout).
EVAL_RECIPE = ("validation", "eval_batch_size", "amp", "channels_last")

#: What a model may return (``outputs=``): logits (softmax gives the probabilities) or the
#: probabilities themselves.
OUTPUTS = ("logits", "probs")


def argument_problems(
    model: Any,
    dataset: Any,
    overrides: Any,
    name: Any,
    backbone: Any,
    results: Any,
    evaluation: Any,
    recipe: Any,
    seed: Any,
    outputs: Any,
    data_root: Any,
) -> list[str]:
    """One line per argument of :func:`harness.api.evaluate` whose type or value is wrong."""
    out = []
    if not callable(model):
        out.append(f"model: a {type(model).__name__} is not callable; pass an nn.Module or a "
                   "function from a batch (B, C, H, W) to logits")  # fmt: skip
    if dataset is not None and not isinstance(dataset, str):
        out.append(f"dataset: {dataset!r} is not a dataset name (a string)")
    if isinstance(overrides, str) or not (
        isinstance(overrides, Sequence) and all(isinstance(o, str) for o in overrides)
    ):
        out.append(f"overrides: {overrides!r}: pass a list of 'KEY=VALUE' strings")
    for arg, value in (("name", name), ("backbone", backbone)):
        if (not isinstance(value, str) or not value.strip() or value != value.strip()
                or any(c in value for c in "/\\\n")):  # fmt: skip
            out.append(f"{arg}: {value!r}: pass a non-empty string without '/' or surrounding "
                       "spaces (it names the record's row on the page)")  # fmt: skip
    for arg, value in (("evaluation", evaluation), ("recipe", recipe)):
        if value is not None and not isinstance(value, Mapping):
            out.append(f"{arg}: {value!r}: pass a mapping of fields ({{'ood': [...]}})")
    if isinstance(recipe, Mapping) and (training := sorted(set(recipe) - set(EVAL_RECIPE))):
        out.append(f"recipe: {training} do not apply to a model trained elsewhere (nothing is "
                   f"trained here); the fields evaluation reads: {list(EVAL_RECIPE)}")  # fmt: skip
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        out.append(f"seed: {seed!r}: pass an integer >= 0")
    if outputs not in OUTPUTS:
        out.append(f"outputs: {outputs!r} is not one of {list(OUTPUTS)}: say whether the model "
                   "returns logits (the default) or probabilities")  # fmt: skip
    for arg, value in (("results", results), ("data_root", data_root)):
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            out.append(f"{arg}: {value} is a file, not a folder")
    if results is not None and (Path(results) / "suite.json").is_file():
        out.append(f"results: {results} is a suite's results folder (it holds suite.json); pass "
                   f"the results root above it ({Path(results).parent}): the record goes to "
                   "<results>/<suite name>")  # fmt: skip
    return out


def checked_device(device: Any, model: Any) -> torch.device:
    """The device the evaluation runs on (``device``, else where the model's parameters are),
    refused when torch does not know it, this machine does not have it, or the model's
    parameters are elsewhere or on the meta device (no values to evaluate)."""
    import torch

    tensors = _tensors_of(model)
    if any(t.device.type == "meta" for t in tensors):
        raise HarnessError(["model: its parameters are on the meta device (shapes without "
                            "values): load its weights first (load_state_dict(..., "
                            "assign=True), or to_empty() and then load)"])  # fmt: skip
    try:
        where = torch.device(device) if device is not None else _where(tensors)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise HarnessError([f"device: {device!r} is not a device ({exc}); pass 'cpu', 'cuda' "
                            "or 'cuda:N'"]) from None  # fmt: skip
    if where.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (where.index or 0) >= count:
            also = " or 'cuda:0'" if count else ""
            raise HarnessError(
                [f"device: {device!r}: this machine has {count} CUDA GPU(s); pass 'cpu'{also}"]
            )
    elif where.type == "mps" and not torch.backends.mps.is_available():
        raise HarnessError([f"device: {device!r}: MPS is not available here; pass 'cpu'"])
    elif where.type not in ("cpu", "cuda", "mps"):
        raise HarnessError([f"device: {device!r}: evaluation runs on 'cpu', 'cuda' or 'mps'"])
    elsewhere = sorted({str(t.device) for t in tensors if not _same(t.device, where)})
    if elsewhere:
        raise HarnessError([f"device: {str(where)!r}, but the model's parameters are on "
                            f"{', '.join(elsewhere)}: move the model (model.to({str(where)!r})) "
                            "or pass the device it is on"])  # fmt: skip
    return where


def _tensors_of(model: Any) -> list[torch.Tensor]:
    """The parameters and buffers of a module (none for a plain callable)."""
    params, buffers = getattr(model, "parameters", None), getattr(model, "buffers", None)
    if not (callable(params) and callable(buffers)):
        return []
    return [*params(), *buffers()]


def _where(tensors: list[torch.Tensor]) -> torch.device:
    """Where a module's first parameter is; the CPU for a callable or an empty module."""
    import torch

    return tensors[0].device if tensors else torch.device("cpu")


def _same(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one (``cuda`` is ``cuda:0``)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def model_fingerprint(model: Any) -> str:
    """16 hex digits naming a model's weights: the SHA-256 of its class and its state dict
    (names, dtypes, shapes and bytes), or, for a plain callable, of its qualified name and the
    tensors it closes over. Part of an outside model's record id (another model under the same
    name gets another id)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    kind = type(model)
    digest.update(f"{kind.__module__}.{kind.__qualname__}".encode())
    if isinstance(model, torch.nn.Module):
        named = list(model.state_dict().items())
    else:
        fn = getattr(model, "__func__", model)
        digest.update(str(getattr(fn, "__qualname__", "")).encode())
        cells = getattr(fn, "__closure__", None) or ()
        named = [(str(i), c.cell_contents) for i, c in enumerate(cells)
                 if isinstance(getattr(c, "cell_contents", None), torch.Tensor)]  # fmt: skip
    for key, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            continue
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        # Bytes of any dtype (bfloat16 has no NumPy type): flattened, then read as bytes.
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def colliding_records(
    suite_dir: Path, cell: Cell, suite_methods: Sequence[tuple[str, str]], overwrite: bool
) -> list[Path]:
    """The folders of outside-model records the new one replaces (with ``overwrite``).

    A record of the same name, dataset, backbone and seed would be one row twice on the page;
    a name that is a trained method of the same dataset and backbone (a record, or one of the
    suite's ``(method, backbone)`` pairs) would be pooled with that method's seeds. The first
    is refused unless ``overwrite`` (the old files are then set aside, never deleted), the
    second always.

    Raises:
        HarnessError: naming every collision.
    """
    problems, replaced = [], []
    fold = str.casefold
    suite_method = (fold(cell.method), cell.backbone) in {(fold(m), b) for m, b in suite_methods}
    if suite_method:
        problems.append(_trained(cell, f"the suite's method on backbone {cell.backbone!r}"))
    for path in sorted(Path(suite_dir).glob("*/record.json")) if suite_dir.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
            config, external = rec["config"], (rec.get("diagnostics") or {}).get("external")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged record is not this one's to judge (`harness status` names it)
        same = (config.get("dataset"), config.get("backbone"), fold(str(config.get("method"))))
        if same != (cell.dataset, cell.backbone, fold(cell.method)):
            continue  # names that differ in case only are one row to a reader: compared folded
        if not external:
            if not suite_method:  # said once, as the suite's method
                problems.append(_trained(cell, f"the trained cell {path.parent}"))
        elif config.get("seed") == cell.seed and not overwrite:
            problems.append(
                f"name: {path.parent} already holds an outside model evaluated as "
                f"{cell.method!r} ({cell.dataset}, {cell.backbone}, seed {cell.seed}): pass "
                "overwrite=True to set its record aside (renamed, never deleted) or another name="
            )
        elif config.get("seed") == cell.seed:
            replaced.append(path.parent)
    if problems:
        raise HarnessError(list(dict.fromkeys(problems)))
    return replaced


def _trained(cell: Cell, what: str) -> str:
    return (
        f"name: {cell.method!r} on {cell.dataset}/{cell.backbone} is {what}: an outside model "
        "never writes into, or pools with, a trained method's cells; pass another name= (or "
        "backbone='external')"
    )
