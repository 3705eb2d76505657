"""The validation-selection view: per sweep, the configuration with the lowest mean validation
NLL and its test metrics; configurations without a validation split are never candidates."""

from __future__ import annotations

import pytest

from reports.records.results import records_to_frame
from reports.render.leaderboard import write_report
from reports.render.markdown import markdown_selection
from reports.render.tables import selected_on_validation
from reports.stats.summary import aggregate
from tests.record_factory import make_record, write_records


def _sweep() -> list[dict]:
    recs = []
    # τ=0.1 has the better TEST NLL but the worse validation NLL: selection must not see the test.
    for tau, nll, val_shift in ((0.1, 0.30, 0.10), (1.0, 0.40, -0.05), (3.0, 0.50, 0.0)):
        for seed in (0, 1):
            r = make_record(
                method="sigma_ens",
                hparams={"tau": tau},
                seed=seed,
                nll=nll + 0.01 * seed,
                acc=0.9 - tau / 100,
            )
            r["metrics"]["val"]["nll"] = nll + val_shift + 0.01 * seed
            recs.append(r)
    for seed in (0, 1):  # a sweep of one configuration: nothing to select
        recs.append(make_record(method="deep_ensemble", seed=seed))
    return recs


def test_selects_the_lowest_validation_nll_not_the_lowest_test_nll():
    table = selected_on_validation(aggregate(records_to_frame(_sweep())))
    assert list(table["method"]) == ["sigma_ens"]
    row = table.iloc[0]
    assert row["hparams"] == "tau=1.0" and row["candidates"] == 3
    assert row["val_nll_mean"] == pytest.approx(0.355)  # (0.35 + 0.36) / 2
    assert row["nll_mean"] == pytest.approx(0.405) and row["acc_mean"] == pytest.approx(0.89)


def test_configurations_without_validation_metrics_are_not_candidates():
    recs = _sweep()
    for r in recs:
        if r["config"]["hparams"].get("tau") == 1.0:
            del r["metrics"]["val"]
    table = selected_on_validation(aggregate(records_to_frame(recs)))
    assert table.iloc[0]["hparams"] == "tau=0.1" and table.iloc[0]["candidates"] == 2
    for r in recs:
        r["metrics"].pop("val", None)
    assert selected_on_validation(aggregate(records_to_frame(recs))).empty


def test_page_and_markdown_show_the_selection(tmp_path):
    write_records(tmp_path / "res", _sweep())
    html = write_report(tmp_path / "res", tmp_path / "out", figures=False).read_text()
    assert 'id="selection-table"' in html and html.count('class="selection-row"') == 1
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    row = "| digits | mlp | sigma_ens | 4 | tau=1.0 | 3 | 0.3550 | 89.00 | 0.405 ± 0.007 | 3.00 |"
    assert row in md
    assert markdown_selection(aggregate(records_to_frame(_sweep())[:0])) == []
