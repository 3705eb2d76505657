"""Suite loading, validation messages, grid expansion and cell ids."""

import re
import textwrap

import pytest

from harness.config.includes import SuiteError
from harness.config.parse import load_suite

BASE = """
name: t
grid:
  datasets: [digits]
  backbones: [digits_cnn]
  M: [2, 4]
  seeds: [0, 1, 2]
  methods:
    - single
    - name: deep_ensemble
    - name: sigma_ens
      hparams: {tau: [0.1, 1.0], lam: 0.01}
recipe: {epochs: 1}
"""


def problems(write_suite, text: str) -> list[str]:
    path = write_suite(textwrap.dedent(text))
    with pytest.raises(SuiteError, match=r".") as info:
        load_suite(path)
    return info.value.problems


def test_grid_expansion_counts_and_defaults(write_suite):
    suite = load_suite(write_suite(BASE))
    cells = suite.cells()
    # single: M forced to 1 → 3 seeds; deep_ensemble: 2 M × 3 seeds; sigma_ens: 2 τ × 2 M × 3
    assert len(cells) == 3 + 6 + 12
    singles = [c for c in cells if c.method == "single"]
    assert {c.M for c in singles} == {1}
    sig = [c for c in cells if c.method == "sigma_ens"]
    assert {(c.hparams["tau"], c.M) for c in sig} == {(0.1, 2), (0.1, 4), (1.0, 2), (1.0, 4)}
    from harness.registry import method_defaults

    default = method_defaults("sigma_ens")["gamma_init_std"]  # unset keys take the defaults
    assert all(c.hparams["lam"] == 0.01 and c.hparams["gamma_init_std"] == default for c in sig)
    assert suite.recipe.epochs == 1 and suite.recipe.batch_size == 64  # default filled in


def test_cell_id_is_stable_and_content_addressed(write_suite):
    a = load_suite(write_suite(BASE, "a.yaml")).cells()
    b = load_suite(write_suite(BASE, "b.yaml")).cells()
    assert [c.cell_id for c in a] == [c.cell_id for c in b]
    assert len({c.cell_id for c in a}) == len(a)
    assert all(re.fullmatch(r"[0-9a-f]{16}", c.cell_id) for c in a)
    # writing a default explicitly gives the same cell; changing the recipe gives another
    from harness.registry import method_defaults

    default = method_defaults("sigma_ens")["gamma_init_std"]
    explicit = BASE.replace("lam: 0.01}", f"lam: 0.01, gamma_init_std: {default!r}}}")
    c = load_suite(write_suite(explicit, "c.yaml")).cells()
    assert {x.cell_id for x in c} == {x.cell_id for x in a}
    other = load_suite(write_suite(BASE.replace("epochs: 1", "epochs: 2"), "d.yaml")).cells()
    assert not {x.cell_id for x in other} & {x.cell_id for x in a}
    # the evaluation block is not part of the id: adding an OOD set re-evaluates, not retrains
    ev = load_suite(write_suite(BASE + "evaluation: {ood: [sklearn_photos]}\n", "e.yaml"))
    assert {x.cell_id for x in ev.cells()} == {x.cell_id for x in a}


def test_cell_json_round_trip(write_suite):
    from harness.contract.config import Cell

    for cell in load_suite(write_suite(BASE)).cells():
        again = Cell.from_json(cell.to_json())
        assert again.cell_id == cell.cell_id and again.evaluation == cell.evaluation


def test_unknown_keys_name_file_key_and_choices(write_suite):
    p = problems(
        write_suite, BASE.replace("recipe: {epochs: 1}", "recipe: {epoch: 1}") + "evalution: {}\n"
    )
    assert any(
        re.search(
            r"suite\.yaml: recipe\.epoch: unknown key\. Did you mean 'epochs'\? "
            r"Valid keys: epochs, batch_size",
            x,
        )
        for x in p
    ), p
    assert any(
        re.search(r"suite\.yaml: evalution: unknown key\. Did you mean 'evaluation'\?", x)
        for x in p
    ), p


def test_wrong_types(write_suite):
    p = problems(write_suite, BASE.replace("epochs: 1", "epochs: ten, lr: fast, nesterov: 3"))
    assert any("recipe.epochs: expected int, got str 'ten'" in x for x in p), p
    assert any("recipe.lr: expected float, got str 'fast'" in x for x in p), p
    assert any("recipe.nesterov: expected bool, got int 3" in x for x in p), p
    p = problems(
        write_suite,
        BASE.replace("optimizer", "x").replace("recipe: {epochs: 1}", "recipe: {optimizer: sgdd}"),
    )
    assert any(
        "recipe.optimizer: 'sgdd' is not one of ['sgd', 'adamw'] (did you mean 'sgd'?)" in x
        for x in p
    ), p


def test_members_below_one_and_tau_not_positive(write_suite):
    p = problems(
        write_suite,
        BASE.replace("M: [2, 4]", "M: [0, 4]").replace("tau: [0.1, 1.0]", "tau: [0.0, -1]"),
    )
    assert any("grid.methods[1].M: M must be >= 1, got 0" in x for x in p), p
    assert any("grid.methods[2].hparams.tau[0]: must be > 0, got 0.0" in x for x in p), p
    assert any("grid.methods[2].hparams.tau[1]: must be > 0, got -1.0" in x for x in p), p


def test_unknown_method_backbone_dataset(write_suite):
    text = (
        BASE.replace("[digits]", "[digitz]")
        .replace("[digits_cnn]", "[resnet81]")
        .replace("- single", "- singel")
    )
    p = problems(write_suite, text)
    assert any(
        "grid.datasets[0]: unknown dataset 'digitz'. Did you mean 'digits'?" in x
        and "Valid choices:" in x
        for x in p
    ), p
    assert any(
        "grid.backbones[0]: unknown backbone 'resnet81'. Did you mean 'resnet18'?" in x for x in p
    ), p
    assert any(
        "grid.methods[0].name: unknown method 'singel'. Did you mean 'single'?" in x for x in p
    ), p


def test_unknown_hparam_lists_valid_ones(write_suite):
    p = problems(write_suite, BASE.replace("lam: 0.01", "lamda: 0.01"))
    assert any(
        re.search(
            r"grid\.methods\[2\]\.hparams\.lamda: unknown key\. Did you mean "
            r"'lam'\? Valid keys: tau, lam,",
            x,
        )
        for x in p
    ), p


def test_unsupported_method_backbone_pair(write_suite):
    text = BASE.replace("[digits_cnn]", "[vit_small_32]").replace("- single", "- batch_ensemble")
    p = problems(write_suite, text)
    head = (
        "grid.methods[0]: method 'batch_ensemble' does not support backbone "
        "'vit_small_32'; supported backbones: "
    )
    (line,) = [x for x in p if head in x]
    names = line.split(head)[1].split(", ")
    # every backbone with a batched builder, sorted; the ViT (no builder) is not among them
    assert names == sorted(names) and {"digits_cnn", "fmnist_cnn", "resnet18"} <= set(names)
    assert "vit_small_32" not in names


def test_fixed_size_method_rejects_other_m(write_suite):
    p = problems(write_suite, BASE.replace("- single", "- {name: single, M: [4]}"))
    assert any("grid.methods[0].M: method 'single' allows M in [1, 1], got 4" in x for x in p), p


def test_include_composes_and_errors_name_the_included_file(write_suite):
    write_suite(
        "recipe: {epochs: 3, lr: 0.1}\nevaluation: {ood: [sklearn_photos]}\n", "common.yaml"
    )
    text = "include: common.yaml\n" + BASE.replace("recipe: {epochs: 1}", "recipe: {lr: 0.2}")
    suite = load_suite(write_suite(text))
    assert suite.recipe.epochs == 3 and suite.recipe.lr == 0.2  # includer overrides
    assert suite.evaluation.ood == ("sklearn_photos",)
    write_suite("recipe: {epochs: 3, momentun: 0.9}\n", "common.yaml")
    p = problems(write_suite, text)
    assert any(re.match(r".*common\.yaml: recipe\.momentun: unknown key", x) for x in p), p


def test_include_cycle_and_missing_file(write_suite):
    write_suite("include: b.yaml\n", "a.yaml")
    write_suite("include: a.yaml\n", "b.yaml")
    p = problems(write_suite, "include: a.yaml\n")
    assert any("include cycle" in x for x in p), p
    p = problems(write_suite, "include: nothere.yaml\n" + BASE)
    assert any(re.search(r"nothere\.yaml: suite file not found \(included from", x) for x in p), p


def test_ood_only_set_cannot_be_trained_on(write_suite):
    p = problems(write_suite, BASE.replace("[digits]", "[sklearn_photos]"))
    assert any("grid.datasets: 'sklearn_photos' is an OOD-only set" in x for x in p), p


def test_shipped_suites_validate():
    from tests.conftest import REPO

    paths = sorted((REPO / "suites").glob("*.yaml")) + sorted(
        (REPO / "suites" / "claims").glob("*.yaml")
    )
    assert len(paths) >= 13
    for path in paths:
        suite = load_suite(path)
        assert suite.cells(), path


def test_method_recipe_delta_applies_to_that_method_only(write_suite):
    text = BASE.replace("- name: deep_ensemble", "- name: deep_ensemble\n      recipe: {epochs: 7}")
    cells = load_suite(write_suite(text)).cells()
    assert {c.recipe.epochs for c in cells if c.method == "deep_ensemble"} == {7}
    assert {c.recipe.epochs for c in cells if c.method != "deep_ensemble"} == {1}
    p = problems(write_suite, text.replace("epochs: 7", "epochs: -1, lrr: 2"))
    assert any("grid.methods[1].recipe.epochs: must be >= 0, got -1" in x for x in p), p
    assert any("grid.methods[1].recipe.lrr: unknown key. Did you mean 'lr'?" in x for x in p), p


def test_all_methods_expand_to_every_registered_method_that_fits_the_grid(write_suite):
    from harness.registry import METHODS

    text = BASE.replace(
        """  methods:
    - single
    - name: deep_ensemble
    - name: sigma_ens
      hparams: {tau: [0.1, 1.0], lam: 0.01}""",
        """  methods:
    - all
    - name: sigma_ens
      hparams: {tau: 0.1}""",
    )
    suite = load_suite(write_suite(text))
    names = [m.name for m in suite.grid.methods]
    fits = {
        n
        for n, spec in METHODS.items()
        if (spec.backbones is None or "digits_cnn" in spec.backbones)
        and (spec.max_members == 1 or all(spec.min_members <= m for m in (2, 4)))
        and (spec.max_members in (None, 1) or spec.max_members >= 4)
    }
    assert set(names) == fits and len(names) == len(set(names))  # listed by name: kept once
    assert {"single", "deep_ensemble", "batch_ensemble", "mimo"} <= set(names)
    sig = [c for c in suite.cells() if c.method == "sigma_ens"]
    assert {c.hparams["tau"] for c in sig} == {0.1}  # the explicit entry wins over `all`
    others = [c for c in suite.cells() if c.method == "batch_ensemble"]
    assert others and all(c.shown_hparams() == {} for c in others)  # at their defaults
    assert others[0].label == "digits/digits_cnn/batch_ensemble(M=2)/seed0"


def test_all_leaves_out_methods_that_cannot_run_on_the_grid_backbone(write_suite):
    text = BASE.replace("backbones: [digits_cnn]", "backbones: [vit_small_32]").replace(
        """  methods:
    - single
    - name: deep_ensemble
    - name: sigma_ens
      hparams: {tau: [0.1, 1.0], lam: 0.01}""",
        "  methods: [all]",
    )
    names = {m.name for m in load_suite(write_suite(text)).grid.methods}
    assert "single" in names and "deep_ensemble" in names
    assert "batch_ensemble" not in names  # torch-uncertainty builds it for CNN families only


def test_a_method_entry_can_run_on_its_own_backbones(write_suite):
    """σN-Ens on WRN-28-8 beside WRN-28-10 comparators is one grid (the parameter claim)."""
    text = BASE.replace(
        "      hparams: {tau: [0.1, 1.0], lam: 0.01}\n",
        "      hparams: {tau: [0.1, 1.0], lam: 0.01}\n"
        "    - name: sigma_ens\n"
        "      backbones: [resnet18]\n"
        "      M: [4]\n",
    )
    cells = load_suite(write_suite(text)).cells()
    on_resnet = [c for c in cells if c.backbone == "resnet18"]
    # only the second sigma_ens entry: M=4 × its default hparams × 3 seeds
    assert {c.method for c in on_resnet} == {"sigma_ens"}
    assert len(on_resnet) == 3 and {c.M for c in on_resnet} == {4}
    # the other entries stay on the grid's backbone: single 3 + deep 2×3 + sigma 2×2×3
    assert len([c for c in cells if c.backbone == "digits_cnn"]) == 3 + 6 + 12


def test_a_method_entrys_backbones_are_checked(write_suite):
    text = BASE.replace(
        "    - name: deep_ensemble\n",
        "    - name: deep_ensemble\n      backbones: [resnet81]\n"
        "    - name: mimo\n      backbones: [wrn28_8]\n",
    )
    p = problems(write_suite, text)
    assert any(
        "grid.methods[1].backbones[0]" in m and "resnet81" in m and "resnet18" in m for m in p
    ), p
    assert any("'mimo' does not support backbone 'wrn28_8'" in m for m in p), p


def test_recipe_rules_apply_once_to_the_suite_and_each_method_recipe(write_suite):
    """Every recipe rule lives in one place (harness.config.validator.recipe_problems) and sees
    each recipe a cell trains with: the suite's, and each method's delta merged into it once
    (Suite.entry_recipe, the merge the cells use too)."""
    base = BASE.replace(
        "    - name: deep_ensemble\n",
        "    - name: deep_ensemble\n      recipe: {schedule: multistep}\n",
    )
    found = problems(write_suite, base)
    assert any(
        p.endswith("grid.methods[1].recipe.milestones: required when schedule is 'multistep'")
        for p in found
    ), found
    suite_wide = problems(
        write_suite, BASE.replace("recipe: {epochs: 1}", "recipe: {epochs: 4, schedule: multistep}")
    )
    assert any(
        p.endswith("recipe.milestones: required when schedule is 'multistep'") for p in suite_wide
    )
    suite = load_suite(
        write_suite(
            BASE.replace(
                "    - name: deep_ensemble\n",
                "    - name: deep_ensemble\n      recipe: {epochs: 3}\n",
            )
        )
    )
    entry = suite.grid.methods[1]
    assert {c.recipe for c in suite.cells() if c.method == "deep_ensemble"} == {
        suite.entry_recipe(entry)
    }
    assert (
        suite.entry_recipe(entry).epochs == 3
        and suite.entry_recipe(suite.grid.methods[0]) is suite.recipe
    )
