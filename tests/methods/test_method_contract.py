"""The method contract, parametrized over the registry (a new method module is tested here with
no new test code): declared batch feeding is what members really receive, every row's target
belongs to an image that row was computed from, and training accuracy is finite and correct.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import pytest
import torch
from torch import nn

from harness.config.suite import expand_hparams
from harness.contract.config import Recipe
from harness.engine.train import ensemble_loss, make_optimizer, make_scheduler, train_epoch
from harness.registry import METHODS
from methods._base import BatchFeeding, BuildContext, EnsembleModel

IN_SHAPE, K, B = (1, 8, 8), 8, 8  # the digits CNN; K = B so every image has its own label
WIDTH = {"width": 16}  # narrow (CPU time), still >= 10 channels as Masksembles' masks need


def feeding_variants(name: str) -> list[dict[str, Any]]:
    """The default hyper-parameters, plus every other value of a Literal or bool
    hyper-parameter that changes the declared feeding (``batch: split``,
    ``independent_data: false``, ...): read from the method's dataclass, not listed here."""
    spec = METHODS.get(name)
    defaults = expand_hparams(spec, {})[0]
    base = spec.feeding_for(defaults)
    hints = typing.get_type_hints(spec.hparams)
    out: list[dict[str, Any]] = [{}]
    for f in dataclasses.fields(spec.hparams):
        tp = hints[f.name]
        choices = typing.get_args(tp) if typing.get_origin(tp) is Literal else ()
        choices = (True, False) if tp is bool else choices
        for value in choices:
            if (
                value != defaults.get(f.name)
                and spec.feeding_for({**defaults, f.name: value}) != base
            ):
                out.append({f.name: value})
    return out


def _members(spec) -> tuple[int, ...]:
    return tuple(m for m in (2, 4) if spec.max_members is None or m <= spec.max_members) or (1,)


CASES = [
    pytest.param(
        name, hp, m, id=f"{name}-M{m}-" + ("-".join(f"{k}={v}" for k, v in hp.items()) or "default")
    )
    for name in METHODS.names()
    for hp in feeding_variants(name)
    for m in _members(METHODS.get(name))
    if m >= METHODS.get(name).min_members
]


def build(name: str, m: int, hp: dict[str, Any]) -> tuple[EnsembleModel, BatchFeeding]:
    spec = METHODS.get(name)
    values = expand_hparams(spec, hp)[0]
    torch.manual_seed(0)
    ctx = BuildContext("digits_cnn", IN_SHAPE, K, m, dict(WIDTH))
    model = spec.build(ctx, spec.make_hparams(values))
    return model, spec.feeding_for(values)


def step_inputs(feeding: BatchFeeding, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of B distinct images per stream, image b of every stream labelled b."""
    streams = feeding.streams(m)
    lead = (streams, B) if streams > 1 else (B,)
    return torch.randn(*lead, *IN_SHAPE), torch.arange(B).expand(*lead).clone()


def freeze_batch_statistics(model: nn.Module) -> None:
    """BatchNorm in training mode mixes a batch's samples through its statistics; with running
    statistics every output row depends only on the images it was computed from."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


def image_support(model: EnsembleModel, feeding: BatchFeeding, m: int):
    """For every training row: the set of (stream, image) its logits depend on (by gradient).

    Returns:
        the TrainOutput and a bool tensor (M', B', S, B): row (member, r) depends on image
        (stream s, b).
    """
    model.train()
    freeze_batch_statistics(model)
    x, y = step_inputs(feeding, m)
    x.requires_grad_(True)
    out = model.training_outputs(x, y)
    rows = out.logits.shape[:2]
    support = torch.zeros(*rows, feeding.streams(m), B, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    for i in range(rows[0]):
        for r in range(rows[1]):
            # a random projection, so no structural cancellation hides a dependence
            w = torch.randn(K, generator=gen)
            (g,) = torch.autograd.grad((out.logits[i, r] * w).sum(), x, retain_graph=True)
            support[i, r] = g.abs().flatten(x.dim() - 3).sum(-1).view(-1, B) > 0
    return out, support


@pytest.mark.parametrize(("name", "hp", "m"), CASES)
def test_members_receive_the_declared_images(name: str, hp: dict, m: int) -> None:
    """Distinct input images each member receives in one training step == the declaration;
    with independent streams, member i's images come from stream i only."""
    model, feeding = build(name, m, hp)
    out, support = image_support(model, feeding, m)
    declared = feeding.images_per_member(B, m)
    assert out.targets.shape[1] == declared * feeding.repetitions
    for i in range(out.logits.shape[0]):
        seen = support[i].any(0)  # (S, B): images member i's rows depend on
        assert int(seen.sum()) == declared, f"member {i} saw {int(seen.sum())} images"
        if feeding.streams(m) > 1:
            assert int(seen[i].sum()) == declared, "a member trained on another member's stream"


@pytest.mark.parametrize(("name", "hp", "m"), CASES)
def test_every_target_is_the_label_of_an_image_its_row_saw(name: str, hp: dict, m: int) -> None:
    """Targets travel with their images (MIMO's per-member shuffles, split slices, streams):
    image b of every stream has label b, so row (i, r) is right iff it depends on image
    targets[i, r] of its stream."""
    model, feeding = build(name, m, hp)
    out, support = image_support(model, feeding, m)
    for i in range(out.logits.shape[0]):
        for r in range(out.logits.shape[1]):
            label = int(out.targets[i, r])
            assert support[i, r, :, label].any(), f"row ({i}, {r}) has another image's label"


class OneBatch:
    """A loader of one fixed step, in the layout the method's feeding declares."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self):
        yield self.x, self.y

    def __len__(self) -> int:
        return 1


def _memorise(model: EnsembleModel, loader: OneBatch, steps: int = 300) -> None:
    """Train on the fixed batch until every member predicts every row's target."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    recipe = Recipe()
    model.train()
    streak = 0
    for _ in range(steps):
        loss, out, _ = ensemble_loss(model, loader.x, loader.y, recipe)
        opt.zero_grad()
        loss.backward()
        opt.step()
        streak = streak + 1 if int(out.num_correct()) == out.num_rows else 0
        if streak == 5:
            return
    raise AssertionError("the method could not fit one batch of 8 images")


@pytest.mark.parametrize(("name", "hp", "m"), [c for c in CASES if c.values[2] <= 2])
def test_train_accuracy_is_computed_from_the_returned_targets(name, hp, m) -> None:
    """A model forced (by training) to predict the labels scores 100%; relabelling every other
    image scores exactly 1/2 (each member sees each image equally often, split slices too)."""
    model, feeding = build(name, m, hp)
    x, y = step_inputs(feeding, m)
    y = y % K
    _memorise(model, OneBatch(x, y))
    recipe = Recipe(lr=0.0, weight_decay=0.0, warmup_epochs=0)  # measure without moving
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, 1)
    stats = train_epoch(model, OneBatch(x, y), opt, sched, recipe, torch.device("cpu"))
    assert stats["train_acc"] == 1.0
    wrong = y.clone()
    wrong[..., 1::2] = (wrong[..., 1::2] + 1) % K
    stats = train_epoch(model, OneBatch(x, wrong), opt, sched, recipe, torch.device("cpu"))
    assert stats["train_acc"] == 0.5


def _stream_loader(seed: int, streams: int):
    from harness.data._machinery.base import ImageSet
    from harness.data._machinery.loader import DeviceLoader

    n = 40
    gen = torch.Generator().manual_seed(123)  # the same images in every loader
    images = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=gen)
    data = ImageSet(images, torch.arange(n))  # label = image index: labels reveal the order
    loader = DeviceLoader(
        data,
        8,
        torch.device("cpu"),
        (0.5,),
        (0.25,),
        "crop_flip",
        True,
        seed,
        True,
        streams=streams,
    )
    return loader


def _epoch(loader, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    loader.set_epoch(epoch)
    xs, ys = zip(*loader)
    return torch.stack(xs), torch.stack(ys)


def test_deep_ensemble_members_draw_their_own_batches_deterministically() -> None:
    spec = METHODS.get("deep_ensemble")
    feeding = spec.feeding_for(expand_hparams(spec, {})[0])
    assert feeding.mode == "independent" and feeding.streams(3) == 3
    x, y = _epoch(_stream_loader(seed=7, streams=3))
    assert x.shape == (5, 3, 8, 1, 8, 8) and y.shape == (5, 3, 8)  # steps, members, B, ...
    orders = y.transpose(0, 1).flatten(1)  # (members, epoch order)
    for a in range(3):
        assert sorted(orders[a].tolist()) == list(range(40))  # each member: a full epoch
        for b in range(a):
            assert not torch.equal(orders[a], orders[b]), "two members share a batch order"
    x2, y2 = _epoch(_stream_loader(seed=7, streams=3))
    assert torch.equal(y, y2) and torch.equal(x, x2)  # same seed: same orders, same crops
    x1, y1 = _epoch(_stream_loader(seed=7, streams=1))
    assert torch.equal(y1, y[:, 0]) and torch.equal(x1, x[:, 0])  # stream 0 = the shared one
    _, y_next = _epoch(_stream_loader(seed=7, streams=3), epoch=1)
    assert not torch.equal(y_next, y)  # reshuffled every epoch
    _, y_other = _epoch(_stream_loader(seed=8, streams=3))
    assert not torch.equal(y_other, y)


def test_loader_rejects_zero_streams() -> None:
    with pytest.raises(ValueError, match=r"streams must be >= 1, got 0"):
        _stream_loader(seed=0, streams=0)


def test_feeding_statement_for_the_record() -> None:
    spec = METHODS.get("mimo")
    feeding = spec.feeding_for(expand_hparams(spec, {})[0])
    assert feeding.to_json(128, 3) == {
        "mode": "shared",
        "streams": 1,
        "images_per_member_per_step": 128,
        "rows_per_member_per_step": 512,  # UB's 4 batch repetitions
    }
    split = BatchFeeding("split").to_json(128, 4)
    assert split["images_per_member_per_step"] == 32 and split["streams"] == 1
    with pytest.raises(ValueError, match=r"mode must be shared, split or independent"):
        BatchFeeding("tile")  # type: ignore[arg-type]


def test_train_output_rejects_mismatched_targets() -> None:
    from methods._base import TrainOutput

    with pytest.raises(ValueError, match=r"logits must be \(M, B', K\) and targets \(M, B'\)"):
        TrainOutput(torch.zeros(2, 4, 3), torch.zeros(2, 5, dtype=torch.long), "mean")
    with pytest.raises(ValueError, match=r"reduction must be 'mean' or 'sum', got 'max'"):
        TrainOutput(torch.zeros(2, 4, 3), torch.zeros(2, 4, dtype=torch.long), "max")  # type: ignore[arg-type]


def test_torch_uncertainty_methods_support_backbones_by_family() -> None:
    """Supported backbones follow ``BackboneSpec.family``, not a list of names."""
    from harness.registry import BACKBONES

    # Packed-Ensembles and BatchEnsemble also build the text encoder (methods/_tu/text.py).
    text = {"batch_ensemble": ("transformer",), "packed_ensemble": ("transformer",)}
    for name in ("batch_ensemble", "packed_ensemble", "mimo", "masksembles"):
        supported = METHODS.get(name).backbones
        assert supported is not None
        families = ("cnn", "resnet", "wideresnet", *text.get(name, ()))
        for backbone in BACKBONES.names():
            family = BACKBONES.get(backbone).family
            assert (backbone in supported) == (family in families)
        assert {"digits_cnn", "resnet18", "wrn28_10"} <= set(supported)
        assert "vit_small_32" not in supported
    assert METHODS.get("sigma_ens").backbones is None  # any backbone


def test_masksembles_masks_come_from_the_cells_seed_not_global_state() -> None:
    spec = METHODS.get("masksembles")

    def masks(seed: int, torch_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(torch_seed)
        ctx = BuildContext("digits_cnn", IN_SHAPE, K, 4, dict(WIDTH), seed=seed)
        model = spec.build(ctx, spec.make_hparams({}))
        return [t for n, t in model.state_dict().items() if n.endswith("masks")]

    a, b, c = masks(1, 0), masks(1, 99), masks(2, 0)
    assert a and all(torch.equal(x, y) for x, y in zip(a, b))  # torch's global seed is irrelevant
    assert any(not torch.equal(x, y) for x, y in zip(a, c))  # the cell's seed decides
    for m in a:  # (M, C) binary masks, every channel used by some member
        assert set(m.unique().tolist()) <= {0.0, 1.0} and bool(m.amax(0).all())


@pytest.mark.parametrize(("name", "hp", "m"), [c for c in CASES if c.values[2] == 4])
def test_runner_training_loader_feeds_the_declared_layout(name: str, hp: dict, m: int) -> None:
    """The runner's loader yields what the method declared: (M, B, ...) batches for
    independent streams, (B, ...) otherwise; and the step trains on them."""
    from harness.contract import Cell, Evaluation
    from harness.data._machinery.base import ImageSet
    from harness.engine.cell_setup import train_loader
    from harness.registry import DATASETS

    spec = METHODS.get(name)
    values = expand_hparams(spec, hp)[0]
    recipe = Recipe(batch_size=B, augment="crop_flip")
    cell = Cell("t", "digits", "digits_cnn", dict(WIDTH), name, m, values, 0, recipe, Evaluation())
    data = DATASETS.get("digits")
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4 * B, *data.in_shape), dtype=torch.uint8, generator=gen)
    loader = train_loader(
        cell, data, ImageSet(images, torch.arange(4 * B) % K), torch.device("cpu")
    )
    x, y = next(iter(loader))
    streams = spec.feeding_for(values).streams(m)
    lead = (streams, B) if streams > 1 else (B,)
    assert x.shape == (*lead, *data.in_shape) and y.shape == lead
    model, _ = build(name, m, hp)
    out = model.training_outputs(x, y)
    assert (
        out.targets.shape[1] == spec.feeding_for(values).to_json(B, m)["rows_per_member_per_step"]
    )
