"""`harness evaluate`: new evaluations on finished cells without retraining."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

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
    assert set(after["metrics"]["ood"]["digits_heldout"]) == {
        "msp", "entropy", "mi", "energy", "max_logit"
    }  # fmt: skip
    assert [c["severity"] for c in after["metrics"]["corruption"]["cells"]] == [1, 5]
    assert after["evaluation"]["ood"] == ["digits_heldout"]


CALIBRATED = """
name: recal
grid:
  datasets: [digits_hard]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0]
  methods: [single, {name: deep_ensemble, M: [2]}]
recipe: {epochs: 2, batch_size: 32}
evaluation:
  cost: false
  ood: [digits_hard_heldout]
  corruptions: [contrast]
  severities: [1, 5]
"""


def _leaves(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}")
    else:
        yield prefix, json.dumps(obj)


def _finished_uncalibrated(tmp_path) -> Path:
    """The results folder of :data:`CALIBRATED` run without calibration (two done cells)."""
    suite = tmp_path / "recal.yaml"
    suite.write_text(textwrap.dedent(CALIBRATED))
    results = tmp_path / "results"
    assert (
        main(["run", str(suite), "--results", str(results), "-q", "--executor", "inprocess"]) == 0
    )
    return results / "recal"


def test_add_only_adds_calibration_and_keeps_every_other_value(tmp_path, capsys):
    """`harness evaluate --add-only` on finished records: the post-hoc calibration block and the
    reliability bins are added from final.pt; every value the records held is byte-identical."""
    folder = _finished_uncalibrated(tmp_path)
    paths = sorted(folder.glob("*/record.json"))
    assert len(paths) == 2
    before = {p: json.loads(p.read_text()) for p in paths}
    texts = {p: p.read_text() for p in paths}
    assert all("calibration" not in r["metrics"] for r in before.values())

    calibrated = tmp_path / "recal_cal.yaml"
    calibrated.write_text(textwrap.dedent(CALIBRATED) + "  calibrate: true\n  calibration: 200\n")
    assert main(["evaluate", str(folder), "--suite", str(calibrated), "--add-only"]) == 0
    assert "completed 2 cells" in capsys.readouterr().out
    for p in paths:
        old, new = before[p], json.loads(p.read_text())
        new_leaves = dict(_leaves(new))
        changed = [k for k, v in _leaves(old) if k not in new_leaves or new_leaves[k] != v]
        # the evaluation block gains the calibration settings (absent before = defaults)
        assert all(k.startswith(".evaluation.calibrat") for k in changed), changed
        assert new["finished_at"] == old["finished_at"]
        cal = new["metrics"]["calibration"]
        assert cal["fitted_on"] == "calibration" and cal["n"] == 200
        assert cal["temperature"] > 0
        # a temperature changes no top label: accuracy bit-identical, raw and scaled
        assert cal["ts"]["clean"]["acc"] == old["metrics"]["clean"]["acc"]
        assert cal["ts"]["corruption"]["mean"]["acc"] == old["metrics"]["corruption"]["mean"]["acc"]
        assert set(cal["ts"]["ood"]["digits_hard_heldout"]) == {"msp", "entropy"}
        for name in ("thr", "aps", "raps"):
            block = cal["conformal"][name]
            clean = block["clean"]  # sets as the methods define them may be empty (size 0)
            assert 0 < clean["coverage"] <= clean["coverage_fallback"] <= 1
            assert 0 <= clean["empty_rate"] < 1 and clean["size_fallback"] >= 1
            assert clean["size"] == pytest.approx(clean["size_fallback"] - clean["empty_rate"])
            assert set(block["corruption"]["per_severity"]) == {"1", "5"}
        bins = new["metrics"]["clean"]["reliability"]
        assert sum(bins["count"]) == 289 and len(bins["count"]) == 15
        assert new["evaluation"]["calibrate"] is True
        # what the evaluation cost is kept beside the run's own timings, which stay as they were
        (run,) = new["timings"]["reevaluations"]
        assert run["add_only"] is True and run["cpu_s"] > 0 and run["wall_s"] > 0
        from harness.engine.environment import git_commit

        # the evaluating code's commit beside the training run's own (issue 49, provenance)
        assert run["git_commit"] == git_commit() and run["git_commit"] not in ("", None)
        assert new["environment"]["git_commit"] == old["environment"]["git_commit"]
        # the calibration split's NLL before and after the temperature: TS lowers it there
        nll = cal["split_nll"]
        assert set(nll) == {"raw", "ts"} and 0 < nll["ts"] <= nll["raw"]
        assert {k: new["timings"][k] for k in old["timings"]} == old["timings"]
        # running it again adds nothing and changes nothing
        texts[p] = p.read_text()
    assert main(["evaluate", str(folder), "--suite", str(calibrated), "--add-only"]) == 0
    assert all(p.read_text() == texts[p] for p in paths)


def test_add_only_names_the_added_sets_in_the_evaluation_block():
    """A record completed with a new OOD set or corruption family says so in its evaluation
    block (the block names what its metrics hold); what it had keeps its place; a corruption
    block it already held is kept whole, and so are its settings."""
    from harness.engine.reevaluate import added_evaluation

    cal = {"calibrate": True, "calibration": 500, "calibrate_members": False,
           "conformal_alpha": 0.1}  # fmt: skip
    old = {"ood": ["a"], "corruptions": [], "severities": [1, 5], "cost": True,
           "calibrate": False}  # fmt: skip
    new = {"ood": ["b", "a"], "corruptions": ["all"], "severities": [1, 3], "cost": False, **cal}
    assert added_evaluation(old, new, {"clean": {}, "ood": {"a": {}}}) == {
        "ood": ["a", "b"],
        "corruptions": ["all"],
        "severities": [1, 3],
        "cost": True,
        **cal,
    }
    had = {**old, "corruptions": ["contrast"]}
    kept = added_evaluation(had, new, {"corruption": {"cells": []}})
    assert kept["corruptions"] == ["contrast"] and kept["severities"] == [1, 5]
    assert added_evaluation(None, new, {}) == {**new, "ood": ["b", "a"]}


def test_calibration_changes_no_raw_number_of_a_stochastic_method(tmp_path):
    """MC Dropout draws its masks from the global generator in eval: the held-out pass of the
    calibration must not shift the test set's draws (every raw number as without calibration)."""
    base = textwrap.dedent(CALIBRATED).replace(
        "methods: [single, {name: deep_ensemble, M: [2]}]",
        "methods: [{name: mc_dropout, M: [2], hparams: {dropout_rate: 0.3}}]",
    )
    records = {}
    for name, extra in (("plain", ""), ("cal", "  calibrate: true\n  calibration: 200\n")):
        suite = tmp_path / f"{name}.yaml"
        suite.write_text(base.replace("name: recal", f"name: {name}") + extra)
        out = tmp_path / "results"
        assert (
            main(["run", str(suite), "--results", str(out), "-q", "--executor", "inprocess"]) == 0
        )
        (path,) = (out / name).glob("*/record.json")
        records[name] = json.loads(path.read_text())
    plain, cal = records["plain"]["metrics"], records["cal"]["metrics"]
    assert "calibration" in cal and "calibration" not in plain
    assert cal["clean"] == plain["clean"]
    assert cal["corruption"] == plain["corruption"] and cal["ood"] == plain["ood"]


def test_add_only_refuses_weights_that_are_not_the_records(tmp_path, capsys):
    """A final.pt that does not reproduce the record's clean metrics (retrained, or another
    cell's) adds nothing: one warning line, the record byte-identical, the other cells done;
    the command exits 1 naming the cell it could not evaluate."""
    folder = _finished_uncalibrated(tmp_path)
    first, second = sorted(folder.glob("*/record.json"))
    rec = json.loads(first.read_text())
    rec["metrics"]["clean"]["acc"] -= 0.01  # as if final.pt came from another training
    first.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    tampered = first.read_text()
    calibrated = tmp_path / "recal_cal.yaml"
    calibrated.write_text(textwrap.dedent(CALIBRATED) + "  calibrate: true\n  calibration: 200\n")
    capsys.readouterr()
    assert main(["evaluate", str(folder), "--suite", str(calibrated), "--add-only"]) == 1
    out = capsys.readouterr()
    assert "completed 1 cells" in out.out
    assert out.err.splitlines()[-1] == (
        "error: 1 of 2 cells asked for could not be evaluated (their records are unchanged): "
        f"{first.parent.name}"
    )
    (line,) = [x for x in out.err.splitlines() if "not the weights of this record" in x]
    assert str(first.parent / "final.pt") in line and "acc" in line and "nothing added" in line
    assert first.read_text() == tampered
    assert "calibration" in json.loads(second.read_text())["metrics"]
