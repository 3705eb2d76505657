"""Per-image outcomes (harness/metrics/outcomes.py): their means are the record's metrics, the
runner keeps them beside the record, and `harness evaluate --add-only` adds them to a cell that
has none without changing the record's numbers."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.contract.outcomes import OUTCOMES_FILE
from harness.metrics.calibration import ece, ece_from_confidences
from harness.metrics.classification import brier, nll
from harness.metrics.outcomes import OutcomeAccumulator, save_outcomes
from reports.records.outcomes import load_outcomes


def test_means_equal_the_batch_metrics():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 500, 7, generator=gen) * 2, -1)  # (M, N, K)
    labels = torch.randint(0, 7, (500,), generator=gen)
    acc = OutcomeAccumulator()
    for lo in range(0, 500, 128):  # batch by batch, as the evaluation streams
        acc.update(probs[:, lo : lo + 128], labels[lo : lo + 128])
        acc.update(probs[:1, lo : lo + 128], labels[lo : lo + 128], "ts")
    out = acc.arrays()
    assert sorted(out) == sorted(
        ["correct", "nll", "brier", "confidence", "ts/nll", "ts/brier", "ts/confidence"]
    )
    mean = probs.double().mean(0)
    assert out["correct"].dtype == np.bool_ and out["nll"].dtype == np.float32
    assert out["correct"].mean() == pytest.approx((mean.argmax(-1) == labels).double().mean())
    assert out["nll"].mean() == pytest.approx(nll(probs, labels).item(), rel=1e-6)
    assert out["brier"].mean() == pytest.approx(brier(probs, labels).item(), rel=1e-6)
    np.testing.assert_allclose(out["confidence"], mean.amax(-1).numpy(), rtol=1e-6)
    assert out["ts/nll"].mean() == pytest.approx(nll(probs[:1], labels).item(), rel=1e-6)
    conf = torch.from_numpy(out["confidence"]).double()
    correct = torch.from_numpy(out["correct"]).double()
    assert ece_from_confidences(conf, correct).item() == pytest.approx(
        ece(probs, labels).item(), abs=1e-6
    )


def test_saved_file_round_trips_and_damage_reads_as_none(tmp_path):
    arrays = {"correct": np.array([True, False]), "nll": np.array([0.1, 2.0], np.float32)}
    save_outcomes(tmp_path, arrays)
    back = load_outcomes(tmp_path)
    assert back is not None and set(back) == {"correct", "nll"}
    np.testing.assert_array_equal(back["nll"], arrays["nll"])
    (tmp_path / OUTCOMES_FILE).write_bytes(b"PK\x03\x04 truncated")
    assert load_outcomes(tmp_path) is None
    assert load_outcomes(tmp_path / "nowhere") is None


SUITE = """
name: outcomes
grid:
  datasets: [digits_hard]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0]
  methods: [{name: deep_ensemble, M: [2]}]
recipe: {epochs: 1, batch_size: 32}
evaluation: {cost: false, calibrate: true, calibration: 200}
"""


def test_runner_keeps_outcomes_and_add_only_restores_them(tmp_path, capsys):
    suite = tmp_path / "outcomes.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    results = tmp_path / "results"
    assert (
        main(["run", str(suite), "--results", str(results), "-q", "--executor", "inprocess"]) == 0
    )
    (rec_path,) = (results / "outcomes").glob("*/record.json")
    cell_dir = rec_path.parent
    rec = json.loads(rec_path.read_text())
    out = load_outcomes(cell_dir)
    clean, ts = rec["metrics"]["clean"], rec["metrics"]["calibration"]["ts"]["clean"]
    assert len(out["nll"]) == sum(clean["reliability"]["count"])
    assert out["correct"].mean() == pytest.approx(clean["acc"], abs=1e-12)
    assert out["nll"].mean() == pytest.approx(clean["nll"], rel=1e-5)
    assert out["brier"].mean() == pytest.approx(clean["brier"], rel=1e-5)
    assert out["ts/nll"].mean() == pytest.approx(ts["nll"], rel=1e-5)

    # A cell from before outcomes were kept: add-only writes them from final.pt, the record's
    # metrics are unchanged.
    kept = {k: v.copy() for k, v in out.items()}
    (cell_dir / OUTCOMES_FILE).unlink()
    assert main(["evaluate", str(results / "outcomes"), "--add-only"]) == 0
    after = json.loads(rec_path.read_text())
    assert after["metrics"] == rec["metrics"]
    again = load_outcomes(cell_dir)
    for key, values in kept.items():
        np.testing.assert_array_equal(again[key], values)
