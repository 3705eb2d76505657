"""`harness evaluate`: new evaluations on finished cells without retraining."""

from __future__ import annotations

import json
import textwrap

from harness.cli import main

SUITE = """
name: reeval
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0]
  methods: [{name: sigma_ens, M: [2]}]
recipe: {epochs: 1}
evaluation: {cost: false}
"""


def test_added_ood_set_is_evaluated_from_saved_weights(tmp_path, capsys):
    first = tmp_path / "reeval.yaml"
    first.write_text(textwrap.dedent(SUITE))
    results = tmp_path / "results"
    assert main(["run", str(first), "--results", str(results), "-q"]) == 0
    folder = results / "reeval"
    (rec_path,) = folder.glob("*/record.json")
    before = json.loads(rec_path.read_text())
    weights = rec_path.parent / "final.pt"
    mtime = weights.stat().st_mtime_ns
    assert "ood" not in before["metrics"]

    second = tmp_path / "reeval_ood.yaml"
    second.write_text(
        textwrap.dedent(SUITE).replace(
            "evaluation: {cost: false}",
            "evaluation: {cost: false, ood: [digits_heldout], corruptions: [contrast],"
            " severities: [1, 5]}",
        )
    )
    assert main(["evaluate", str(folder), "--suite", str(second)]) == 0
    assert "re-evaluated 1 cells" in capsys.readouterr().out
    after = json.loads(rec_path.read_text())
    assert after["cell_id"] == before["cell_id"] and after["history"] == before["history"]
    assert weights.stat().st_mtime_ns == mtime  # no retraining
    assert after["metrics"]["clean"] == before["metrics"]["clean"]  # same weights, same numbers
    assert set(after["metrics"]["ood"]["digits_heldout"]) == {"msp", "entropy", "mi"}
    assert [c["severity"] for c in after["metrics"]["corruption"]["cells"]] == [1, 5]
    assert after["evaluation"]["ood"] == ["digits_heldout"]
