"""One reading of the records, two views (issue 60 item 4): ``reports.records.index.scan`` reads
a results folder once; ``Scan.results()`` is the reporter's wide view (the page, cells.csv) and
``Scan.tidy()`` the documented one-row-per-cell frame of ``harness.api.load_results``. For the
same folder they agree on every column they share, and ``harness.api.leaderboard`` is a narrow,
long frame whose numbers are the reporter's summary of those columns."""

from __future__ import annotations

import pandas as pd
import pytest
from record_factory import make_record, write_records

import harness.api as h
from reports.records.index import load_results, scan
from reports.records.tidy import CONFIG, LEADERBOARD_COLUMNS, LEADERBOARD_METRICS, RENAMED
from tests.golden.statistics import smoke_records
from tests.reports.figures.test_report_calibration import calibrated


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The smoke suite's stored records (41 cells), three of them recalibrated, a failed cell
    and an older duplicate of a done one (the leaderboard counts the newer)."""
    out = tmp_path_factory.mktemp("views") / "smoke"
    recs = smoke_records()
    for i in range(3):
        recs[i] = calibrated(recs[i], t=1.2 + 0.1 * i, nll=0.2 + 0.01 * i, ece=0.02)
    first = recs[0]["config"]
    recs.append(make_record(suite=recs[0]["suite"], dataset=first["dataset"], status="failed",
                            backbone=first["backbone"], method="mimo", M=4, seed=9))  # fmt: skip
    write_records(out, recs)
    return out


def _same(a: pd.Series, b: pd.Series) -> bool:
    """Equal value by value, two missing values equal."""
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    both_missing = a.isna() & b.isna()
    return bool(((a == b) | both_missing).all())


def test_the_two_views_of_one_scan_agree_on_every_shared_column(folder):
    scanned = scan(folder)
    wide = scanned.results().cells
    wide = wide[wide["method"] != "single+TS"].reset_index(drop=True)
    tidy = scanned.tidy()
    assert len(tidy) == len(wide) == 42 and set(tidy["status"]) == {"done", "failed"}
    assert list(tidy["cell_id"]) == list(wide["cell_id"])
    shared = [k for k in CONFIG if k in wide.columns]
    assert {"status", "dataset", "method", "M", "seed", "hparams", "variant"} <= set(shared)
    renamed = {name: source for name, source in RENAMED.items() if source in wide.columns}
    assert {"acc", "nll", "nll_ts", "temperature", "disagreement", "k_eff"} <= set(renamed)
    for key in shared:
        assert _same(tidy[key], wide[key]), key
    for name, source in renamed.items():
        assert _same(pd.to_numeric(tidy[name], errors="coerce"),
                     pd.to_numeric(wide[source], errors="coerce")), name  # fmt: skip


def test_each_reader_is_a_view_of_the_one_scan(folder):
    scanned = scan(folder)
    pd.testing.assert_frame_equal(load_results(folder).cells, scanned.results().cells)
    pd.testing.assert_frame_equal(load_results(folder).summary, scanned.results().summary)
    pd.testing.assert_frame_equal(h.load_results(folder), scanned.tidy())
    both = h.load_results(folder, calibrated=True)
    pd.testing.assert_frame_equal(both, scanned.tidy(calibrated=True))
    assert (both["calibration"] == "ts").sum() == 3
    # through the record index, the same views
    cached = scan(folder, index=True)
    assert (folder / ".report-index.npz").is_file()
    pd.testing.assert_frame_equal(scan(folder, index=True).tidy(), scanned.tidy())
    pd.testing.assert_frame_equal(cached.results().summary, scanned.results().summary)
    (folder / ".report-index.npz").unlink()


def test_the_leaderboard_is_long_narrow_and_documented(folder):
    board = h.leaderboard(folder)
    assert tuple(board.columns) == LEADERBOARD_COLUMNS and board.shape[1] == 14
    tidy = h.load_results(folder)
    done = tidy[tidy["status"] == "done"]
    configs = done.groupby(["dataset", "backbone", "method", "M", "hparams", "variant"])
    # one row per configuration × metric that has a value there, every metric a default one
    assert set(board["metric"]) <= set(LEADERBOARD_METRICS)
    for metric in LEADERBOARD_METRICS:
        has = configs[metric].apply(lambda v: pd.to_numeric(v, errors="coerce").notna().any())
        assert (board["metric"] == metric).sum() == int(has.sum()), metric
    assert set(board["calibration"]) == {"raw"}
    assert (board["n"] <= board["n_cells"]).all() and (board["n"] >= 1).all()
    mimo = board[board["method"] == "mimo"]
    assert mimo.empty  # the failed cell is its configuration's only one: no done cell
    # each value the mean, std and n of load_results' column over the seeds
    acc = board[board["metric"] == "acc"].set_index(["method", "M", "hparams"])
    for key, group in done.groupby(["method", "M", "hparams"]):
        row = acc.loc[key]
        assert row["mean"] == pytest.approx(group["acc"].mean(), abs=1e-12)
        assert row["std"] == pytest.approx(group["acc"].std(ddof=1), abs=1e-12)
        assert row["n"] == row["n_cells"] == len(group)


def test_the_leaderboard_numbers_are_the_reporters_summary(folder):
    summary = scan(folder).results().summary
    summary = summary[summary["method"] != "single+TS"]
    board = h.leaderboard(folder)
    same_name = [m for m in LEADERBOARD_METRICS if RENAMED.get(m) == m and f"{m}_mean" in summary]
    assert {"acc", "nll", "ece", "brier", "disagreement", "params"} <= set(same_name)
    keys = ["dataset", "backbone", "method", "M", "hparams", "variant"]
    stats = [f"{m}_{s}" for m in same_name for s in ("mean", "std", "n", "ci")]
    merged = board.merge(summary[keys + stats], on=keys)
    assert len(merged) == len(board)
    for metric in same_name:
        rows = merged[merged["metric"] == metric]
        for stat in ("mean", "std", "n", "ci"):
            assert _same(rows[stat].astype(float), rows[f"{metric}_{stat}"].astype(float)), (
                metric, stat)  # fmt: skip


def test_the_leaderboard_with_calibrated_rows_and_chosen_metrics(folder):
    board = h.leaderboard(folder, ["nll", "temperature", "nll"], calibrated=True)
    assert list(dict.fromkeys(board["metric"])) == ["nll", "temperature"]
    ts = board[board["calibration"] == "ts"]
    assert len(ts) == 2 * ts[["method", "M", "hparams"]].drop_duplicates().shape[0] > 0
    with pytest.warns(FutureWarning, match="h.leaderboard\\(path\\)"):
        wide = h.leaderboard(folder, wide=True)
    assert wide.shape[1] > 500 and "acc_mean" in wide


@pytest.mark.parametrize(
    ("metrics", "needles"),
    [
        (["acc", "accuracy"], ["metrics: ['accuracy'] are not numeric columns", "'nll'"]),
        (["method"], ["metrics: ['method'] are not numeric columns"]),
        ("acc", ["metrics: 'acc': pass a list of column names"]),
        ([1], ["metrics: [1]: pass a list of column names"]),
    ],
)
def test_a_metric_the_frame_has_not_is_refused_by_name(folder, metrics, needles):
    with pytest.raises(h.HarnessError, match=r"metrics") as exc:
        h.leaderboard(folder, metrics)
    (line,) = exc.value.problems
    for needle in needles:
        assert needle in line, line
