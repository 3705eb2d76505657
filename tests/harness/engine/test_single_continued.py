"""`single_continued`: the suite's trained single model, trained further under a conversion's
fine-tuning recipe (the control that tells a conversion's gain from the extra epochs alone)."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from harness.config.parse import load_suite
from harness.engine.build import build_model, load_backbone_state, load_data
from harness.engine.runner import run_cell
from harness.executors.base import write_manifest
from harness.registry import METHODS
from methods._base import BuildContext

SUITE = """
name: cont
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  M: [1]
  seeds: [0]
  methods:
    - single
    - name: single_continued
      hparams: {pretrain_epochs: 2}
      recipe: {epochs: 1, lr: 0.01, warmup_epochs: 0}
recipe: {epochs: 2, batch_size: 64}
evaluation: {cost: false}
"""


def test_continued_single_starts_as_the_trained_single_and_trains_on(write_suite, tmp_path):
    suite = load_suite(write_suite(textwrap.dedent(SUITE)))
    single, cont = suite.cells()
    assert (cont.method, cont.hparams["pretrain_epochs"], cont.recipe.epochs) == (
        "single_continued", 2, 1
    )  # fmt: skip
    write_manifest(suite, tmp_path)
    rec = run_cell(cont, tmp_path, progress=False)  # trains the suite's single cell first
    assert rec["status"] == "done", rec["error"]
    single_rec = json.loads((tmp_path / single.cell_id / "record.json").read_text())
    assert single_rec["status"] == "done"

    # Step 0 of the continuation is the trained single model, bit for bit.
    spec, splits = load_data(single, tmp_path)
    trained, _ = build_model(single, spec)
    trained.load_state_dict(torch.load(tmp_path / single.cell_id / "final.pt", weights_only=True))
    state = load_backbone_state(tmp_path / single.cell_id / "final.pt")
    spec_c = METHODS.get("single_continued")
    ctx = BuildContext("digits_cnn", spec.in_shape, spec.num_classes, 1, {"width": 8}, state)
    start = spec_c.build(ctx, spec_c.hparams(pretrain_epochs=2))
    x = (splits["test"].images[:64].float() / 255 - spec.mean[0]) / spec.std[0]
    trained.eval(), start.eval()
    with torch.no_grad():
        assert torch.equal(start(x), trained(x))
    # ... and the extra epoch moved it: not the same predictions as the single model's record.
    assert rec["metrics"]["clean"]["nll"] != pytest.approx(single_rec["metrics"]["clean"]["nll"])
    assert rec["history"][0]["epoch"] == 1 and len(rec["history"]) == 1


@pytest.mark.parametrize(
    "name", [n for n in METHODS.names() if METHODS.get(n).pretrained_conversion]
)
def test_every_conversion_method_refuses_two_starting_points_at_validate(name, write_suite):
    """The rule lives on the method spec (methods._base.conversion_problems), so every
    conversion method has it — FiLM-Ensemble included, where ``pretrained`` used to win
    silently — and ``harness validate`` refuses the cell before anything trains."""
    from harness.config.includes import SuiteError
    from harness.config.parse import load_suite

    spec = METHODS.get(name)
    assert spec.problems(spec.hparams(pretrained="w.pt", pretrain_epochs=2), 1) == [
        "set either pretrained or pretrain_epochs, not both"
    ]
    assert spec.problems(spec.hparams(), 1) == []  # from scratch
    m = 1 if spec.max_members == 1 else 2
    path = write_suite(
        f"""
name: both
grid:
  datasets: [digits]
  backbones: [digits_cnn]
  methods: [{{name: {name}, M: {m}, hparams: {{pretrained: w.pt, pretrain_epochs: 2}}}}]
"""
    )
    with pytest.raises(SuiteError, match="set either pretrained or pretrain_epochs, not both"):
        load_suite(path)


def test_conversion_methods_are_the_three_known():
    names = {n for n in METHODS.names() if METHODS.get(n).pretrained_conversion}
    assert names == {"sigma_ens", "film_ensemble", "single_continued"}
