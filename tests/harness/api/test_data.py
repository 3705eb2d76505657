"""``harness.api.data`` (issue 60 item 3): the benchmark's splits for a user's own training loop,
exactly as the engine feeds a suite's cells — the same held-out validation and calibration
images, labels, order and normalisation, the cell's own training batches, the evaluation's OOD
sets and corrupted copies — and every mistaken argument refused in one line naming it, before
any file is read or written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import harness.api as h
from harness.engine.build import load_data
from harness.engine.cell_setup import train_loader
from harness.registry import DATASETS
from tests.misuse import tree_hashes

SUITE = """
name: data_face
grid:
  datasets: [digits_hard]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [3]
  methods: [single]
recipe: {epochs: 1, batch_size: 16, eval_batch_size: 50, validation: 100, augment: crop_flip}
evaluation: {cost: false, calibrate: true, calibration: 200, ood: [digits_hard_heldout]}
"""


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data_face") / "data_face.yaml"
    path.write_text(textwrap.dedent(SUITE))
    return path


@pytest.fixture(scope="module")
def engine(suite, tmp_path_factory):
    """The suite's cell and the splits the engine loads for it."""
    (cell,) = h.validate(suite).cells
    root = tmp_path_factory.mktemp("data_root")
    spec, splits = load_data(cell, root)
    return cell, spec, splits, root


def _normalised(images: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 (N, C, H, W) → the model input: [0, 1], then per-channel mean and std."""
    c = images.shape[1]
    m, s = torch.tensor(mean).view(1, c, 1, 1), torch.tensor(std).view(1, c, 1, 1)
    return (images.float() / 255 - m) / s


@pytest.mark.parametrize("split", ["train", "val", "calibration", "test"])
def test_each_split_is_the_cells_own(suite, engine, split):
    _, spec, splits, root = engine
    got = h.data(split=split, suite=suite, data_root=root)
    want = splits[split]
    assert (got.dataset, got.split, got.num_classes) == ("digits_hard", split, 8)
    assert (got.validation, got.calibration) == (100, 200)
    assert len(got) == len(want) == {"val": 100, "calibration": 200}.get(split, len(want))
    assert torch.equal(got.images, want.images) and torch.equal(got.labels, want.labels)
    x, y = got.tensors()
    assert x.dtype == torch.float32 and x.shape == (len(want), 1, 8, 8)
    assert y.dtype == torch.int64 and torch.equal(y, want.labels)
    torch.testing.assert_close(x, _normalised(want.images, spec.mean, spec.std))
    # item by item: the loader's values to the bit, in the split's order
    rows = [got[i] for i in range(len(got))]
    assert torch.equal(torch.stack([r[0] for r in rows]), x)
    assert torch.equal(torch.stack([r[1] for r in rows]), y)


def test_held_out_splits_are_disjoint_and_the_same_without_the_suite(suite, engine):
    _, _, splits, root = engine
    plain = {s: h.data("digits_hard", s, validation=100, calibration=200, data_root=root)
             for s in ("train", "val", "calibration", "test")}  # fmt: skip
    for s, d in plain.items():
        assert torch.equal(d.images, splits[s].images) and torch.equal(d.labels, splits[s].labels)
    rows = {s: {bytes(im.numpy().tobytes()) for im in d.images} for s, d in plain.items()}
    assert not rows["val"] & rows["calibration"]  # spare images: neither overlaps the other


def test_the_training_loader_is_the_cells_own_batches(suite, engine):
    cell, spec, splits, root = engine
    theirs = train_loader(cell, spec, splits["train"], torch.device("cpu"))
    ours = h.data(split="train", suite=suite, data_root=root).loader(train=True, seed=cell.seed)
    assert len(ours) == len(theirs) == len(splits["train"]) // 16
    for epoch in (0, 1):
        theirs.set_epoch(epoch)
        ours.set_epoch(epoch)
        for (xa, ya), (xb, yb) in zip(theirs, ours, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # shuffled and augmented (crop_flip): not the split's order, not the plain images
    x, y = next(iter(ours))
    assert x.shape == (16, 1, 8, 8) and not torch.equal(y, splits["train"].labels[:16])


def test_an_evaluation_loader_and_a_torch_data_loader(engine):
    *_, root = engine
    test = h.data("digits_hard", "test", data_root=root)
    batches = list(test.loader(batch_size=100))
    assert [len(y) for _, y in batches][:2] == [100, 100]
    x, y = test.tensors()
    assert torch.equal(torch.cat([b for b, _ in batches]), x)
    xb, yb = next(iter(torch.utils.data.DataLoader(test, batch_size=32)))
    assert xb.shape == (32, 1, 8, 8) and yb.dtype == torch.int64
    assert torch.equal(xb, x[:32]) and torch.equal(yb, y[:32])
    assert isinstance(test, torch.utils.data.Dataset)
    with pytest.raises(IndexError, match=r"out of range|index"):
        test[len(test)]


def test_an_ood_set_and_a_corrupted_test_set_are_the_evaluations(engine, tmp_path):
    _, _, splits, root = engine
    ood = h.data("digits_hard", "digits_hard_heldout", data_root=root)
    raw = DATASETS.get("digits_hard_heldout").load(root)["test"]
    assert torch.equal(ood.images, raw.images) and set(ood.labels.tolist()) == {-1}
    small = h.data("digits", "sklearn_photos", data_root=root)
    assert small.images.shape[1:] == (1, 8, 8) and small.num_classes == 8
    from harness.data._machinery.corruptions import corrupted_split

    data_root = tmp_path / "data"
    shifted = h.data("digits_hard", "test", corruption="gaussian_noise", severity=4,
                     data_root=data_root)  # fmt: skip
    want = corrupted_split("digits_hard", data_root, splits["test"], "gaussian_noise", 4)
    assert (shifted.corruption, shifted.severity) == ("gaussian_noise", 4)
    assert torch.equal(shifted.images, want.images)
    assert torch.equal(shifted.labels, splits["test"].labels)
    assert not torch.equal(shifted.images, splits["test"].images)


# --- misuse: one line naming the argument, the value and what to do; nothing written ---------

MISTAKES = [
    ({"dataset": "digitz"}, ["dataset: unknown dataset 'digitz'", "Did you mean 'digits'?"]),
    ({"dataset": "digits", "split": "valid"},
     ["split 'valid': not one of train, val, calibration, test, nor an OOD set"]),
    ({"dataset": "digits", "split": "val"},
     ["split 'val': no validation images are held out (validation: 0)", "pass validation=N"]),
    ({"dataset": "digits", "calibration": 10},
     ["calibration=10: 'digits' has no spare images", "pass 0"]),
    ({"dataset": "digits_hard", "validation": 2000},
     ["validation=2000", "1034 spare images", "pass 0 to 1033"]),
    ({"dataset": "digits", "validation": 5000}, ["validation=5000", "[0, 1154)"]),
    ({"dataset": "digits", "validation": -1}, ["validation: -1: pass a whole number >= 0"]),
    ({"dataset": "cifar10", "split": "test"},
     ["dataset: dataset 'cifar10' not found", "`harness data download cifar10`"]),
    ({"dataset": "digits", "split": "train", "corruption": "gaussian_noise", "severity": 3},
     ["corruption='gaussian_noise': corruptions are of the test set", "pass split='test'"]),
    ({"dataset": "digits", "split": "test", "corruption": "gausian_noise", "severity": 3},
     ["corruption: unknown corruption 'gausian_noise'", "choose from"]),
    ({"dataset": "digits", "split": "test", "corruption": "gaussian_noise", "severity": 6},
     ["severity: 6: pass 1, 2, 3, 4 or 5"]),
    ({"dataset": "digits", "severity": 2}, ["severity=2: only with corruption="]),
    ({"dataset": "digits_heldout"},
     ["dataset: 'digits_heldout' is an OOD set", "split='digits_heldout'"]),
    ({"dataset": "digits", "overrides": ["recipe.validation=3"]},
     ["overrides: ['recipe.validation=3'] apply to a suite", "pass suite="]),
    ({"suite": "SUITE", "validation": 10},
     ["validation=10: the suite sets recipe.validation",
      "overrides=['recipe.validation=10']"]),
    ({"suite": "SUITE", "dataset": "digits"},
     ["dataset: 'digits' is not one of the suite's datasets ['digits_hard']"]),
    ({"suite": "SUITE", "overrides": ["recipe.validation=0"], "split": "val"},
     ["split 'val': no validation images are held out (recipe.validation: 0)",
      "overrides=['recipe.validation=N']"]),
    ({"suite": "MISSING"}, ["suite file not found"]),
    ({}, ["dataset: pass a registered dataset"]),
    ({"dataset": 3}, ["dataset: 3 is not a dataset name"]),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "needles"), MISTAKES, ids=[str(k) for k, _ in MISTAKES])
def test_a_mistaken_argument_is_one_line_and_writes_nothing(
    suite, tmp_path, monkeypatch, kwargs, needles
):
    monkeypatch.chdir(tmp_path)
    data_root = tmp_path / "data"
    data_root.mkdir()
    stand_ins = {"SUITE": suite, "MISSING": tmp_path / "no_such.yaml"}
    kwargs = {k: stand_ins.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    before = tree_hashes(tmp_path), tree_hashes(suite.parent)
    with pytest.raises(h.HarnessError, match=r"^[\w/]") as exc:  # names the argument or file
        h.data(**{"data_root": data_root, **kwargs})
    (line,) = exc.value.problems
    assert "\n" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    assert (tree_hashes(tmp_path), tree_hashes(suite.parent)) == before


def test_every_mistake_is_named_at_once(tmp_path):
    with pytest.raises(h.HarnessError, match=r"^dataset") as exc:
        h.data(3, None, validation=-1, severity=9, data_root=tmp_path)
    assert [p.split(":")[0] for p in exc.value.problems] == [
        "dataset", "split", "validation", "severity=9",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch_size": 0}, "batch_size: 0: pass a whole number >= 1"),
        ({"seed": -1}, "seed: -1: pass a whole number >= 0"),
        ({"streams": 1.5}, "streams: 1.5: pass a whole number >= 1"),
        ({"train": "yes"}, "train: 'yes': pass True"),
        ({"device": "gpu"}, "device: 'gpu' is not a device"),
    ],
)
def test_a_mistaken_loader_argument_is_one_line(kwargs, needle):
    with pytest.raises(h.HarnessError, match=r"^\w") as exc:  # the line names the argument
        h.data("digits").loader(**kwargs)
    (line,) = exc.value.problems
    assert needle in line, line
