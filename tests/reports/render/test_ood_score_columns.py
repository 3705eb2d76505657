"""The energy and max-logit OOD scores in the reports (issue 60 item 7): which columns the
default tables show, the page's OOD header naming each score, and records written before these
scores reporting as they did."""

from __future__ import annotations

import copy

import pytest

from reports.columns import leaderboard_columns, ood_score_labels
from reports.records.results import from_records, records_to_frame
from reports.render.leaderboard import render_html, render_markdown
from reports.render.page import header_columns, header_groups, report_conventions
from reports.render.paired import paired_stats
from reports.render.terminal import format_table
from reports.stats.summary import aggregate
from tests.record_factory import make_record

LOGIT = {"energy": (0.80, 0.40), "max_logit": (0.82, 0.38)}  # AUROC, FPR95 at seed 0


def with_logit_scores(rec: dict, step: float = 0.0) -> dict:
    """``rec`` with ``energy`` and ``max_logit`` beside its probability scores in every set."""
    rec = copy.deepcopy(rec)
    for scores in rec["metrics"]["ood"].values():
        for name, (auroc, fpr95) in LOGIT.items():
            scores[name] = {"auroc": auroc + step, "aupr_in": 0.8, "aupr_out": 0.7,
                            "fpr95": fpr95, "fpr95_id": 0.5}  # fmt: skip
    return rec


def _records(dataset: str, sets: tuple[str, ...], logit: bool) -> list[dict]:
    recs = [
        make_record(dataset=dataset, ood_sets=sets, seed=s, method=m, M=4 if m != "single" else 1)
        for m in ("deep_ensemble", "single")
        for s in (0, 1)
    ]
    return [with_logit_scores(r, 0.02 * r["config"]["seed"]) if logit else r for r in recs]


def _shown(recs: list[dict]) -> dict[str, str]:
    summary = aggregate(records_to_frame(recs))
    return {c.key: c.label for c in leaderboard_columns(summary, hidden=False) if c.group == "OOD"}


def test_default_tables_show_energy_and_max_logit_auroc_on_the_group_means():
    # digits declares digits_heldout near and sklearn_photos far: the means carry the new scores
    shown = _shown(_records("digits", ("digits_heldout", "sklearn_photos"), logit=True))
    assert {k: v for k, v in shown.items() if k.startswith(("ood_near/", "ood_far/"))} == {
        "ood_near/msp/auroc": "AUROC near (MSP)",
        "ood_near/msp/fpr95": "FPR95 near (MSP)",
        "ood_near/energy/auroc": "AUROC near (energy)",
        "ood_near/max_logit/auroc": "AUROC near (max-logit)",
        "ood_far/msp/auroc": "AUROC far (MSP)",
        "ood_far/msp/fpr95": "FPR95 far (MSP)",
        "ood_far/energy/auroc": "AUROC far (energy)",
        "ood_far/max_logit/auroc": "AUROC far (max-logit)",
    }
    assert "ood/digits_heldout/energy/auroc" not in shown  # per set: in the picker
    assert "ood/digits_heldout/msp/auroc" in shown
    summary = aggregate(records_to_frame(_records("digits", ("digits_heldout",), logit=True)))
    row = summary[summary["method"] == "deep_ensemble"].iloc[0]
    assert row["ood_near/energy/auroc_mean"] == pytest.approx(0.81)  # seeds 0.80 and 0.82
    assert row["ood/digits_heldout/max_logit/auroc_mean"] == pytest.approx(0.83)


def test_without_near_far_groups_each_set_shows_them():
    # digits_hard declares no groups (the smoke suite's dataset)
    shown = _shown(_records("digits_hard", ("digits_hard_heldout", "sklearn_photos_hard"), True))
    assert sorted(shown) == sorted(
        f"ood/{s}/{score}/{m}"
        for s in ("digits_hard_heldout", "sklearn_photos_hard")
        for score, m in (("msp", "auroc"), ("msp", "fpr95"), ("energy", "auroc"),
                         ("max_logit", "auroc"))
    )  # fmt: skip
    assert (
        shown["ood/sklearn_photos_hard/max_logit/auroc"] == "AUROC sklearn_photos_hard (max-logit)"
    )


def test_page_names_each_score_and_older_records_report_as_before():
    new = from_records(_records("digits", ("digits_heldout",), logit=True))
    old = from_records(_records("digits", ("digits_heldout",), logit=False))
    titles = {}
    for name, results in (("new", new), ("old", old)):
        header = header_columns(results.summary, show_variant=False)
        (ood,) = [g for g in header_groups(header, "cpu") if g["name"] == "OOD"]
        titles[name] = ood["title"]
    assert titles["new"] == ("OOD detection (ID positive; near/far: OpenOOD means; scores: MSP, "
                             "entropy, MI, energy, max-logit)")  # fmt: skip
    assert (
        titles["old"]
        == "OOD detection (ID positive; near/far: OpenOOD means; scores: MSP, entropy, MI)"
    )
    conv = {k: report_conventions(r, paired_stats(r), _options())["OOD"]
            for k, r in (("new", new), ("old", old))}  # fmt: skip
    assert "for the MSP, entropy, MI, energy and max-logit scores;" in conv["new"]
    assert "for the MSP, entropy and MI scores;" in conv["old"]  # the text it always had
    assert ood_score_labels(old.cells.columns) == ["MSP", "entropy", "MI"]
    # Older records: no energy column anywhere, the page and the Markdown still render.
    assert not [c for c in old.cells.columns if "/energy/" in c or "/max_logit/" in c]
    assert "(energy)" not in render_markdown(old) and "(energy)" in render_markdown(new)
    assert "scores: MSP, entropy, MI)" in render_html(old, figures=[])


def test_the_terminal_table_is_not_wider():
    old = format_table(records_to_frame(_records("digits", ("digits_heldout",), logit=False)))
    new = format_table(records_to_frame(_records("digits", ("digits_heldout",), logit=True)))
    assert new.splitlines()[0] == old.splitlines()[0]  # the same header
    assert "MSP-AUROC near" in new.splitlines()[0] and "energy" not in new


def _options():
    from reports.render.page import ReportOptions

    return ReportOptions()
