"""The leaderboard reads right at a glance (issue 60 item 8), on a results folder like the smoke
suite's at two seeds: no bold where no comparison can reach significance (said once, above the
table), blank cells for the scores a single model cannot have, and header counts that say what
they count.

The rule, from the test behind the bold cells (reports.stats.bolding): the exact sign-flip test's
smallest two-sided p with n pairs is 2/2ⁿ (0.0625 at n = 5 > α = 0.05), so a dataset's column
whose comparisons with its best all have fewer than 6 paired seeds carries no bold."""

from __future__ import annotations

import re

import pytest
from record_factory import make_record

from reports.columns import leaderboard_columns
from reports.records.results import from_records
from reports.render.leaderboard import render_html, render_markdown
from reports.render.page import ReportOptions
from reports.render.paired import paired_stats
from reports.stats.bolding import bolding
from tests.reports.render.test_reports import parse
from tests.reports.smoke_like import smoke_like_records

QUALITY = ("acc", "nll", "ece", "brier", "aurc")
NOTE_TWO_SEEDS = (
    "No cell is bold: bold marks need ≥ 6 paired seeds (the exact sign-flip test's smallest "
    "two-sided p with n pairs is 2/2ⁿ: 0.0625 at n = 5, above α = 0.05); these results have 2."
)


def _note(html: str) -> str | None:
    found = re.search(r'<p class="note bold-note" id="bold-note">(.*?)</p>', html, flags=re.S)
    return found.group(1) if found else None


@pytest.fixture(scope="module")
def two_seeds():
    return from_records(smoke_like_records())


@pytest.fixture(scope="module")
def page(two_seeds):
    return render_html(two_seeds, figures=[])


def _rows(html: str) -> dict[str, dict]:
    """Each leaderboard row's cells, by ``method M=m`` (and τ where a method has several)."""
    out = {}
    for r in parse(html).rows:
        cells = r["cells"]
        tau = re.search(r"tau=[^,]+", cells["hparams"]["value"])
        key = f"{cells['method']['value']} M={cells['M']['value']}"
        out[f"{key} {tau.group(0)}" if tau else key] = cells
    assert len(out) == len(parse(html).rows)
    return out


def test_two_seeds_bold_no_cell_and_say_why_once_above_the_table(page):
    rows = _rows(page)
    assert len(rows) == 12
    for key in QUALITY:
        assert not [m for m, cells in rows.items() if "best" in cells[key]["classes"]], key
    # nor in any column whose means differ (train device-h ties: equally best, nothing compared)
    for key in rows["mimo M=4"]:
        if len({cells[key]["value"] for cells in rows.values()}) > 1:
            assert not [m for m, cells in rows.items() if "best" in cells[key]["classes"]], key
    assert _note(page) == NOTE_TWO_SEEDS.replace("'", "&#39;")
    assert page.count('id="bold-note"') == 1
    # above the table: after the heading, before the table
    assert page.index('id="bold-note"') < page.index('<table id="leaderboard"')
    assert "carries no bold, and a sentence above the table says so" in page  # the rule


def test_six_seeds_bold_the_best_and_say_nothing():
    six = from_records(smoke_like_records(seeds=tuple(range(6))))
    html = render_html(six, figures=[])
    rows = _rows(html)
    # every method gains the same 0.2 points a seed: each difference to the best is the same on
    # every seed, p = 2/2⁶ = 0.031 ≤ 0.05, so only the best is bold
    assert [m for m, c in rows.items() if "best" in c["acc"]["classes"]] == ["deep_ensemble M=4"]
    assert float(rows["deep_ensemble M=4"]["acc"]["value"]) == pytest.approx(0.958)
    assert _note(html) is None


def test_the_t_test_can_tell_two_seeds_apart(two_seeds):
    """The paired t-test has a p-value from 2 pairs: bold as usual, no sentence."""
    paired = paired_stats(two_seeds, test="t")
    html = render_html(two_seeds, [], paired=paired, options=ReportOptions(test="t"))
    rows = _rows(html)
    assert [m for m, c in rows.items() if "best" in c["acc"]["classes"]] == ["deep_ensemble M=4"]
    assert _note(html) is None


def test_a_column_whose_best_has_five_seeds_carries_no_bold_and_is_named():
    """Six seeds each, but C's ECE diverged on one: A is best on accuracy, C on ECE (5 finite
    values). Accuracy keeps its bold (6 pairs reach p = 0.031); ECE has no comparison with 6
    pairs: no bold there, and the sentence names it. A column whose means all tie (NLL) keeps
    them all bold: nothing was compared."""
    nan = {"metrics": {"clean": {"ece": float("nan")}}}
    recs = [make_record(method="A", seed=s, acc=0.90, ece=0.05) for s in range(6)]
    recs += [make_record(method="B", seed=s, acc=0.85, ece=0.06) for s in range(6)]
    recs += [make_record(method="C", seed=s, acc=0.88, ece=0.01, overrides=nan if s == 5 else None)
             for s in range(6)]  # fmt: skip
    res = from_records(recs)
    columns = [c for c in leaderboard_columns(res.summary) if c.key in ("acc", "ece", "nll")]
    b = bolding(res.summary, res.cells, columns)
    methods = res.summary["method"]
    assert sorted(methods[list(b.bold["acc"])]) == ["A"]
    assert sorted(methods[list(b.bold["nll"])]) == ["A", "B", "C"]  # equally best
    assert "ece" not in b.bold and b.unreachable == {"ece": {"digits"}} and b.seeds == 5
    assert b.compared == {"acc": {"digits"}, "ece": {"digits"}}  # NLL: every mean 0.35
    html = render_html(res, figures=[])
    assert _note(html) == (
        "No bold in ECE (%): bold marks need ≥ 6 paired seeds (the exact sign-flip test&#39;s "
        "smallest two-sided p with n pairs is 2/2ⁿ: 0.0625 at n = 5, above α = 0.05); these "
        "results have 5 there."
    )
    rows = {r["cells"]["method"]["value"]: r["cells"] for r in parse(html).rows}
    assert not [m for m, c in rows.items() if "best" in c["ece"]["classes"]]
    assert {m for m, c in rows.items() if "best" in c["acc"]["classes"]} == {"A"}
    assert {m for m, c in rows.items() if "best" in c["aece"]["classes"]} == {"C"}  # 6 values
    md = render_markdown(res)
    assert "No bold in ECE (%): bold marks need ≥ 6 paired seeds" in md
    assert md.index("No bold in ECE") < md.index("| dataset |")


def test_the_header_counts_trained_cells_and_post_hoc_rows_apart(page):
    counts = dict(re.findall(r'<span id="count-([a-z]+)"[^>]*>([^<]*)</span>', page))
    assert counts["done"] == "22 done cells (trained)"  # 11 configurations × 2 seeds
    assert counts["posthoc"] == "2 post-hoc rows (TS)"  # single+TS, one per single cell
    assert counts["groups"] == "12 configurations (1 post-hoc)"
    assert counts["failed"] == "0 failed"
    bare = render_html(from_records([make_record(seed=s) for s in range(2)]), figures=[])
    bare_counts = dict(re.findall(r'<span id="count-([a-z]+)"[^>]*>([^<]*)</span>', bare))
    assert bare_counts["done"] == "2 done cells (trained)" and "posthoc" not in bare_counts
    assert not bare_counts["groups"].endswith("post-hoc)")


MI = "ood/digits_hard_heldout/mi/auroc"


def test_scores_only_an_ensemble_has_are_blank_for_one_model(two_seeds, page):
    summary = two_seeds.summary
    single = summary[summary["method"] == "single"].iloc[0]
    assert single[f"{MI}_mean"] == 0.5 and single["disagreement_mean"] == 0.0  # the records'
    rows = _rows(page)
    for method in ("single M=1", "single+TS M=1"):
        for key in (MI, "disagreement", "mi", "ood/sklearn_photos_hard/mi/fpr95"):
            cell = rows[method][key]
            assert (cell["text"].strip(), cell["value"]) == ("–", ""), (method, key)
        assert rows[method]["ood/digits_hard_heldout/msp/auroc"]["text"].startswith("8")
    assert rows["mimo M=4"][MI]["text"].strip() == "87.00 (2)"  # AUROC 89% − 2 points
    assert rows["mimo M=4"]["disagreement"]["text"].strip() == "5.00 (2)"
    md = render_markdown(two_seeds).splitlines()
    head = next(row for row in md if row.startswith("| dataset |")).split(" | ")
    single = next(row for row in md if row.startswith("| digits_hard | digits_cnn | single |"))
    assert single.split(" | ")[head.index("Disagr. (%)")] == "–"  # was 0.00 (2)
