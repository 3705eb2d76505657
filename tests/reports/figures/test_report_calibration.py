"""Post-hoc calibration in the report: calibrated and conformal columns, single+TS as its own
configuration in the leaderboard and the paired table, reliability diagrams."""

from __future__ import annotations

import pytest
from record_factory import make_record, write_records

from reports.records.flatten import SINGLE_TS, calibration_columns, flatten_record
from reports.records.index import load_results
from reports.stats.paired import paired_differences
from tests.reports.render.test_leaderboard_browser import driver  # noqa: F401  (the module's headless Chromium)


def _bins(conf: float, acc: float, n: int) -> dict:
    """Reliability bins with all ``n`` samples in the bin of ``conf``."""
    b = min(int(conf * 15), 14)
    count = [0] * 15
    count[b] = n
    return {
        "count": count,
        "confidence": [conf if i == b else None for i in range(15)],
        "accuracy": [acc if i == b else None for i in range(15)],
    }


def _sets(cov: float, size: float, legacy: bool) -> dict:
    """One conformal block's statistics: the sets as defined and torch-uncertainty's (5% empty
    sets, 3 points of coverage added by the fallback); ``legacy``: a record written before the
    two were separated, whose ``coverage``/``size`` are the fallback's."""
    if legacy:
        return {"coverage": cov, "size": size}
    return {
        "coverage": cov,
        "size": size,
        "coverage_fallback": cov + 0.03,
        "size_fallback": size + 0.05,
        "empty_rate": 0.05,
    }


def calibrated(
    rec: dict,
    *,
    t: float,
    nll: float,
    ece: float,
    cov: float = 0.9,
    alpha: float | list[float] = 0.1,
    legacy: bool = False,
) -> dict:
    """``rec`` with a post-hoc calibration block and reliability bins (the shape the evaluator
    writes; docs/records.md). ``alpha``: one α (keys ``thr``…) or several (``thr@0.05``…);
    ``legacy``: the conformal numbers as records held them before issue 50."""
    keys = [
        f"{m}@{a!r}" if isinstance(alpha, list) else m
        for m in ("thr", "aps", "raps")
        for a in (alpha if isinstance(alpha, list) else [alpha])
    ]
    clean = rec["metrics"]["clean"]
    clean["reliability"] = _bins(0.95, clean["acc"], 100)
    clean["reliability_members"] = [_bins(0.97, clean["acc"] - 0.01, 100)] * rec["config"]["M"]
    rec["metrics"]["calibration"] = {
        "method": "temperature_scaling",
        "fitted_on": "calibration",
        "n": 500,
        "temperature": t,
        "alpha": alpha,
        "quantiles": dict.fromkeys(keys, 0.9),
        "time_s": 0.1,
        "ts": {
            "clean": {
                "acc": clean["acc"],
                "nll": nll,
                "ece": ece,
                "brier": 0.2,
                "aece": ece,
                "aurc": 0.05,
                "reliability": _bins(clean["acc"], clean["acc"], 100),
            },
            "corruption": {"mean": {"acc": 0.5, "nll": nll + 1, "ece": ece + 0.1}},
            "ood": {"svhn": {"msp": {"auroc": 0.8}, "entropy": {"auroc": 0.81}}},
        },
        "conformal": {
            name: {
                "clean": _sets(cov, 1.5, legacy),
                "corruption": {"mean": _sets(cov - 0.2, 2.0, legacy)},
            }
            for name in keys
        },
    }
    if not legacy:
        rec["metrics"]["calibration"]["quantile_rule"] = "ceil((n+1)(1-alpha))-th smallest"
    return rec


def test_calibration_columns_of_a_record():
    rec = calibrated(make_record(method="single", M=1), t=1.5, nll=0.3, ece=0.01)
    row = flatten_record(rec)
    assert row["ts/nll"] == 0.3 and row["ts/ece"] == 0.01 and row["ts/temperature"] == 1.5
    assert row["ts/cNLL"] == 1.3 and row["ts/cECE"] == pytest.approx(0.11)
    assert row["ood_ts/svhn/msp/auroc"] == 0.8
    # conformal columns carry α (the record's one α); the sets as defined beside the fallback's
    assert row["cp/aps@0.1/coverage"] == 0.9 and row["cp/aps@0.1/c_coverage"] == pytest.approx(0.7)
    assert row["cp/thr@0.1/size"] == 1.5 and row["cp/raps@0.1/c_size"] == 2.0
    assert row["cp/aps@0.1/coverage_fallback"] == pytest.approx(0.93)
    assert row["cp/aps@0.1/size_fallback"] == 1.55 and row["cp/aps@0.1/empty_rate"] == 0.05
    assert row["cp/raps@0.1/c_coverage_fallback"] == pytest.approx(0.73)
    # bins as sums: count 100 in the 0.95 bin (14), confidence sum 95, correct sum 100·acc
    assert row["rel/raw/count/14"] == 100 and row["rel/raw/conf/14"] == pytest.approx(95)
    assert row["rel/raw/correct/14"] == pytest.approx(100 * rec["metrics"]["clean"]["acc"])
    assert row["rel/members/count/14"] == 100  # M = 1
    # a record without calibration has none of these columns
    plain = calibration_columns(make_record(method="single", M=1)["metrics"])
    assert not any(k.startswith(("ts/", "cp/")) for k in plain)


def _columns(recs: list[dict], hidden: bool = True) -> dict:
    from reports.columns import leaderboard_columns
    from reports.records.results import from_records

    return {c.key: c for c in leaderboard_columns(from_records(recs).summary, hidden=hidden)}


def test_records_from_before_the_fallback_was_separated_are_read_as_fallback_numbers():
    """A record written before issue 50 holds one α and torch-uncertainty's numbers under
    ``coverage``/``size``: they become the ``+fb`` columns (labelled so, shown in place of the
    sets-as-defined columns it lacks), and the latter stay empty."""
    import math

    old = calibrated(make_record(method="single", M=1), t=1.2, nll=0.3, ece=0.02, legacy=True)
    row = flatten_record(old)
    assert row["cp/aps@0.1/coverage_fallback"] == 0.9 and row["cp/aps@0.1/size_fallback"] == 1.5
    assert row["cp/aps@0.1/c_coverage_fallback"] == pytest.approx(0.7)
    assert math.isnan(row["cp/aps@0.1/coverage"]) and math.isnan(row["cp/aps@0.1/empty_rate"])
    cols = _columns([old])
    assert "cp/aps@0.1/coverage" not in cols  # no data: dropped
    fb = cols["cp/aps@0.1/coverage_fallback"]
    assert fb.label == "APS α=0.1 cov. +fb (%)" and not fb.hidden
    assert fb.group == "Conformal sets (target coverage 1 − α; +fb sets cover more)"
    assert not cols["cp/aps@0.1/c_coverage_fallback"].hidden
    assert cols["cp/thr@0.1/coverage_fallback"].hidden  # THR and RAPS wait in the picker
    # a new record shows the sets as defined, the fallback's in the picker
    new = _columns([calibrated(make_record(method="single", M=1), t=1.2, nll=0.3, ece=0.02)])
    assert not new["cp/aps@0.1/coverage"].hidden and new["cp/aps@0.1/coverage_fallback"].hidden
    assert new["cp/aps@0.1/coverage"].label == "APS α=0.1 cov. (%)"
    assert new["cp/aps@0.1/empty_rate"].label == "APS α=0.1 empty (%)"


def test_several_alphas_each_get_columns_and_alpha_is_in_every_table(tmp_path):
    """``conformal_alpha: [0.05, 0.1, 0.2]``: a column per α, ordered by method then α, α in the
    label of the page, the terminal table and the LaTeX table."""
    from reports.records.results import from_records
    from reports.render.latex import render_latex
    from reports.render.page import ReportOptions, report_conventions
    from reports.render.paired import paired_stats
    from reports.render.terminal import format_table

    recs = [
        calibrated(
            make_record(method="single", M=1, seed=s),
            t=1.2,
            nll=0.3,
            ece=0.02,
            alpha=[0.2, 0.05, 0.1],
        )
        for s in range(2)
    ]
    cols = _columns(recs, hidden=False)
    aps = [k for k in cols if k.startswith("cp/aps@")]
    assert aps == [
        f"cp/aps@{a}/{s}"
        for a in ("0.05", "0.1", "0.2")
        for s in ("coverage", "size", "c_coverage")
    ]
    assert [cols[k].label for k in aps[::3]] == [
        "APS α=0.05 cov. (%)", "APS α=0.1 cov. (%)", "APS α=0.2 cov. (%)"
    ]  # fmt: skip
    res = from_records(recs)
    table = format_table(res.summary)
    header = table.splitlines()[0]
    assert "APS α=0.05 cov.%" in header and "APS α=0.2 cov.%" in header
    assert table.splitlines()[2].split()[-3:] == ["90.00", "90.00", "90.00"]  # APS, 3 α
    tex = render_latex(res, paired_stats(res), ReportOptions())
    assert r"APS $\alpha$=0.05 cov. (\%)" in tex
    conventions = report_conventions(res, paired_stats(res), ReportOptions())
    assert "⌈(n+1)(1−α)⌉" in conventions["conformal sets"]
    # the terminal shows the fallback coverage, labelled, for records that hold nothing else
    old = [calibrated(make_record(method="single", M=1), t=1.2, nll=0.3, ece=0.02, legacy=True)]
    assert "APS α=0.1 cov. +fb%" in format_table(from_records(old).summary).splitlines()[0]


def test_single_ts_is_a_configuration_and_pairs_with_the_same_seeds(tmp_path):
    recs = []
    for seed in range(6):
        single = make_record(method="single", M=1, seed=seed, acc=0.8, nll=0.6 + 0.01 * seed)
        recs.append(calibrated(single, t=1.4, nll=0.5 + 0.01 * seed, ece=0.01))
        de = make_record(method="deep_ensemble", M=4, seed=seed, acc=0.85, nll=0.45)
        recs.append(calibrated(de, t=0.9, nll=0.44, ece=0.015))
    write_records(tmp_path, recs)
    res = load_results(tmp_path)
    methods = sorted(res.summary["method"])
    assert methods == ["deep_ensemble", "single", SINGLE_TS]
    ts = res.summary[res.summary["method"] == SINGLE_TS].iloc[0]
    assert ts["n"] == 6
    # its quality columns are the single model's calibrated numbers; accuracy is unchanged
    assert ts["nll_mean"] == pytest.approx(0.525) and ts["ece_mean"] == pytest.approx(0.01)
    assert ts["acc_mean"] == pytest.approx(0.8)
    assert ts["ood/svhn/msp/auroc_mean"] == pytest.approx(0.8)  # the calibrated MSP
    # the paired table: deep ensemble (raw) against single+TS, seed by seed
    frame = paired_differences(res.cells, SINGLE_TS, metrics=["nll", "ts/nll"])
    de = frame[(frame["method"] == "deep_ensemble") & (frame["metric"] == "nll")].iloc[0]
    assert de["n_pairs"] == 6
    assert de["mean_diff"] == pytest.approx(0.45 - 0.525)
    # ... and on the calibrated columns: deep ensemble + TS against single + TS
    de_ts = frame[(frame["method"] == "deep_ensemble") & (frame["metric"] == "ts/nll")].iloc[0]
    assert de_ts["mean_diff"] == pytest.approx(0.44 - 0.525)
    # the derived rows are not duplicates of the single cells
    assert not [p for p in res.problems if p.status == "duplicate"]


def test_reliability_figure_draws_one_panel_per_configuration(tmp_path):
    from reports.figures.draw import reliability

    recs = [
        calibrated(make_record(method=m, M=mm, seed=s), t=1.2, nll=0.3, ece=0.02)
        for m, mm in (("single", 1), ("deep_ensemble", 4))
        for s in range(2)
    ]
    write_records(tmp_path, recs)
    cells = load_results(tmp_path).cells
    fig = reliability(cells)
    assert fig is not None
    panels = [ax for ax in fig.axes if ax.axison and ax.get_title()]
    assert len(panels) == 3  # single, deep_ensemble, single+TS
    de = next(ax for ax in panels if "deep_ensemble" in ax.get_title())
    lines = {line.get_label(): line for line in de.get_lines()}
    assert set(lines) == {
        "perfect calibration",
        "members (pooled), raw",
        "ensemble, raw",
        "ensemble, temperature-scaled",
    }
    x, y = lines["ensemble, raw"].get_data()
    assert list(x) == pytest.approx([0.95]) and list(y) == pytest.approx([0.9])
    # a long configuration label is wrapped to the panel's width, not run into its neighbour
    hp = {"tau": 0.2, "lam": 0.003, "gate_fold": "constant", "gamma_init_mean": 0.0}
    long = [calibrated(make_record(method="sigma_ens", hparams=hp), t=1.1, nll=0.3, ece=0.02)]
    write_records(tmp_path / "long", long)
    fig = reliability(load_results(tmp_path / "long").cells)
    (title,) = [ax.get_title() for ax in fig.axes if ax.axison and ax.get_title()]
    assert "gate_fold=constant" in title.replace("\n", " ")
    assert max(len(line) for line in title.splitlines()) <= 40 and title.count("\n") >= 2
    # without bins there is no figure
    plain = load_results(_write(tmp_path / "plain", [make_record()])).cells
    assert reliability(plain) is None


def _write(path, recs):
    path.mkdir()
    write_records(path, recs)
    return path


@pytest.mark.browser
def test_page_toggles_raw_and_calibrated_columns_and_shows_reliability(tmp_path, driver):  # noqa: F811
    """Headless Chromium: the calibrated columns sit beside the raw ones, the calibration view
    shows one side or both, single+TS has its row and the reliability figure is on the page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from reports.render.leaderboard import write_report
    from tests.reports.render.test_leaderboard_browser import console_problems

    recs = []
    for seed in range(2):
        single = make_record(method="single", M=1, seed=seed, acc=0.8, nll=0.6)
        recs.append(calibrated(single, t=1.4, nll=0.5, ece=0.01))
        de = make_record(method="deep_ensemble", M=4, seed=seed, acc=0.85, nll=0.45)
        recs.append(calibrated(de, t=0.9, nll=0.44, ece=0.015))
    results = tmp_path / "results"
    results.mkdir()
    write_records(results, recs)
    html = write_report(results, tmp_path / "report")
    driver.get(html.as_uri())

    def shown(col: str) -> bool:
        th = driver.find_element(By.CSS_SELECTOR, f'#leaderboard th.sortable[data-col="{col}"]')
        return th.is_displayed()

    methods = driver.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard tbody tr.lb-row'))"
        ".map(r => r.querySelector('td[data-col=\"method\"]').dataset.value)"
    )
    assert sorted(methods) == ["deep_ensemble", "single", "single+TS"]
    for col in ("nll", "ece", "ts/nll", "ts/ece", "ts/cECE", "cp/aps@0.1/coverage"):
        assert shown(col), col
    view = Select(driver.find_element(By.ID, "calibration-view"))
    view.select_by_value("raw")
    assert shown("nll") and not shown("ts/nll") and not shown("ts/ece")
    view.select_by_value("ts")
    assert shown("ts/nll") and not shown("nll") and not shown("ece")
    assert shown("acc")  # no calibrated twin: always shown
    view.select_by_value("both")
    assert shown("nll") and shown("ts/nll")
    # the group header counts the calibrated columns it spans
    group = driver.find_element(By.CSS_SELECTOR, "#leaderboard tr.groups th.g-Calibrated")
    assert group.is_displayed()
    figure = driver.find_element(By.ID, "fig-reliability")
    assert figure.find_element(By.TAG_NAME, "img").get_attribute("src").startswith("data:image/png")
    assert console_problems(driver) == []
