"""Suite mistakes that used to pass validation and change the experiment (or fail a cell late):
a key given twice, a mapping override that dropped the block's other keys, exponent numbers
YAML 1.1 reads as strings, an empty sweep, a seed listed twice or out of range, a non-finite
number, backbone options that build no network."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.config.includes import SuiteError, read_yaml_file
from harness.config.parse import MAX_SEED, load_suite

BASE = """
name: slips
grid:
  datasets: [digits]
  backbones: [digits_cnn]
  M: [4]
  seeds: [0]
  methods:
    - name: sigma_ens
      hparams: {tau: 0.5}
recipe: {epochs: 3, lr: 0.05, batch_size: 16}
"""


def _problems(write_suite, text: str, *overrides: str) -> list[str]:
    """The problems, without the suite file's path that prefixes those of its own lines."""
    path = write_suite(text)
    with pytest.raises(SuiteError) as info:
        load_suite(path, list(overrides))
    return [p.removeprefix(f"{path}: ") for p in info.value.problems]


def test_a_key_given_twice_is_refused_with_both_lines(write_suite):
    text = BASE.replace("      hparams: {tau: 0.5}\n",
                        "      hparams: {tau: 0.1}\n      hparams: {lam: 0.05}\n")  # fmt: skip
    text += "recipe: {batch_size: 32}\n"
    path = write_suite(text)
    with pytest.raises(SuiteError) as info:
        read_yaml_file(path)
    assert info.value.problems == [
        f"{path}: line 11: key 'hparams' given again (first at line 10); YAML would keep only "
        "the last: merge them",
        f"{path}: line 13: key 'recipe' given again (first at line 12); YAML would keep only "
        "the last: merge them",
    ]
    with pytest.raises(SuiteError, match=r"key 'hparams' given again"):
        load_suite(path)


def test_a_merge_key_and_an_alias_are_not_duplicates(write_suite):
    path = write_suite("a: &x {k: 1, j: 2}\nb: {<<: *x, k: 3}\nc: *x\n")
    assert read_yaml_file(path) == {
        "a": {"k": 1, "j": 2},
        "b": {"k": 3, "j": 2},
        "c": {"k": 1, "j": 2},
    }


def test_a_mapping_override_merges_into_the_block_it_names(write_suite, tmp_path):
    """`recipe={epochs: 2}` changes the epochs and keeps the suite's lr and batch size (and an
    included file's keys), as include: merges; before, the whole block was replaced."""
    (tmp_path / "base.yaml").write_text("recipe: {momentum: 0.8, warmup_epochs: 1}\n")
    suite = load_suite(write_suite("include: base.yaml\n" + BASE), ["recipe={epochs: 2}"])
    r = suite.recipe
    assert (r.epochs, r.lr, r.batch_size, r.momentum, r.warmup_epochs) == (2, 0.05, 16, 0.8, 1)
    nested = load_suite(write_suite(BASE), ["grid.methods.sigma_ens={hparams: {lam: 0.01}}"])
    (cell,) = nested.cells()
    assert (cell.hparams["tau"], cell.hparams["lam"]) == (0.5, 0.01)


@pytest.mark.parametrize("written", ["5e-2", "5E-2", "0.5e-1", "+5e-2"])
def test_exponent_numbers_read_as_the_floats_they_are_and_keep_the_cell_id(written, write_suite):
    plain = load_suite(write_suite(BASE)).cells()
    text = BASE.replace("lr: 0.05", f"lr: {written}").replace("tau: 0.5", "tau: 5e-1")
    sci = load_suite(write_suite(text, "sci.yaml")).cells()
    assert sci[0].recipe.lr == 0.05 and sci[0].hparams["tau"] == 0.5
    assert [c.cell_id for c in sci] == [c.cell_id for c in plain]
    over = load_suite(write_suite(BASE), ["recipe.lr=5e-2"]).cells()
    assert over[0].cell_id == plain[0].cell_id


def test_what_is_not_a_number_is_still_refused(write_suite):
    assert _problems(write_suite, BASE, "recipe.lr=5e") == [
        "override recipe.lr=5e: expected float, got str '5e'"
    ]


def test_an_empty_sweep_is_refused_not_a_crash(write_suite):
    text = BASE.replace("tau: 0.5", "tau: []")
    assert _problems(write_suite, text) == [
        "grid.methods[0].hparams.tau: an empty list sweeps no value; give one or more"
    ]


def test_a_value_listed_twice_in_the_grid_is_refused(write_suite):
    problems = _problems(write_suite, BASE, "grid.seeds=[0, 1, 0, 1]", "grid.M=[2, 2]")
    assert problems == [  # an override's problem names the override
        "override grid.M=[2, 2]: 2 is listed more than once",
        "override grid.seeds=[0, 1, 0, 1]: 0 is listed more than once",
        "override grid.seeds=[0, 1, 0, 1]: 1 is listed more than once",
    ]
    text = BASE.replace("datasets: [digits]", "datasets: [digits, digits]")
    assert "grid.datasets: 'digits' is listed more than once" in _problems(write_suite, text)


@pytest.mark.parametrize("seed", [MAX_SEED + 1, 99999999999999999999, -1])
def test_a_seed_out_of_range_is_refused_before_any_cell(seed, write_suite):
    (problem,) = _problems(write_suite, BASE, f"grid.seeds=[{seed}]")
    assert f"{seed} is out of range: seeds are 0 … {MAX_SEED}" in problem
    assert load_suite(write_suite(BASE), [f"grid.seeds=[{MAX_SEED}]"]).cells()[0].seed == MAX_SEED


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_non_finite_number_is_refused(value, write_suite):
    problems = _problems(write_suite, BASE, f"recipe.lr={value}",
                         f"grid.methods.sigma_ens.hparams.tau={value}")  # fmt: skip
    assert len(problems) == 2 and all("must be a finite number" in p for p in problems)


@pytest.mark.parametrize(
    ("width", "says"),
    [
        ("-3", "cannot be built with {'width': -3}: RuntimeError: Trying to create tensor with "
         "negative dimension"),
        ("2.5", "cannot be built with {'width': 2.5}: ValueError"),
        ("0", "with {'width': 0} has an empty layer (features.0.weight): nothing to train"),
    ],
)  # fmt: skip
def test_backbone_options_that_build_no_network_are_refused_before_any_cell(
    width, says, write_suite, capsys
):
    entry = f"{{name: digits_cnn, kwargs: {{width: {width}}}}}"
    text = BASE.replace("backbones: [digits_cnn]", f"backbones: [{entry}]")
    (problem,) = _problems(write_suite, text)
    assert (
        problem.startswith("grid.backbones[0].kwargs: backbone 'digits_cnn' ") and says in problem
    )
    assert main(["validate", str(write_suite(text)), "--skip-data"]) == 2
    assert says in capsys.readouterr().err
