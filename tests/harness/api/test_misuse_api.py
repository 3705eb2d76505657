"""Mistakes made with ``harness.api.evaluate``: each refused with one ``HarnessError`` naming the
argument, before any evaluation, and every file under the results folder byte-identical
afterwards; an outside model never writes into a trained cell, and replaces an earlier outside
record only when asked (setting it aside)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import harness.api as h
from harness.registry import DATASETS
from tests.misuse import copy_results, tree_hashes

SPEC = DATASETS.get("digits")  # (1, 8, 8), 8 classes


def linear(seed: int = 0) -> nn.Module:
    """A one-layer model of the digits input: (B, 1, 8, 8) → logits (B, 8)."""
    torch.manual_seed(seed)
    c, hh, ww = SPEC.in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * hh * ww, SPEC.num_classes))


class Softmaxed(nn.Module):
    """A model that returns probabilities, not logits."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = linear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).softmax(-1)


@pytest.fixture(scope="module")
def finished(tiny_finished) -> tuple[Path, Path]:
    return tiny_finished


@pytest.fixture
def results(finished, tmp_path) -> tuple[Path, Path, Path]:
    """(suite file, results root, the suite's folder in it) — a copy to misuse."""
    suite, folder = finished
    copy = copy_results(folder, tmp_path / "r" / "tiny")
    return suite, copy.parent, copy


def refused(match: str, root: Path, **kwargs) -> h.HarnessError:
    """``evaluate(**kwargs)`` raises a HarnessError matching ``match`` and leaves every file
    under ``root`` as it was."""
    before = tree_hashes(root)
    kwargs.setdefault("model", linear())
    with pytest.raises(h.HarnessError, match=match) as info:
        h.evaluate(**kwargs)
    assert tree_hashes(root) == before
    return info.value


def test_an_outside_model_named_as_a_trained_cell_is_refused_and_the_cell_kept(results):
    """Regression: at 7a576e5 this replaced the trained `single` cell's record and outcomes."""
    suite, root, folder = results
    err = refused(r"'single' on digits/digits_cnn is the suite's method", root, suite=suite,
                  name="single", backbone="digits_cnn", results=root)  # fmt: skip
    assert "another name=" in str(err) and len(err.problems) == 1
    # Named so, but on the default backbone, it is a row of its own, in a folder of its own.
    out = h.evaluate(linear(), suite=suite, name="single", results=root)
    assert out.path.name.startswith("ext-") and out.record["config"]["backbone"] == "external"
    trained = [p for p in folder.iterdir() if (p / "final.pt").exists()]
    assert len(trained) == 2 and all(not p.name.startswith("ext-") for p in trained)


def test_evaluating_again_is_refused_and_overwrite_sets_the_old_record_aside(results):
    suite, root, _ = results
    first = h.evaluate(linear(0), suite=suite, name="mine", results=root)
    old = (first.path / "record.json").read_bytes(), (first.path / "outcomes.npz").read_bytes()
    refused(r"already holds an outside model evaluated as 'mine'.*overwrite=True", root,
            model=linear(0), suite=suite, name="mine", results=root)  # fmt: skip
    refused("overwrite=True", root, model=linear(1), suite=suite, name="mine", results=root)
    second = h.evaluate(linear(1), suite=suite, name="mine", results=root, overwrite=True)
    assert second.path != first.path  # other weights, another id
    assert not (first.path / "record.json").exists()
    kept = {p.name.split(".replaced-")[0]: p.read_bytes()
            for p in first.path.glob("*.replaced-*")}  # fmt: skip
    assert kept == {"record.json": old[0], "outcomes.npz": old[1]}
    # Another seed of the same outside method is a row's second seed, not a collision.
    third = h.evaluate(linear(2), suite=suite, name="mine", results=root, seed=1)
    assert third.record["config"]["seed"] == 1


def test_the_id_is_of_the_weights(results):
    suite, _, _ = results
    a = h.evaluate(linear(0), suite=suite, name="m")
    b = h.evaluate(linear(0), suite=suite, name="m")
    c = h.evaluate(linear(1), suite=suite, name="m")
    assert a.record["cell_id"] == b.record["cell_id"] != c.record["cell_id"]
    assert a.path is None  # no results= : nothing written


def test_probabilities_declared_as_logits_are_refused_and_accepted_as_probs(results):
    suite, root, _ = results
    refused(r"outputs='logits', but the model returned probabilities.*outputs='probs'", root,
            model=Softmaxed(), suite=suite, name="soft", results=root)  # fmt: skip
    refused(r"outputs='probs', but the model's values are not probabilities", root,
            model=linear(), suite=suite, name="lin", results=root, outputs="probs")  # fmt: skip
    as_probs = h.evaluate(Softmaxed(), suite=suite, name="soft", outputs="probs")
    as_logits = h.evaluate(Softmaxed().inner, suite=suite, name="lin")
    for key in ("acc", "nll", "brier", "ece"):
        assert as_probs.record["metrics"]["clean"][key] == pytest.approx(
            as_logits.record["metrics"]["clean"][key], rel=1e-5, abs=1e-7
        )
    assert as_probs.record["metrics"]["clean"]["nll"] < np.log(SPEC.num_classes) + 1


def test_nan_outputs_are_named_as_such_not_as_logits_to_softmax(results):
    suite, root, _ = results

    def nan_model(x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0], SPEC.num_classes), float("nan"))

    err = refused(r"NaN or infinite values", root, model=nan_model, suite=suite, name="nan",
                  results=root)  # fmt: skip
    assert "softmax" not in str(err)


def test_a_model_of_another_input_size_names_the_shape_the_dataset_delivers(results):
    suite, root, _ = results
    wrong = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, SPEC.num_classes))
    refused(r"failed on a test batch of shape \(8, 1, 8, 8\).*RuntimeError", root, model=wrong,
            suite=suite, name="wrong", results=root)  # fmt: skip


def test_outputs_of_the_wrong_type_or_classes(results):
    suite, root, _ = results
    refused(r"not a floating-point tensor", root, model=lambda x: x.shape[0], suite=suite,
            name="int", results=root)  # fmt: skip
    refused(
        r"shape \(8, 3\).*expected \(M, 8, 8\)",
        root,
        model=lambda x: torch.zeros(x.shape[0], 3),
        suite=suite,
        name="k3",
        results=root,
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "cuda:3"}, r"device: 'cuda:3': this machine has 0 CUDA GPU"),
        ({"device": "gpu"}, r"device: 'gpu' is not a device"),
        ({"overrides": "evaluation.ood=[]"}, r"overrides: 'evaluation.ood=\[\]': pass a list"),
        ({"seed": -1}, r"seed: -1: pass an integer >= 0"),
        ({"name": ""}, r"name: '': pass a non-empty string"),
        ({"outputs": "logit"}, r"outputs: 'logit' is not one of \['logits', 'probs'\]"),
        ({"evaluation": ["ood"]}, r"evaluation: \['ood'\]: pass a mapping"),
        ({"evaluation": {"ood": ["nope"]}}, r"OOD set: .*nope"),
        ({"evaluation": {"conformal_alpha": 0.001}}, r"conformal_alpha: 0.001 .*1/\(n \+ 1\)"),
        ({"model": "model.pt"}, r"model: a str is not callable"),
        ({"name": "single "}, r"name: 'single ': pass a non-empty string without '/' or surr"),
        ({"recipe": {"epochs": 5}}, r"recipe: \['epochs'\] do not apply to a model trained"),
    ],
)
def test_arguments_are_checked_before_any_evaluation(results, monkeypatch, kwargs, match):
    suite, root, _ = results
    import harness.engine.external as external

    def never(*args, **kw):
        raise AssertionError("evaluated despite a refused argument")

    monkeypatch.setattr(external, "evaluate_all", never)
    refused(match, root, **{"suite": suite, "name": "x", "results": root, **kwargs})


def test_a_model_on_the_meta_device_or_another_device_is_refused(results):
    suite, root, _ = results
    with torch.device("meta"):
        meta = linear()
    refused(r"model: its parameters are on the meta device", root, model=meta, suite=suite,
            results=root)  # fmt: skip
    refused(r"device: 'meta', but|evaluation runs on 'cpu'", root, suite=suite, results=root,
            device="meta")  # fmt: skip


def test_a_results_path_that_is_a_file_is_refused_before_evaluating(results, tmp_path):
    suite, _, _ = results
    file = tmp_path / "results.txt"
    file.write_text("not a folder\n")
    refused(r"results: .*results.txt is a file, not a folder", tmp_path, suite=suite,
            results=file)  # fmt: skip
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "tiny").write_text("a file where the suite's folder goes\n")
    refused(r"results: .*tiny is a file, not a folder", tmp_path, suite=suite,
            results=tmp_path / "r2")  # fmt: skip


def test_the_record_states_its_fingerprint_and_the_page_shows_it(results):
    suite, root, folder = results
    out = h.evaluate(linear(3), suite=suite, name="shown", results=root)
    rec = json.loads((out.path / "record.json").read_text())
    assert rec["diagnostics"] == {
        "external": True,
        "fingerprint": rec["diagnostics"]["fingerprint"],
    }
    table = h.load_results(folder)
    assert set(table.loc[table["method"] == "shown", "cell_id"]) == {out.path.name}


def test_a_suites_own_results_folder_and_a_name_in_another_case_are_refused(results):
    suite, root, folder = results
    refused(r"results: .*tiny is a suite's results folder \(it holds suite.json\); pass the "
            r"results root", root, suite=suite, results=folder)  # fmt: skip
    refused(r"name: 'Single' on digits/digits_cnn is the suite's method", root, suite=suite,
            name="Single", backbone="digits_cnn", results=root)  # fmt: skip


def test_limit_scores_a_fixed_subset_and_bad_limits_are_refused(results):
    suite, root, _ = results
    out = h.evaluate(linear(4), suite=suite, name="quick", limit=50)
    assert out.record["evaluation"]["limit"] == 50 and len(out.outcomes["correct"]) == 50
    assert out.record["metrics"]["clean"]["acc"] == pytest.approx(out.outcomes["correct"].mean())
    for bad in (0, -3, 2.5, True):
        refused(r"limit: .*pass a whole number of test images >= 1", root, suite=suite,
                name="quick", results=root, limit=bad)  # fmt: skip
        with pytest.raises(h.HarnessError, match=r"limit: .*whole number of test images"):
            h.run(suite, results=root, limit=bad, executor="inprocess")
