"""σN-Ens as a harness method: pretrained conversion of a trained digits model, in-cell
pretraining, τ/λ schedules and the per-epoch diagnostics in the record."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from harness.config.includes import SuiteError
from harness.config.parse import load_suite
from harness.config.suite import expand_hparams
from harness.contract import Cell
from harness.contract.record import read_record
from harness.engine.build import build_model, load_backbone_state, load_data
from harness.engine.runner import run_cell
from harness.registry import METHODS
from methods._base import BuildContext

SUITE = """
name: sig
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  M: [4]
  seeds: [0]
  methods:
    - single
    - name: sigma_ens
      hparams: {tau: 0.5, lam: 0.01, pretrain_epochs: 2}
      recipe: {epochs: 1, lr: 0.01, warmup_epochs: 0}
    - name: sigma_ens
      hparams: {tau: 0.05, tau_end: 5.0, lam: 0.01, schedule: linear}
recipe: {epochs: 2, batch_size: 64}
evaluation: {cost: false}
"""


@pytest.fixture
def cells(write_suite):
    return load_suite(write_suite(textwrap.dedent(SUITE))).cells()


def test_conversion_of_trained_digits_model_reproduces_its_predictions(cells, tmp_path):
    """Step 0 of a pretrained conversion: every member gives the single model's logits.

    The copied affine of member m is divided by sigmoid(γ_m), so sigmoid(γ_m)·(w/σ(γ_m)) = w;
    the tolerance is float32 rounding (1e-5 absolute on logits of magnitude ~10).
    """
    single = cells[0]
    rec = run_cell(single, tmp_path, progress=False)
    assert rec["status"] == "done"
    spec, splits = load_data(single, tmp_path)
    trained, _ = build_model(single, spec)
    trained.load_state_dict(torch.load(tmp_path / single.cell_id / "final.pt", weights_only=True))
    state = load_backbone_state(tmp_path / single.cell_id / "final.pt")
    sig = METHODS.get("sigma_ens")
    hp = sig.hparams(**expand_hparams(sig, {"tau": 0.5})[0])
    ctx = BuildContext("digits_cnn", spec.in_shape, spec.num_classes, 4, {"width": 8}, state)
    converted = sig.build(ctx, hp)
    x = (splits["test"].images[:64].float() / 255 - spec.mean[0]) / spec.std[0]
    trained.eval()
    converted.eval()
    with torch.no_grad():
        ref = trained(x)[0]  # (B, K)
        out = converted(x)  # (M, B, K)
    gammas = [p for n, p in converted.named_parameters() if n.endswith("gamma")]
    # members do have different, random γ, near-identity by default: sigmoid(γ) ≈ 0.95
    assert gammas and 0.05 < gammas[0].std() < 0.2
    assert torch.sigmoid(gammas[0]).mean().item() == pytest.approx(0.953, abs=0.01)
    for m in range(4):
        torch.testing.assert_close(out[m], ref, atol=1e-5, rtol=0)


def test_pretrain_then_convert_in_one_cell(cells, tmp_path, write_suite):
    """The converting cell pre-trains by running the suite's `single` cell (base recipe, not the
    fine-tuning delta), then fine-tunes with its own recipe."""
    from harness.executors.base import write_manifest

    write_manifest(load_suite(write_suite(textwrap.dedent(SUITE))), tmp_path)
    cell, single = cells[1], cells[0]
    rec = run_cell(cell, tmp_path, progress=False)
    assert rec["status"] == "done", rec["error"]
    assert not (tmp_path / cell.cell_id / "pretrain").exists()  # nothing trained in the cell
    pre = read_record(tmp_path / single.cell_id)  # the suite's single cell did it
    assert pre["status"] == "done" and pre["config"]["recipe"]["lr"] == 0.05  # base recipe
    assert [h["epoch"] for h in pre["history"]] == [1, 2]
    assert [h["epoch"] for h in rec["history"]] == [1]  # the fine-tuning phase
    assert rec["config"]["recipe"]["epochs"] == 1 and rec["config"]["recipe"]["lr"] == 0.01
    assert rec["metrics"]["clean"]["acc"] > 0.5  # starts from a trained model


def test_pretrained_model_is_the_suites_single_model_trained_once(cells, tmp_path, write_suite):
    """Byte-identical state dicts, and one training of the single cell for the whole suite."""
    from harness.cli import main
    from harness.engine.runner import pretrained_state

    path = write_suite(textwrap.dedent(SUITE))
    args = ["run", str(path), "--executor", "inprocess", "--results", str(tmp_path), "-q"]
    assert main(args) == 0
    results = tmp_path / "sig"
    cell, single = cells[1], cells[0]
    assert read_record(results / cell.cell_id)["status"] == "done"
    spec, _ = load_data(cell, tmp_path)
    pre = pretrained_state(cell, results / cell.cell_id, spec, False)
    final = torch.load(results / single.cell_id / "final.pt", weights_only=True)
    assert set(pre) == {k.removeprefix("net.") for k in final}
    for key, value in final.items():
        other = pre[key.removeprefix("net.")]
        assert other.dtype == value.dtype and torch.equal(other, value)  # bit for bit
    events = (results / single.cell_id / "events.jsonl").read_text().splitlines()
    assert sum(json.loads(e)["event"] == "train" for e in events) == 1  # trained once


def test_pretrain_without_a_single_cell_in_the_suite_is_refused_before_any_cell(
    tmp_path, write_suite
):
    """The decision is made when the suite expands: a conversion with nothing to convert is a
    problem of the suite, named at its key, not a failed cell."""
    with pytest.raises(SuiteError) as err:
        load_suite(write_suite(textwrap.dedent(SUITE).replace("    - single\n", "")))
    assert "hparams.pretrain_epochs: 2 converts the suite's `single` model" in str(err.value)
    assert "add `single` to the suite's methods with 2 epochs" in str(err.value)


def test_the_pretrain_decision_travels_on_the_cell(cells):
    """Each converting cell names the suite's `single` cell it converts, in memory and in its
    JSON (what a worker, a rank or a Slurm task rebuilds it from)."""
    single, convert = cells[0], cells[1]
    assert convert.pretrain == single and single.pretrain is None
    again = Cell.from_json(json.loads(json.dumps(convert.to_json())), validated=True)
    assert again.pretrain == single and again.pretrain.cell_id == single.cell_id
    assert again.cell_id == convert.cell_id  # not part of the identity


def test_diagnostics_and_schedule_are_recorded_per_epoch(cells, tmp_path):
    rec = run_cell(cells[2], tmp_path, progress=False)
    assert rec["status"] == "done", rec["error"]
    per_epoch = rec["diagnostics"]["per_epoch"]
    assert [d["epoch"] for d in per_epoch] == [1, 2]
    assert [d["tau"] for d in per_epoch] == pytest.approx([0.05, 5.0])  # linear, geometric in τ
    for d in per_epoch:
        assert 1.0 <= d["k_eff"] <= 4.0 and 0 < d["importance"] < 1
        assert set(d["layers"]) and d["l_div"] < 0
        assert d["num_features"] == 8 + 16 + 16  # width 8: 8, 16, 16 BatchNorm channels
    assert rec["history"][0]["train_reg"] < 0  # L_div is part of the training loss
    # the reporter reads the same record: k_eff of the last epoch
    from reports.records.results import records_to_frame

    frame = records_to_frame([rec])
    assert frame["k_eff"].iloc[0] == pytest.approx(per_epoch[-1]["k_eff"])


def test_regularizer_sign_and_schedule_endpoints():
    sig = METHODS.get("sigma_ens")
    hp = sig.hparams(
        **expand_hparams(
            sig, {"tau": 0.1, "tau_end": 10.0, "lam": 0.1, "lam_end": 0.0, "schedule": "cosine"}
        )[0]
    )
    model = sig.build(BuildContext("digits_cnn", (1, 8, 8), 8, 4), hp)
    model.set_progress(0, 10)
    assert model.current() == pytest.approx((0.1, 0.1))
    assert model.regularizer() < 0
    model.set_progress(9, 10)
    assert model.current() == pytest.approx((10.0, 0.0))
    # λ = 0 at the schedule's end: a zero term (λ is a device tensor the step reads without a
    # host read, so it cannot be branched on), which adds nothing to the loss or to γ's gradient
    reg = model.regularizer()
    assert reg.item() == 0.0
    gammas = [p for n, p in model.named_parameters() if n.endswith("gamma")]
    assert all(g.abs().sum() == 0 for g in torch.autograd.grad(reg, gammas))
    hp0 = sig.hparams(**expand_hparams(sig, {"lam": 0.0})[0])
    assert sig.build(BuildContext("digits_cnn", (1, 8, 8), 8, 4), hp0).regularizer() is None
