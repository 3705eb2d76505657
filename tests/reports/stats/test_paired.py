"""The paired table's reference at one ensemble size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness.api as h


def test_a_reference_at_one_ensemble_size_pairs_the_methods_other_sizes_by_seed():
    """`sigma_ens:M=4` as the reference: σN-Ens at M = 2 and 8 against M = 4, seed by seed
    (section M3 of the claims study compares ensemble sizes this way)."""
    folder = Path(__file__).resolve().parents[3] / "docs" / "results" / "claims_fmnist_m_scaling"
    acc: dict[tuple[int, int], float] = {}
    for path in folder.glob("*/record.json"):
        rec = json.loads(path.read_text())
        if rec["config"]["method"] == "sigma_ens" and rec["status"] == "done":
            acc[rec["config"]["M"], rec["config"]["seed"]] = rec["metrics"]["clean"]["acc"]
    table = h.paired(folder, "sigma_ens:M=4", ["acc"])
    mine = table[table["method"] == "sigma_ens"].set_index("M")
    assert sorted(mine.index) == [2, 8] and set(mine["reference_M"]) == {4}
    for m in (2, 8):
        want = sum(acc[m, s] - acc[4, s] for s in (0, 1)) / 2
        assert mine.loc[m, "mean_diff"] == pytest.approx(want, abs=1e-12)
        assert mine.loc[m, "n_pairs"] == 2
