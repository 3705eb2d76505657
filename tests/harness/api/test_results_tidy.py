"""``harness.api.load_results``: one row per cell, every column in docs/results.md, at most 60 of
them on smoke-suite results; the configuration with its defaults; calibrated rows marked by a
column; the long tables, value by value against the records they come from."""

from __future__ import annotations

import math
import re

import pytest
from record_factory import make_record, write_records

import harness.api as h
from tests.conftest import REPO
from tests.golden.statistics import smoke_records
from tests.reports.figures.test_report_calibration import calibrated

DOC = REPO / "docs" / "results.md"
SECTION = "## `load_results`: one row per cell"
MAX_COLUMNS = 60
#: Rows of the page that stand for a family of columns: one per hyper-parameter a cell set, one
#: per plugin metric the records declare.
PLACEHOLDERS = ("hp_<name>", "<metric>")


def documented_columns(text: str) -> list[str]:
    """The column names of the table under :data:`SECTION` in docs/results.md: the first cell of
    each row, in backticks (``hp_<name>`` stands for every ``hp_`` column)."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", body, flags=re.MULTILINE)


def undocumented(columns: list[str], documented: list[str]) -> list[str]:
    """The columns that docs/results.md does not list (``hp_<name>`` covers each ``hp_``)."""
    names = set(documented)
    return [c for c in columns if c not in names and not (c.startswith("hp_") and
                                                           "hp_<name>" in names)]  # fmt: skip


@pytest.fixture(scope="module")
def smoke_like(tmp_path_factory):
    """The smoke suite's stored records (41 cells at 6 seeds, tests/golden), two of them
    recalibrated as the smoke suite now does, in a results folder."""
    folder = tmp_path_factory.mktemp("smoke") / "smoke"
    recs = smoke_records()
    for i, rec in enumerate(recs[:2]):
        recs[i] = calibrated(rec, t=1.3, nll=0.2, ece=0.02)
    write_records(folder, recs)
    return folder


def test_every_column_of_the_smoke_results_is_documented_and_there_are_at_most_60(smoke_like):
    documented = documented_columns(DOC.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)) >= 40
    for frame in (h.load_results(smoke_like), h.load_results(smoke_like, calibrated=True)):
        columns = list(frame.columns)
        assert undocumented(columns, documented) == []
        assert len(columns) <= MAX_COLUMNS, len(columns)
        # and the page lists nothing load_results does not return
        # (hp_<name> and <metric> stand for columns these records have none of)
        assert [d for d in documented if d not in PLACEHOLDERS and d not in columns] == []
    assert len(h.load_results(smoke_like)) == 41  # one row per cell: no single+TS row
    assert [c for c in columns if c.startswith("hp_")] == ["hp_gamma", "hp_lam"]


def test_the_check_names_a_column_the_page_does_not_list():
    documented = documented_columns(DOC.read_text(encoding="utf-8"))
    assert undocumented(["acc", "hp_tau", "acc_per_moon"], documented) == ["acc_per_moon"]
    assert undocumented(["hp_tau"], ["acc"]) == ["hp_tau"]


SIGMA_DEFAULTS = {"tau": 1.0, "lam": 0.001, "gate_fold": "none", "gamma_init_mean": 3.0}


def _sigma(seed: int, shown: dict, disagreement: float, **knobs) -> dict:
    """A schema-2 σN-Ens record: every hyper-parameter in its config (as the runner writes
    them, defaults included), the ones the suite set in ``hparams_shown``."""
    hparams = {**SIGMA_DEFAULTS, **shown}
    label = "digits/mlp/sigma_ens(M=4," + ",".join(f"{k}={v}" for k, v in shown.items()) + ")"
    rec = make_record(method="sigma_ens", hparams=hparams, seed=seed, k_eff=2.5, **knobs,
                      overrides={"schema_version": 2, "hparams_shown": shown, "label": label,
                                 "metrics": {"clean": {"disagreement": disagreement}}})  # fmt: skip
    return calibrated(rec, t=1.2, nll=0.3, ece=0.02)


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory):
    """Two seeds each of: σN-Ens at its default τ (λ set), σN-Ens at τ = 0.5, a calibrated
    single model; and one failed deep ensemble."""
    folder = tmp_path_factory.mktemp("fab") / "toy"
    recs = []
    for seed in (0, 1):
        recs.append(_sigma(seed, {"lam": 0.01}, 0.0, acc=0.9, nll=0.35))
        recs.append(_sigma(seed, {"tau": 0.5}, 0.04, acc=0.88, nll=0.4, ood_sets=("svhn", "lsun")))
        single = make_record(method="single", M=1, seed=seed, acc=0.8, nll=0.6 + 0.1 * seed)
        recs.append(calibrated(single, t=1.4, nll=0.5 + 0.1 * seed, ece=0.01))
    recs.append(make_record(method="deep_ensemble", status="failed"))
    write_records(folder, recs)
    return folder, recs


def test_the_configuration_with_defaults_and_the_metrics_of_each_record(fabricated):
    folder, recs = fabricated
    df = h.load_results(folder, with_records=True)
    assert len(df) == len(recs) == 7 and set(df["calibration"]) == {"raw"}
    by_id = df.set_index("cell_id")
    for rec in recs:
        row = by_id.loc[rec["cell_id"]]
        assert row["record"]["cell_id"] == rec["cell_id"]  # the record as read back
        assert row["record"]["metrics"] == rec["metrics"]
        if rec["status"] != "done":
            assert row["status"] == "failed" and row["error"] == "RuntimeError: CUDA out of memory"
            assert math.isnan(row["acc"])
            continue
        clean, cal = rec["metrics"]["clean"], rec["metrics"]["calibration"]
        assert (row["acc"], row["nll"], row["ece"]) == (clean["acc"], clean["nll"], clean["ece"])
        assert (
            row["temperature"] == cal["temperature"] and row["nll_ts"] == cal["ts"]["clean"]["nll"]
        )
        assert row["ece_ts"] == cal["ts"]["clean"]["ece"]
        assert row["cAcc"] == rec["metrics"]["corruption"]["mean"]["acc"]
        assert row["cNLL_ts"] == cal["ts"]["corruption"]["mean"]["nll"]
        ood = rec["metrics"]["ood"]
        assert row["ood_auroc"] == pytest.approx(
            sum(s["msp"]["auroc"] for s in ood.values()) / len(ood)
        )
        assert row["disagreement"] == clean["disagreement"] and row["epochs"] == 2
        assert row["member_acc"] == pytest.approx(sum(clean["members"]["acc"]) / rec["config"]["M"])
        assert row["error"] == ""
    sigma = df[df["method"] == "sigma_ens"].set_index(["hparams", "seed"])
    # σN-Ens's τ with its default beside the τ a suite set; λ likewise; the full set as text
    assert sigma.loc[("lam=0.01", 0), "hp_tau"] == 1.0
    assert sigma.loc[("tau=0.5", 0), "hp_tau"] == 0.5
    assert sigma.loc[("tau=0.5", 1), "hp_lam"] == 0.001
    assert sigma.loc[("lam=0.01", 1), "hparams_all"] == (
        "gamma_init_mean=3.0, gate_fold=none, lam=0.01, tau=1.0"
    )
    assert "hp_gate_fold" not in df  # no cell set it: hparams_all has it
    assert sigma.loc[("lam=0.01", 0), "k_eff"] == 2.5  # the last epoch's
    # identical members: collapsed; separated ones and a single model: not
    assert list(sigma["collapsed"]) == [True, False, True, False]
    assert not df.loc[df["method"] == "single", "collapsed"].any()


def test_calibrated_rows_are_marked_by_a_column_not_a_method(fabricated):
    folder, _ = fabricated
    df = h.load_results(folder, calibrated=True)
    assert "single+TS" not in set(df["method"]) and "+ts" not in "".join(df["cell_id"])
    assert len(df) == 7 + 6  # every done cell has a temperature
    ts = df[df["calibration"] == "ts"]
    raw = df[(df["calibration"] == "raw") & (df["status"] == "done")]
    assert list(ts["cell_id"]) == list(raw["cell_id"])  # each right after its raw row
    assert list(df["calibration"].iloc[:2]) == ["raw", "ts"]
    single = ts[ts["method"] == "single"].set_index("seed")
    assert single.loc[0, "nll"] == 0.5 and single.loc[1, "nll"] == pytest.approx(0.6)
    assert single.loc[0, "acc"] == 0.8  # a temperature does not move the top class
    assert single.loc[0, "ood_auroc"] == 0.8  # the calibrated MSP (the helper's ts block)
    means = df.groupby(["method", "calibration"])["nll"].mean()
    assert means["single", "raw"] == pytest.approx(0.65) and means["single", "ts"] == 0.55
    # the leaderboard's single+TS configuration is single's ts rows
    board = h.leaderboard(folder, ["nll"], calibrated=True)
    ts = board[(board["method"] == "single") & (board["calibration"] == "ts")]
    assert ts["mean"].item() == pytest.approx(means["single", "ts"])
    with pytest.warns(FutureWarning, match="pivot"):
        page = h.leaderboard(folder, wide=True).set_index("method")
    assert page.loc["single+TS", "nll_mean"] == pytest.approx(means["single", "ts"])


def test_a_declared_plugin_metric_is_a_column_of_its_own(tmp_path, fabricated):
    """A metric a plugin declared in its records (``metrics.declared``) is a column named by its
    key, with each record's value, after every other column; empty in a temperature-scaled row
    (measured on the raw prediction only); a folder whose records declare none has no column."""
    decl = {"key": "top2", "label": "Top-2 acc (%)", "group": "Plugin", "kind": "pct",
            "direction": "higher", "hidden": False}  # fmt: skip
    recs = [
        calibrated(make_record(method="single", M=1, seed=seed, acc=0.8, overrides={
            "metrics": {"clean": {"top2": 0.9 + 0.01 * seed}, "declared": [decl]}}),
            t=1.4, nll=0.5, ece=0.01)
        for seed in (0, 1)
    ]  # fmt: skip
    write_records(tmp_path / "plugged", recs)
    df = h.load_results(tmp_path / "plugged", calibrated=True)
    assert list(df.columns)[-1] == "top2"
    raw = df[df["calibration"] == "raw"].set_index("seed")
    assert raw["top2"].to_dict() == {0: 0.9, 1: pytest.approx(0.91)}
    assert df.loc[df["calibration"] == "ts", "top2"].isna().all()
    assert "top2" not in h.load_results(fabricated[0])


def test_the_long_tables_hold_each_records_numbers(fabricated):
    folder, recs = fabricated
    keys = ["suite", "cell_id", "dataset", "backbone", "method", "M", "hparams", "variant", "seed"]
    rec = next(r for r in recs if r["config"]["method"] == "sigma_ens")
    cid = rec["cell_id"]

    corr = h.corruption_table(folder)
    assert list(corr.columns) == [*keys, "calibration", "corruption", "severity", "metric", "value"]
    mine = corr[corr["cell_id"] == cid]
    assert len(mine) == 2 * 5 * 3  # 2 corruptions × 5 severities × acc, nll, ece (raw only)
    (acc3,) = mine[(mine["corruption"] == "contrast") & (mine["severity"] == 3)
                   & (mine["metric"] == "acc")]["value"]  # fmt: skip
    assert acc3 == pytest.approx(rec["metrics"]["clean"]["acc"] - 0.24)
    assert set(corr["cell_id"]) == {r["cell_id"] for r in recs if r["status"] == "done"}

    ood = h.ood_table(folder)
    mine = ood[ood["cell_id"] == cid].set_index(["calibration", "ood_set", "score", "metric"])
    assert mine.loc[("raw", "svhn", "msp", "auroc"), "value"] == 0.85
    assert mine.loc[("raw", "svhn", "mi", "fpr95"), "value"] == pytest.approx(0.47)
    assert mine.loc[("ts", "svhn", "entropy", "auroc"), "value"] == 0.81

    rel = h.reliability_table(folder)
    mine = rel[(rel["cell_id"] == cid) & (rel["calibration"] == "raw")]
    ensemble, members = mine[mine["member"].isna()], mine[mine["member"].notna()]
    assert list(ensemble["bin"]) == list(range(15)) and list(ensemble["count"])[14] == 100
    assert ensemble["count"].sum() == 100 and sorted(set(members["member"])) == [0, 1, 2, 3]
    top = ensemble.iloc[14]
    assert (top["lower"], top["upper"]) == pytest.approx((14 / 15, 1.0))
    assert top["confidence"] == 0.95 and top["accuracy"] == rec["metrics"]["clean"]["acc"]
    assert math.isnan(ensemble.iloc[0]["confidence"])  # an empty bin

    hist = h.history_table(folder)
    mine = hist[hist["cell_id"] == cid].set_index(["source", "epoch", "metric"])["value"]
    assert mine[("history", 1, "train_loss")] == 0.5
    assert mine[("diagnostics", 1, "k_eff")] == 2.5 and mine[("diagnostics", 0, "k_eff")] == 2.8

    cp = h.conformal_table(folder)
    mine = cp[cp["cell_id"] == cid].set_index(["predictor", "alpha", "split", "stat"])["value"]
    assert mine[("aps", 0.1, "clean", "coverage")] == 0.9
    assert mine[("raps", 0.1, "corrupted", "coverage_fallback")] == pytest.approx(0.73)
    # every table joins with load_results on (suite, cell_id); a failed cell keeps its history
    cells = h.load_results(folder)
    for table in (corr, ood, rel, hist, cp):
        joined = table.merge(cells[["suite", "cell_id", "status"]], on=["suite", "cell_id"])
        assert len(joined) == len(table)
    assert set(hist.merge(cells, on=["suite", "cell_id"])["status"]) == {"done", "failed"}
