"""The contract layer: cell identity and JSON form, the record (schema 2 and schema 1), manifest."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.contract import (
    CONVENTIONS,
    ENSEMBLE_METRIC_KEYS,
    SCHEMA_VERSION,
    Cell,
    Evaluation,
    Recipe,
    RecordError,
    build_manifest,
    expected_cells,
    identity,
    label_of,
    new_record,
    parse_name_values,
    read_manifest,
    validate_record,
)


def make_cell(**over) -> Cell:
    base = dict(
        suite="s",
        dataset="digits",
        backbone="digits_cnn",
        backbone_kwargs={},
        method="sigma_ens",
        M=4,
        hparams={"tau": 0.5, "lam": 0.001, "widths": [1, 2]},
        seed=3,
        recipe=Recipe(epochs=2, milestones=(1,)),
        evaluation=Evaluation(ood=("svhn",)),
        defaults={"tau": 1.0, "lam": 0.001, "widths": [1, 2]},
    )
    return Cell(**{**base, **over})


def test_cell_json_round_trip_keeps_id_types_and_label():
    cell = make_cell()
    back = Cell.from_json(json.loads(json.dumps(cell.to_json())))
    assert back == cell and back.cell_id == cell.cell_id
    assert back.recipe.milestones == (1,) and back.evaluation.ood == ("svhn",)  # lists → tuples
    assert back.label == "digits/digits_cnn/sigma_ens(M=4,tau=0.5)/seed3"
    # The defaults only shorten the label: they are neither configuration nor identity.
    assert make_cell(defaults={}).cell_id == cell.cell_id
    assert make_cell(defaults={}).label == (
        "digits/digits_cnn/sigma_ens(M=4,lam=0.001,tau=0.5,widths=[1, 2])/seed3"
    )
    assert len(cell.cell_id) == 16 and make_cell(seed=4).cell_id != cell.cell_id


def test_cell_from_json_validates_recipe_through_the_one_builder():
    data = make_cell().to_json()
    data["recipe"]["lr"] = -1.0
    data["recipe"]["optimiser"] = "sgd"
    problems = r"recipe\.optimiser: unknown key.*recipe\.lr: must be > 0"
    with pytest.raises(ValueError, match=problems):
        Cell.from_json(data)
    old = make_cell().to_json()
    del old["hparam_defaults"]  # a cell.json written before defaults were stored
    assert Cell.from_json(old).defaults == {}


def test_new_record_is_schema_2_with_label_and_shown_hparams():
    rec = new_record(make_cell(), {"python": "3.11"}, "2026-01-01T00:00:00+00:00")
    assert rec["schema_version"] == SCHEMA_VERSION == 2
    assert rec["label"] == "digits/digits_cnn/sigma_ens(M=4,tau=0.5)/seed3"
    assert rec["hparams_shown"] == {"tau": 0.5}
    assert rec["conventions"] == CONVENTIONS and "fpr95" in rec["conventions"]["ood"]
    rec.update(status="done", metrics={"clean": dict.fromkeys(ENSEMBLE_METRIC_KEYS, 0.5)})
    rec["finished_at"] = "2026-01-01T00:01:00+00:00"
    validate_record(rec)
    assert identity(rec) == ("digits", "digits_cnn", "sigma_ens", 4, "tau=0.5")
    bad = dict(rec)
    del bad["label"]
    with pytest.raises(RecordError, match=r"record lacks keys \['label'\]"):
        validate_record(bad)


def test_schema_1_record_still_reads_with_every_hparam_shown():
    rec = new_record(make_cell(), {}, "t0")
    for key in ("label", "hparams_shown"):
        del rec[key]
    rec.update(schema_version=1, status="failed", error={"type": "E", "message": "m"})
    rec["finished_at"] = "t1"
    validate_record(rec)  # schema 1 stays readable
    assert identity(rec)[4] == "lam=0.001, tau=0.5, widths=[1, 2]"
    assert label_of(rec) == (
        "digits/digits_cnn/sigma_ens(M=4,lam=0.001,tau=0.5,widths=[1, 2])/seed3"
    )
    with pytest.raises(RecordError, match=r"schema_version 7 is not one of \(1, 2\)"):
        validate_record(dict(rec, schema_version=7))


def test_manifest_lists_expected_cells_with_labels(tmp_path):
    a, b = make_cell(seed=0), make_cell(seed=1)
    old = build_manifest("s", "old.yaml", [make_cell(seed=9)])
    manifest = build_manifest("s", "s.yaml", [a, b], old)
    assert len(manifest["cells"]) == 3 and manifest["current"] == [a.cell_id, b.cell_id]
    (tmp_path / "suite.json").write_text(json.dumps(manifest))
    expected = expected_cells(read_manifest(tmp_path))
    assert [e["cell_id"] for e in expected] == [a.cell_id, b.cell_id]
    assert expected[1]["label"] == b.label and expected[1]["config"] == b.config()
    with pytest.raises(FileNotFoundError, match=r"holds no suite\.json"):
        read_manifest(tmp_path / "nothing")


def test_parse_name_values_reads_yaml_scalars():
    assert parse_name_values("sigma_ens:tau=0.001,flag=true,name=x") == (
        "sigma_ens",
        {"tau": 0.001, "flag": True, "name": "x"},
    )
    with pytest.raises(ValueError, match=r"expected name:key=value"):
        parse_name_values("single:oops")


def test_replace_keeps_defaults_out_of_equality():
    cell = make_cell()
    assert dataclasses.replace(cell, defaults={}) == cell


def test_reporter_names_rows_from_the_record_not_todays_defaults():
    from reports.records.results import records_to_frame

    def done(cell: Cell, **over) -> dict:
        rec = new_record(cell, {}, "t0")
        rec.update(status="done", metrics={"clean": {"acc": 0.5}}, finished_at="t1", **over)
        return rec

    # Two seeds run when tau=0.5 differed from the default; a third, schema 1, stored no shown
    # hyper-parameters: the reporter never asks the method what its defaults are today.
    a, b = done(make_cell(seed=0)), done(make_cell(seed=1))
    old = done(make_cell(seed=2), schema_version=1)
    del old["label"], old["hparams_shown"]
    frame = records_to_frame([a, b, old]).set_index("seed")
    assert frame.loc[0, "hparams"] == frame.loc[1, "hparams"] == "tau=0.5"
    assert frame.loc[2, "hparams"] == "lam=0.001, tau=0.5, widths=[1, 2]"
    assert frame.loc[0, "label"] == "digits/digits_cnn/sigma_ens(M=4,tau=0.5)/seed0"
    assert frame.loc[2, "label"].startswith("digits/digits_cnn/sigma_ens(M=4,lam=0.001,")
