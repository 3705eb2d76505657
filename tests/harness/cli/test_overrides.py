"""Command-line overrides, ``--only``, ``--dry-run``, and speed-only settings out of the cell id."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket

import pytest

from harness.cli import main
from harness.config.includes import SuiteError
from harness.config.overrides import CellFilter, parse_assignment, split_conditions
from harness.config.parse import load_suite
from harness.contract import SPEED_ONLY_RECIPE, Cell, Evaluation, Recipe, read_manifest
from harness.executors.base import RunOutcome
from tests.conftest import REPO
from tests.record_factory import make_record, write_records

SUITE = """
name: ov
grid:
  datasets: [digits]
  backbones: [digits_cnn]
  M: [2]
  seeds: [0, 1]
  methods:
    - single
    - name: sigma_ens
      hparams: {tau: 1.0}
recipe: {epochs: 3, batch_size: 16}
evaluation: {ood: [digits_heldout]}
"""


def _cell(**recipe) -> Cell:
    return Cell("s", "digits", "digits_cnn", {}, "single", 1, {}, 0, Recipe(**recipe), Evaluation())


# --- speed-only settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value", [("compile", True), ("channels_last", False), ("eval_batch_size", 64)]
)
def test_speed_only_setting_keeps_the_cell_id_and_is_still_in_the_config(field, value):
    base = _cell()
    toggled = _cell(**{field: value})
    assert getattr(base.recipe, field) != value  # really toggled
    assert toggled.cell_id == base.cell_id
    assert toggled.config()["recipe"][field] == value  # the record's config states it
    assert field in SPEED_ONLY_RECIPE


@pytest.mark.parametrize("field,value", [("lr", 0.1), ("amp", False), ("epochs", 3)])
def test_result_changing_setting_changes_the_cell_id(field, value):
    assert _cell(**{field: value}).cell_id != _cell().cell_id


def test_cell_json_round_trip_keeps_id_and_speed_settings():
    cell = _cell(eval_batch_size=64, compile=True)
    back = Cell.from_json(json.loads(json.dumps(cell.to_json())))
    assert back.cell_id == cell.cell_id
    assert back.recipe.eval_batch_size == 64 and back.recipe.compile is True


# --- overrides -----------------------------------------------------------------------------------


def test_every_kind_of_override_path(write_suite):
    path = write_suite(SUITE)
    suite = load_suite(
        path,
        [
            "recipe.epochs=1",  # a mapping entry
            "recipe.lr=0.2",  # one the file does not set
            "grid.seeds=[0, 5]",  # a whole list
            "evaluation.ood=[]",  # an empty list
            "grid.methods.sigma_ens.hparams.tau=0.5",  # a list entry by name
            "grid.methods.single.recipe.epochs=2",  # a bare name becomes a mapping
            "grid.backbones[0].kwargs={}",  # a list entry by position
        ],
    )
    assert suite.recipe.epochs == 1 and suite.recipe.lr == 0.2
    assert suite.grid.seeds == (0, 5)
    assert suite.evaluation.ood == ()
    sigma = next(m for m in suite.grid.methods if m.name == "sigma_ens")
    single = next(m for m in suite.grid.methods if m.name == "single")
    assert sigma.hparams["tau"] == 0.5 and single.recipe == {"epochs": 2}
    assert suite.overrides[0] == "recipe.epochs=1" and len(suite.overrides) == 7
    cells = suite.cells()
    assert sorted({c.seed for c in cells}) == [0, 5]
    assert {c.recipe.epochs for c in cells if c.method == "single"} == {2}


def test_later_override_wins(write_suite):
    suite = load_suite(write_suite(SUITE), ["recipe.epochs=1", "recipe.epochs=4"])
    assert suite.recipe.epochs == 4


@pytest.mark.parametrize(
    "override,message",
    [
        ("recipe.epochs=abc", "override recipe.epochs=abc: expected int, got str 'abc'"),
        ("recipe.epoch=2", "override recipe.epoch=2: unknown key. Did you mean 'epochs'?"),
        (
            "grid.methods.sigma_ens.hparams.tau=x",
            "override grid.methods.sigma_ens.hparams.tau=x: expected float, got str 'x'",
        ),
        ("grid.seeds=[a]", "override grid.seeds=[a]: grid.seeds[0]: expected int, got str 'a'"),
        ("recipe.lr=-1", "override recipe.lr=-1: must be > 0, got -1"),
        (
            "grid.methods.nope.M=2",
            "override grid.methods.nope.M=2: grid.methods has no entry named 'nope' "
            "(single, sigma_ens)",
        ),
        (
            "grid.backbones[3].kwargs.w=1",
            "override grid.backbones[3].kwargs.w=1: grid.backbones has 1 entries, no index 3",
        ),
        ("recipe.epochs.x=1", "override recipe.epochs.x=1: recipe.epochs is 3, not a mapping"),
        ("recipe.lr=[1", "override recipe.lr=[1: invalid YAML value"),
        ("recipe", "override recipe: expected KEY=VALUE"),
    ],
)
def test_a_bad_override_is_named_in_the_error(write_suite, override, message):
    with pytest.raises(SuiteError, match="^" + re.escape(message)):
        load_suite(write_suite(SUITE), [override])


def test_problems_of_the_file_still_name_the_file(write_suite):
    path = write_suite(SUITE.replace("epochs: 3", "epochs: three"))
    with pytest.raises(SuiteError, match=r"suite\.yaml: recipe\.epochs: expected int"):
        load_suite(path, ["recipe.lr=0.1"])


def test_parse_assignment_reads_yaml_values():
    assert parse_assignment("a.b=[0, 1]") == ("a.b", [0, 1])
    assert parse_assignment("a={x: 1}") == ("a", {"x": 1})
    assert parse_assignment("a=") == ("a", None)
    assert parse_assignment("a=on") == ("a", True)
    assert split_conditions("tau=[1,2],seed=0") == ["tau=[1,2]", "seed=0"]


# --- --only --------------------------------------------------------------------------------------


def test_only_filters_on_cell_fields_and_hparams(write_suite):
    cells = load_suite(write_suite(SUITE)).cells()
    assert len(cells) == 4  # (single M=1 + sigma_ens M=2) × 2 seeds
    picked = CellFilter(["method=sigma_ens,seed=0"]).select(cells)
    assert [(c.method, c.seed) for c in picked] == [("sigma_ens", 0)]
    assert len(CellFilter(["method=single,method=sigma_ens", "seed=1"]).select(cells)) == 2
    assert [c.method for c in CellFilter(["tau=1.0"]).select(cells)] == ["sigma_ens"] * 2
    assert [c.M for c in CellFilter(["M=2,dataset=digits,backbone=digits_cnn"]).select(cells)] == [
        2,
        2,
    ]
    with pytest.raises(SuiteError, match=r"^--only colour: unknown key; valid keys: method, M"):
        CellFilter(["colour=red"]).select(cells)
    # A value no cell has is named (not dropped while its alternatives run), with the grid's.
    with pytest.raises(SuiteError, match=r"^--only seed=7: no cell of the suite has seed 7 \("):
        CellFilter(["seed=1,seed=7"]).select(cells)
    with pytest.raises(SuiteError, match=r"^--only method=single tau=1.0: no cell of the suite"):
        CellFilter(["method=single", "tau=1.0"]).select(cells)  # each exists, never together


def test_validate_with_overrides_and_only(write_suite, capsys):
    path = str(write_suite(SUITE))
    rc = main(["validate", path, "grid.seeds=[3]", "--skip-data", "--only", "method=single", "-v"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "1 cells" in out and "digits/digits_cnn/single(M=1)/seed3" in out
    assert main(["validate", path, "--skip-data", "recipe.epochs=abc"]) == 2
    assert "override recipe.epochs=abc: expected int" in capsys.readouterr().err


def test_dry_run_lists_what_would_run_and_why_the_rest_would_not(write_suite, tmp_path, capsys):
    path = str(write_suite(SUITE))
    results = tmp_path / "res"
    suite = load_suite(path)
    cells = {(c.method, c.seed): c for c in suite.cells()}
    folder = results / "ov"
    done, failed, leased = cells["single", 0], cells["single", 1], cells["sigma_ens", 0]
    error = {"type": "DivergenceError", "message": "nan", "phase": "train"}
    write_records(
        folder,
        [
            make_record(suite="ov", cell_id=done.cell_id),
            make_record(suite="ov", cell_id=failed.cell_id, status="failed", error=error),
        ],
    )
    (folder / leased.cell_id).mkdir()
    owner = {"host": socket.gethostname(), "pid": os.getpid()}  # alive: this test
    (folder / leased.cell_id / "lease.json").write_text(json.dumps(owner))

    rc = main(["run", path, "--dry-run", "--results", str(results)])
    out = capsys.readouterr().out
    assert rc == 0
    lines = {line.split()[1]: line for line in out.splitlines() if line[:4] in ("run ", "skip")}
    assert lines[done.cell_id].startswith("skip") and lines[done.cell_id].endswith("(done)")
    assert lines[failed.cell_id].startswith("run ")
    assert "(failed in train (DivergenceError), retried)" in lines[failed.cell_id]
    assert lines[leased.cell_id].startswith("skip")
    assert f"(leased by {socket.gethostname()}:{os.getpid()})" in lines[leased.cell_id]
    assert lines[cells["sigma_ens", 1].cell_id].endswith("(pending)")
    assert "dry run: 2 of 4 cells would run" in out
    assert not (folder / "suite.json").exists()  # a dry run writes nothing

    main(["run", path, "--dry-run", "--results", str(results), "--only", "seed=1"])
    out = capsys.readouterr().out
    assert "not selected by --only" in lines_of(out, cells["sigma_ens", 0])
    assert "dry run: 2 of 4 cells would run" in out


def test_a_run_whose_last_cell_another_live_run_holds_exits_1_naming_it(
    write_suite, tmp_path, capsys
):
    """Three cells done, the fourth leased by a live process (this test): the run trains
    nothing, keeps the held cell's folder as it was, and exits 1 with the holder named last."""
    path = str(write_suite(SUITE))
    results = tmp_path / "res"
    cells = load_suite(path).cells()
    folder = results / "ov"
    write_records(folder, [make_record(suite="ov", cell_id=c.cell_id) for c in cells[:3]])
    held = folder / cells[3].cell_id
    held.mkdir()
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    (held / "lease.json").write_text(json.dumps(owner))

    rc = main(["run", path, "--results", str(results), "--executor", "inprocess"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert f"skipped {cells[3].cell_id}: leased by {owner['host']}:{owner['pid']}" in lines
    assert lines[-1].startswith(
        f"not done here: 1 cell(s) held by another live run ({owner['host']}:{owner['pid']})"
    )
    assert sorted(p.name for p in held.iterdir()) == ["lease.json"]  # untouched


def lines_of(out: str, cell: Cell) -> str:
    return next(line for line in out.splitlines() if cell.cell_id in line)


def test_run_records_overrides_in_the_manifest(write_suite, tmp_path, monkeypatch):
    """The manifest is written before any cell runs; the executor is stubbed so nothing trains."""
    import harness.executors as executors

    class Nothing:
        name = "inprocess"
        ran: tuple[str, ...] = ()

        def __init__(self, options):
            pass

        def describe(self, n):
            return f"{n} cells"

        def run(self, cells, results_dir, data_root, force):
            Nothing.ran = tuple(c.cell_id for c in cells)
            return RunOutcome(finished=True)

    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: Nothing(None))
    path = str(write_suite(SUITE))
    argv = ["run", path, "grid.seeds=[0]", "--results", str(tmp_path / "r")]
    main([*argv, "--only", "method=single", "-q"])
    manifest = read_manifest(tmp_path / "r" / "ov")
    assert manifest["overrides"] == ["grid.seeds=[0]"]
    assert manifest["only"] == ["method=single"]
    assert len(manifest["current"]) == 2  # the suite's cells; --only chose which ran
    assert len(Nothing.ran) == 1
    cell = Cell.from_json(manifest["cells"][Nothing.ran[0]]["cell"])
    assert (cell.method, cell.seed) == ("single", 0)
    assert dataclasses.asdict(cell.recipe)["epochs"] == 3


def test_report_overrides_set_the_expected_cells(write_suite, tmp_path, monkeypatch):
    """``harness report RESULTS KEY=VALUE``: the recorded suite file with the overrides gives
    the expected cells; those without a record are listed as missing."""
    import harness.executors as executors

    class Nothing:
        name = "inprocess"

        def __init__(self):
            pass

        def describe(self, n):
            return ""

        def run(self, cells, results_dir, data_root, force):
            return RunOutcome(finished=True)

    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: Nothing())
    path = str(write_suite(SUITE))
    main(["run", path, "grid.seeds=[0]", "--results", str(tmp_path / "r"), "-q"])
    folder = tmp_path / "r" / "ov"
    write_records(folder, [make_record(suite="ov", cell_id="0123456789abcdef", method="single")])
    wanted = {c.cell_id for c in load_suite(path, ["grid.seeds=[0, 7]"]).cells()}
    assert main(["report", str(folder), "grid.seeds=[0, 7]", "--format", "md"]) == 0
    text = (folder / "leaderboard.md").read_text()
    missing = {line.split("|")[2].strip() for line in text.splitlines() if "| missing |" in line}
    assert missing == wanted and len(missing) == 4
    assert main(["report", str(folder), "recipe.epochs=x"]) == 2


# --- one validator: every problem names the file and key, or the override ----------------------


def test_an_override_that_makes_an_included_value_wrong_is_named(capsys, monkeypatch):
    """``recipe.epochs=1`` leaves the included recipe's ``warmup_epochs: 1`` not below the
    epochs: the override is the cause and is named, with the file that set the other value."""
    monkeypatch.chdir(REPO)
    assert main(["validate", "suites/smoke.yaml", "recipe.epochs=1", "--skip-data"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "override recipe.epochs=1: recipe.warmup_epochs: 1 is not below epochs=1 "
        "(recipe.warmup_epochs set in suites/common/digits_recipe.yaml)"
    ]


def test_recipe_problems_name_the_file_that_set_the_value(write_suite, tmp_path):
    base = write_suite("recipe: {warmup_epochs: 5, epochs: 8}\n", "base.yaml")
    grid = "grid: {datasets: [digits], backbones: [digits_cnn], methods: [single], M: [1]}\n"
    path = write_suite(f"include: base.yaml\nname: r\n{grid}recipe: {{epochs: 3}}\n")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert info.value.problems == [f"{base}: recipe.warmup_epochs: 5 is not below epochs=3"]
    # A method's recipe delta inherits the suite's warm-up: the file that set it is named...
    short = grid.replace("[single]", "[{name: single, recipe: {epochs: 2}}]")
    path.write_text(f"include: base.yaml\nname: r\n{short}")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert info.value.problems == [
        f"{base}: grid.methods[0].recipe.warmup_epochs: 5 is not below epochs=2"
    ]
    # ... and the override, when one set the epochs that make it wrong.
    with pytest.raises(SuiteError) as info:
        load_suite(path, ["grid.methods.single.recipe.epochs=4"])
    assert info.value.problems == [
        "override grid.methods.single.recipe.epochs=4: grid.methods[0].recipe.warmup_epochs: 5 "
        f"is not below epochs=4 (recipe.warmup_epochs set in {base})"
    ]
