"""``harness.api``: a tiny suite validated, run and read back from Python; the results folders of
``docs/results`` read into pandas as the leaderboard reads them; two folders compared."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

import harness.api as h
import reports
from harness.api import HarnessError
from reports.records.index import load_results as report_results
from tests.conftest import REPO

TAU_FRONTIER = REPO / "docs" / "results" / "claims_fmnist_tau_frontier"

TINY = textwrap.dedent("""\
    name: api_tiny
    grid:
      datasets: [digits]
      backbones: [{name: digits_cnn, kwargs: {width: 8}}]
      M: [2]
      seeds: [0, 1]
      methods:
        - {name: single, M: [1]}
        - {name: sigma_ens, hparams: {tau: 0.5}}
    recipe: {epochs: 1, batch_size: 64, lr: 0.05, warmup_epochs: 0}
    evaluation: {cost: false}
    """)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny suite run once through :func:`harness.api.run` (4 cells, in this process)."""
    folder = tmp_path_factory.mktemp("api")
    suite = folder / "tiny.yaml"
    suite.write_text(TINY)
    out = h.run(suite, executor="inprocess", results=folder / "results")
    return suite, out


def test_validate_returns_the_cells_and_raises_every_problem(tmp_path):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    checked = h.validate(suite, ["grid.seeds=[0]"], only=["method=sigma_ens"])
    assert checked.suite == "api_tiny"
    assert [c.label for c in checked.cells] == ["digits/digits_cnn/sigma_ens(M=2,tau=0.5)/seed0"]
    with pytest.raises(h.HarnessError, match=r"override recipe\.epochs=abc: expected int") as exc:
        h.validate(suite, ["recipe.epochs=abc"], check_data=False)
    assert exc.value.problems == [str(exc.value)]  # one line per problem
    with pytest.raises(h.HarnessError, match="is a directory"):
        h.validate(tmp_path)


def test_run_then_read_back_one_row_per_record(tiny_run):
    suite, out = tiny_run
    assert out.exit_code == 0 and out.results_dir.name == "api_tiny"
    df = h.load_results(out.results_dir, with_records=True)
    records = h.load_records(out.results_dir)
    assert len(df) == len(records) == 4 and set(df["status"]) == {"done"}
    by_id = {r["cell_id"]: r for r in records}
    for _, row in df.iterrows():
        rec = by_id[row["cell_id"]]
        assert row["record"] is not None and row["record"]["cell_id"] == row["cell_id"]
        assert row["acc"] == rec["metrics"]["clean"]["acc"]
        assert row["nll"] == rec["metrics"]["clean"]["nll"]
        assert (row["method"], row["seed"]) == (rec["config"]["method"], rec["config"]["seed"])
    assert set(df.loc[df["method"] == "sigma_ens", "hp_tau"]) == {0.5}
    # The leaderboard: mean over the two seeds of each configuration.
    board = h.leaderboard(out.results_dir)
    acc = board[board["metric"] == "acc"]
    assert len(acc) == len(df.groupby(["method", "M"])) >= 2
    for _, row in acc.iterrows():
        seeds = df[(df["method"] == row["method"]) & (df["M"] == row["M"])]
        assert row["n_cells"] == row["n"] == 2
        assert row["mean"] == pytest.approx(seeds["acc"].mean(), abs=1e-15)
    # Run again: nothing left to do, the same records.
    again = h.run(suite, executor="inprocess", results=out.results_dir.parent)
    assert again.exit_code == 0 and h.load_records(out.results_dir) == records


def test_paired_and_compare_are_the_reporters_statistics(tiny_run, tmp_path):
    _, out = tiny_run
    table = h.paired(out.results_dir, "single", ["acc", "nll"])
    acc = table[(table["method"] == "sigma_ens") & (table["metric"] == "acc")].iloc[0]
    df = h.load_results(out.results_dir)
    per_seed = df.pivot_table(index="seed", columns="method", values="acc")
    diffs = per_seed["sigma_ens"] - per_seed["single"]
    assert acc["n_pairs"] == 2 and acc["mean_diff"] == pytest.approx(diffs.mean(), abs=1e-12)
    # A copy of the folder with σN-Ens's accuracy moved by +0.1 (seed 0) and +0.2 (seed 1).
    copy = tmp_path / "api_tiny"
    for rec in h.load_records(out.results_dir):
        if rec["config"]["method"] == "sigma_ens":
            rec["metrics"]["clean"]["acc"] += 0.1 * (rec["config"]["seed"] + 1)
        (copy / rec["cell_id"]).mkdir(parents=True)
        (copy / rec["cell_id"] / "record.json").write_text(json.dumps(rec))
    cmp = h.compare(out.results_dir, copy, ["acc", "nll"])
    assert len(cmp) == 4 and set(cmp["n_pairs"]) == {2}
    row = cmp[(cmp["method"] == "sigma_ens") & (cmp["metric"] == "acc")].iloc[0]
    assert row["mean_diff"] == pytest.approx(0.15, abs=1e-12)
    assert row["ci_lo"] < 0.15 < row["ci_hi"]  # two seeds: a wide t-interval
    assert row["p_value"] == 0.5  # the exact sign-flip test's smallest value at 2 seeds
    same = cmp[(cmp["method"] == "single") | (cmp["metric"] == "nll")]
    assert (same["mean_diff"] == 0).all()


def test_load_results_of_a_published_study_matches_the_leaderboard():
    df = h.load_results(TAU_FRONTIER)
    board = report_results(TAU_FRONTIER).summary
    assert len(df) == len(h.load_records(TAU_FRONTIER)) == 42
    means = df.groupby(["method", "M", "hparams"])["acc"].mean()
    for _, row in board.iterrows():
        assert means[row["method"], row["M"], row["hparams"]] == pytest.approx(
            row["acc_mean"], abs=1e-12
        )
    # The one-liner, in a fresh interpreter, as a user types it.
    line = (
        "import harness.api as h; "
        "df = h.load_results('docs/results/claims_fmnist_tau_frontier'); "
        "print(df.groupby('method')['acc'].mean().to_json())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", line], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    n = board.groupby("method")["n"].sum()
    for method, value in printed.items():
        rows = board[board["method"] == method]
        weighted = (rows["acc_mean"] * rows["n"]).sum() / n[method]  # every configuration n seeds
        assert math.isclose(value, weighted, abs_tol=1e-12), method
    assert set(printed) == {"deep_ensemble", "sigma_ens", "single"}


def test_reading_results_imports_no_torch():
    code = (
        "import sys, harness.api as h; h.load_results('docs/results/claims_fmnist_tau_frontier'); "
        "h.leaderboard('docs/results/claims_fmnist_tau_frontier'); print('torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "False", proc.stderr


def test_every_name_the_reports_package_advertises_exists():
    for name in reports.__all__:
        assert getattr(reports, name) is not None, name
    assert reports.direction("acc") == "higher" and reports.directions()["acc"] == "higher"
    # A star import in a fresh interpreter binds every advertised name (and loads no torch).
    code = (
        "import sys\nfrom reports import *\nimport reports\n"
        "missing = [n for n in reports.__all__ if n not in globals()]\n"
        "print(missing, 'torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "[] False", proc.stderr


def test_paired_refuses_a_reference_that_did_not_run():
    """As `harness report --reference` does (exit 2): an unknown reference is an error, not an
    empty table."""
    with pytest.raises(HarnessError, match="reference nonexistent: no done cells"):
        h.paired(TAU_FRONTIER, "nonexistent")
    assert len(h.paired(TAU_FRONTIER, "single")) > 0
