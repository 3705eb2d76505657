"""`harness.api.paired(..., images=True)`: the seeds × images bootstrap on a real results folder
finds each row's cells (its outcomes give back the row's mean difference exactly) and says why a
row has none."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import harness.api as h
from harness.cli import main
from reports.records.outcomes import cell_folder, load_outcomes

SUITE = """
name: paired_images
grid:
  datasets: [digits_hard]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0, 1]
  methods: [single, {name: deep_ensemble, M: [2]}]
recipe: {epochs: 1, batch_size: 32}
evaluation: {cost: false, calibrate: true, calibration: 200}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("paired_images")
    suite = root / "s.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    results = root / "results"
    assert (
        main(["run", str(suite), "--results", str(results), "-q", "--executor", "inprocess"]) == 0
    )
    return results / "paired_images"


def test_bootstrap_columns_come_from_the_rows_own_cells(folder):
    table = h.paired(folder, "single", ["acc", "nll", "ts/nll"], test="t",
                     images=True, replicates=500)  # fmt: skip
    cells = h.load_results(folder)
    row = table[table["metric"] == "acc"].iloc[0]
    assert row["method"] == "deep_ensemble" and row["boot_note"] == ""

    def outcomes(method: str) -> list[dict]:
        mine = cells[cells["method"] == method].sort_values("seed")
        return [
            load_outcomes(cell_folder(folder, s, c)) for s, c in zip(mine["suite"], mine["cell_id"])
        ]

    ens, single = outcomes("deep_ensemble"), outcomes("single")
    per_seed = [e["correct"].mean() - s["correct"].mean() for e, s in zip(ens, single)]
    assert row["mean_diff"] == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert row["n_images"] == len(ens[0]["correct"])
    # The test set's share alone: the per-image differences' SD over √N (the bootstrap adds the
    # seeds' share on top).
    d = np.mean([e["correct"].astype(float) - s["correct"] for e, s in zip(ens, single)], axis=0)
    assert row["boot_se"] >= 0.9 * d.std() / np.sqrt(len(d))
    assert row["boot_lo"] < row["mean_diff"] < row["boot_hi"]
    ts = table[table["metric"] == "ts/nll"].iloc[0]
    assert ts["boot_note"] == "" and np.isfinite(ts["boot_p"])
    # single+TS against single: its outcomes are the calibrated ones of the same cells.
    derived = table[(table["method"] == "single+TS") & (table["metric"] == "nll")].iloc[0]
    assert derived["boot_note"] == ""
    per_seed = [s["ts/nll"].astype(float).mean() - s["nll"].astype(float).mean() for s in single]
    assert derived["mean_diff"] == pytest.approx(np.mean(per_seed), rel=1e-4)


def test_a_cell_without_outcomes_gives_a_reason(folder, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    cells = h.load_results(copy)
    first = cells[cells["method"] == "single"].iloc[0]
    (cell_folder(copy, first["suite"], first["cell_id"]) / "outcomes.npz").unlink()
    table = h.paired(copy, "single", ["acc"], test="t", images=True, replicates=100)
    assert set(table["boot_note"]) == {"a cell has no outcomes.npz"}
    assert np.isnan(table["boot_se"]).all()


def test_harness_report_images_prints_and_writes_the_same_intervals(folder, tmp_path, capsys):
    import pandas as pd

    assert main(["report", str(folder), "--images", "--reference", "single", "--test", "t",
                 "--no-figures", "--output", str(tmp_path)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "95% seeds×images" in out and "deep_ensemble M=2" in out
    written = pd.read_csv(tmp_path / "paired_images.csv")
    assert set(written["metric"]) == {"acc", "nll", "ece", "brier", "ts/nll", "ts/ece"}
    api = h.paired(folder, "single", ["acc", "nll"], test="t", images=True)
    for metric in ("acc", "nll"):
        a = api[(api["method"] == "deep_ensemble") & (api["metric"] == metric)].iloc[0]
        w = written[(written["method"] == "deep_ensemble") & (written["metric"] == metric)].iloc[0]
        assert (w["boot_lo"], w["boot_hi"]) == pytest.approx((a["boot_lo"], a["boot_hi"]))
        assert f"{a['boot_p']:.3f}" in out
