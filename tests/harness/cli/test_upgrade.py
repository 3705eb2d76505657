"""``harness upgrade``: records written before methods declared their diagnostics get the
registered declarations, and records written before datasets declared their near/far OOD groups
get those, measurements untouched; damaged records and unknown methods are left alone and
named."""

from __future__ import annotations

import json

from harness.cli import main
from harness.registry import METHODS
from reports.records.flatten import flatten_record as flatten
from tests.record_factory import make_record, write_records


def _old(rec: dict) -> dict:
    """The record as the engine wrote it before declarations existed."""
    rec = json.loads(json.dumps(rec))
    rec["diagnostics"].pop("declared", None)
    return rec


def test_upgrade_adds_the_methods_declarations_and_changes_nothing_measured(tmp_path, capsys):
    sigma = _old(make_record(method="sigma_ens", hparams={"tau": 0.1}, k_eff=1.7, seed=0))
    single = _old(make_record(method="single", M=1, seed=0))
    paths = write_records(tmp_path, [sigma, single])
    before = flatten(json.loads(paths[0].read_text()))
    assert "k_eff" in before and '"figure": null' in before["diagnostics_shown"]  # fallback

    assert main(["upgrade", str(tmp_path), "--dry-run"]) == 0
    assert "would add diagnostic declarations to 2 record(s) and OOD groups to 0" in (
        capsys.readouterr().out
    )
    assert "declared" not in json.loads(paths[0].read_text())["diagnostics"]

    assert main(["upgrade", str(tmp_path)]) == 0
    assert "declarations to 2 record(s) and OOD groups to 0; 0 already" in capsys.readouterr().out
    new = json.loads(paths[0].read_text())
    expected = [d.to_json() for d in METHODS.get("sigma_ens").diagnostics]
    assert new["diagnostics"]["declared"] == json.loads(json.dumps(expected))
    assert json.loads(paths[1].read_text())["diagnostics"]["declared"] == []  # single: none
    for key in ("metrics", "history", "config", "cell_id"):
        assert new[key] == sigma[key]
    assert new["diagnostics"]["per_epoch"] == sigma["diagnostics"]["per_epoch"]
    after = flatten(new)
    assert after["k_eff"] == before["k_eff"] == 1.7
    figures = [d["figure"] for d in json.loads(after["diagnostics_shown"]) if d["figure"]]
    assert [f["x"] for f in figures] == ["tau"]  # the declared k_eff-vs-τ figure is back

    assert main(["upgrade", str(tmp_path)]) == 0  # idempotent
    assert "declarations to 0 record(s) and OOD groups to 0; 2 already" in capsys.readouterr().out


def test_upgrade_leaves_damaged_records_and_unknown_methods_alone(tmp_path, capsys):
    foreign = _old(make_record(method="sigma_ens", seed=1))
    foreign["config"]["method"] = "not_a_method"
    (path,) = write_records(tmp_path, [foreign])
    damaged = tmp_path / "deadbeefdeadbeef" / "record.json"
    damaged.parent.mkdir()
    damaged.write_text('{"cell_id": ')
    text = path.read_text()

    assert main(["upgrade", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "OOD groups to 0; 0 already had what they need; 2 left untouched" in out
    assert "unknown method 'not_a_method'" in out and "damaged record" in out
    assert path.read_text() == text and damaged.read_text() == '{"cell_id": '


def test_upgrade_of_a_missing_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["upgrade", str(tmp_path / "nope")]) == 2
    assert "no such results folder" in capsys.readouterr().err


def test_upgrade_adds_the_datasets_ood_groups_and_the_near_far_means_follow(tmp_path, capsys):
    """A record from before datasets declared their groups has no near/far means (the reporter
    keeps no table of its own); upgraded, it has the ones its dataset declares."""
    old = make_record(dataset="fashion_mnist_10k", ood_sets=("mnist", "photos_28", "svhn"))
    old["evaluation"].pop("ood_groups", None)
    (path,) = write_records(tmp_path, [old])
    before = flatten(json.loads(path.read_text()))
    assert not [k for k in before if k.startswith(("ood_near/", "ood_far/"))]

    assert main(["upgrade", str(tmp_path)]) == 0
    assert "OOD groups to 1;" in capsys.readouterr().out
    new = json.loads(path.read_text())
    assert new["evaluation"]["ood_groups"] == {"mnist": "near", "photos_28": "far"}  # svhn: none
    assert new["metrics"] == old["metrics"]
    after = flatten(new)
    ood = old["metrics"]["ood"]
    assert after["ood_near/msp/auroc"] == ood["mnist"]["msp"]["auroc"]
    assert after["ood_far/msp/auroc"] == ood["photos_28"]["msp"]["auroc"]
