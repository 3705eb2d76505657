"""σN-Ens as a harness method: pretrained conversion of a trained digits model, in-cell
pretraining, τ/λ schedules and the per-epoch diagnostics in the record."""

from __future__ import annotations

import textwrap

import pytest
import torch

from harness.registries import METHODS
from harness.runner import build_model, load_backbone_state, load_data, run_cell
from harness.suite import expand_hparams, load_suite
from methods.base import BuildContext

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
    assert gammas and gammas[0].std() > 0.5  # members do have different, random γ
    for m in range(4):
        torch.testing.assert_close(out[m], ref, atol=1e-5, rtol=0)


def test_pretrain_then_convert_in_one_cell(cells, tmp_path):
    cell = cells[1]
    rec = run_cell(cell, tmp_path, progress=False)
    assert rec["status"] == "done", rec["error"]
    assert (tmp_path / cell.cell_id / "pretrain" / "final.pt").exists()
    assert [h["epoch"] for h in rec["history"]] == [1]  # the fine-tuning phase
    assert rec["config"]["recipe"]["epochs"] == 1 and rec["config"]["recipe"]["lr"] == 0.01
    assert rec["metrics"]["clean"]["acc"] > 0.5  # starts from a trained model


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
    from reports.aggregate import records_to_frame

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
    assert model.regularizer() is None  # λ = 0: no term at all
