"""Models in and out of the benchmark (harness/api/models.py): a finished cell's model comes back
with `load_model` and, put through `harness.api.evaluate` as an outside model, gives the cell's
own numbers; a callable built here is evaluated without a suite; `predictions` returns the
probabilities the record's metrics come from; the reporter shows the outside model beside the
suite's cells; bad input is refused before anything is evaluated."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

import harness.api as h
from harness.api import evaluate, load_model, predictions
from harness.cli import main

SUITE = """
name: outside
grid:
  datasets: [digits_hard]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0]
  methods: [single, {name: deep_ensemble, M: [2]}]
recipe: {epochs: 1, batch_size: 32}
evaluation:
  cost: false
  calibrate: true
  calibration: 200
  ood: [digits_hard_heldout]
"""


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    root = tmp_path_factory.mktemp("outside")
    suite = root / "outside.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    results = root / "results"
    assert (
        main(["run", str(suite), "--results", str(results), "-q", "--executor", "inprocess"]) == 0
    )
    folder = results / "outside"
    cells = {json.loads(p.read_text())["config"]["method"]: p.parent
             for p in folder.glob("*/record.json")}  # fmt: skip
    return suite, results, folder, cells


def test_a_finished_cell_reloaded_and_evaluated_from_outside_gives_its_own_numbers(done):
    suite, results, folder, cells = done
    cell = cells["deep_ensemble"]
    own = json.loads((cell / "record.json").read_text())
    model = load_model(cell)
    assert not model.training
    out = evaluate(model, suite=suite, name="reloaded", backbone="digits_cnn", results=results)
    rec = out.record
    assert out.path == folder / rec["cell_id"] and (out.path / "record.json").is_file()
    assert (out.path / "outcomes.npz").is_file()
    assert rec["config"]["method"] == "reloaded" and rec["config"]["M"] == 2
    assert rec["suite"] == "outside" and rec["diagnostics"]["external"] is True
    assert rec["cell_id"].startswith("ext-") and len(rec["diagnostics"]["fingerprint"]) == 16
    for key in ("acc", "nll", "ece", "brier", "disagreement"):
        assert rec["metrics"]["clean"][key] == pytest.approx(own["metrics"]["clean"][key], rel=1e-9)
    ts, own_ts = (r["metrics"]["calibration"] for r in (rec, own))
    assert ts["temperature"] == pytest.approx(own_ts["temperature"], rel=1e-9)
    assert ts["ts"]["clean"]["nll"] == pytest.approx(own_ts["ts"]["clean"]["nll"], rel=1e-9)
    auroc = rec["metrics"]["ood"]["digits_hard_heldout"]["msp"]["auroc"]
    assert auroc == pytest.approx(own["metrics"]["ood"]["digits_hard_heldout"]["msp"]["auroc"])
    assert rec["cost"]["params_total"] == sum(p.numel() for p in model.parameters())
    assert out.outcomes["correct"].mean() == pytest.approx(rec["metrics"]["clean"]["acc"])

    # Beside the suite's cells: in the results table and on the page.
    table = h.load_results(folder)
    assert "reloaded" in set(table["method"])
    assert main(["report", str(folder)]) == 0
    assert "reloaded" in (folder / "leaderboard.html").read_text()
    # `harness evaluate` has no weights for it and does not count it as a failure.
    assert main(["evaluate", str(folder), "--add-only"]) == 0


def test_predictions_are_the_probabilities_the_record_comes_from(done):
    _, _, _, cells = done
    cell = cells["deep_ensemble"]
    own = json.loads((cell / "record.json").read_text())
    p = predictions(cell, "test")
    assert p.probs.shape[0] == 2 and p.probs.shape[1] == len(p.labels) and p.probs.shape[2] == 8
    np.testing.assert_allclose(p.probs.sum(-1), 1.0, atol=1e-5)
    acc = (p.probs.mean(0).argmax(-1) == p.labels).mean()
    assert acc == pytest.approx(own["metrics"]["clean"]["acc"], abs=1e-12)
    nll = -np.log(np.maximum(p.probs.mean(0)[np.arange(len(p.labels)), p.labels], 1e-12)).mean()
    assert nll == pytest.approx(own["metrics"]["clean"]["nll"], rel=1e-5)
    ood = predictions(cell, "digits_hard_heldout")
    assert ood.probs.shape[0] == 2 and len(ood.labels) == ood.probs.shape[1] > 0
    with pytest.raises(h.HarnessError, match="split 'nope'"):
        predictions(cell, "nope")


def test_a_callable_built_here_is_evaluated_without_a_suite(tmp_path):
    from harness.data._machinery.base import default_data_root
    from harness.registry import DATASETS

    spec = DATASETS.get("digits_hard")
    gen = torch.Generator().manual_seed(0)
    c, hgt, w = spec.in_shape
    weight = torch.randn(c * hgt * w, spec.num_classes, generator=gen)

    def linear(x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) → (B, K): one model
        return x.flatten(1) @ weight

    out = evaluate(linear, "digits_hard", name="linear", results=tmp_path,
                   evaluation={"ood": ["digits_hard_heldout"]})  # fmt: skip
    rec = out.record
    assert rec["suite"] == "external" and rec["config"]["M"] == 1
    assert out.path.parent == tmp_path / "external"
    assert "params_total" not in rec["cost"]  # a callable has no parameters to count
    # The accuracy, computed here from the test split normalised as the loader does.
    test = spec.load(default_data_root(None))["test"]
    mean = torch.tensor(spec.mean).view(1, -1, 1, 1)
    std = torch.tensor(spec.std).view(1, -1, 1, 1)
    x = (test.images.float() / 255 - mean) / std
    want = (linear(x).argmax(-1) == test.labels).double().mean().item()
    assert rec["metrics"]["clean"]["acc"] == pytest.approx(want, abs=1e-12)
    assert set(rec["metrics"]["ood"]) == {"digits_hard_heldout"}


def test_bad_input_is_refused_before_anything_is_evaluated(tmp_path):
    with pytest.raises(h.HarnessError) as err:
        evaluate(lambda x: x, "digits_hardd", evaluation={"ood": ["nowhere"], "calibrate": True})
    text = str(err.value)
    assert "digits_hard" in text and "nowhere" in text and "held-out" in text
    with pytest.raises(h.HarnessError, match=r"expected \(M, \d+, 8\)"):
        evaluate(lambda x: torch.zeros(x.shape[0], 3), "digits_hard")
    with pytest.raises(h.HarnessError, match="pass dataset="):
        evaluate(lambda x: x)
    (tmp_path / "cell.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no final\.pt"):
        load_model(tmp_path)


def test_the_example_runs_both_ways(done):
    import importlib.util

    from tests.conftest import REPO

    suite, results, folder, cells = done
    path = REPO / "examples" / "evaluate_your_model.py"
    spec = importlib.util.spec_from_file_location("evaluate_your_model", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    stacked = json.loads(
        (
            example.main(["--suite", str(suite), "--results", str(results)]) / "record.json"
        ).read_text()
    )
    single = json.loads((cells["single"] / "record.json").read_text())
    # One single cell stacked is that cell: the same numbers.
    assert stacked["config"]["method"] == "singles_ensemble" and stacked["config"]["M"] == 1
    assert stacked["metrics"]["clean"]["acc"] == single["metrics"]["clean"]["acc"]
    ncm = json.loads(
        (example.main(["--suite", str(suite), "--results", str(results), "--scratch"])
         / "record.json").read_text()
    )  # fmt: skip
    assert ncm["config"]["method"] == "nearest_class_mean"
    assert ncm["metrics"]["clean"]["acc"] > 2 / 8  # well above chance (8 classes)
    assert {"singles_ensemble", "nearest_class_mean"} <= set(h.load_results(folder)["method"])
