"""Diversity in view (issue 50, item 4): the leaderboard shows disagreement and σN-Ens's k_eff
by default and flags an ensemble whose members are one model, on the page, the terminal table
and the Markdown; the reliability diagrams carry each bin's count."""

from __future__ import annotations

import re

import numpy as np
import pytest
from record_factory import make_record

from reports.columns import COLLAPSE_DISAGREEMENT, collapsed, leaderboard_columns
from reports.records.results import from_records
from reports.render.leaderboard import render_html, render_markdown
from reports.render.terminal import format_table
from tests.reports.figures.test_report_calibration import calibrated

SEPARATED = 0.04  # a deep ensemble's disagreement on the smoke suite is 0.035


def _sigma(seed: int, disagreement: float, tau: float = 0.1) -> dict:
    """A σN-Ens cell whose members disagree on ``disagreement`` of the test images; at 0 they
    are identical: the same accuracy, NLL and ECE each, no mutual information."""
    identical = disagreement == 0
    members = {"acc": [0.9] * 4, "nll": [0.35] * 4, "brier": [0.15] * 4, "ece": [0.03] * 4}
    clean = {"disagreement": disagreement, **({"mi": 0.0, "kl": 0.0, "members": members}
                                              if identical else {})}  # fmt: skip
    return make_record(method="sigma_ens", hparams={"tau": tau}, seed=seed, k_eff=4.0 if
                       identical else 2.0, overrides={"metrics": {"clean": clean}})  # fmt: skip


def _results(sigma_disagreement: float):
    recs = [_sigma(s, sigma_disagreement) for s in (0, 1)]
    recs += [make_record(method="deep_ensemble", seed=s) for s in (0, 1)]  # disagreement 0.05
    recs += [make_record(method="single", M=1, seed=s) for s in (0, 1)]  # one member: 0
    return from_records(recs)


def _rows(html: str) -> dict[str, str]:
    """Each leaderboard row's opening tag and cells, by method."""
    rows = re.findall(r'<tr class="lb-row"[^>]*>.*?</tr>', html, flags=re.S)
    return {re.search(r'data-col="method" data-value="([^"]+)"', r).group(1): r for r in rows}


def test_identical_members_are_flagged_on_the_page_the_terminal_and_the_markdown():
    results = _results(0.0)
    html = render_html(results, figures=[])
    rows = _rows(html)
    assert 'data-collapsed="true"' in rows["sigma_ens"]
    assert '<span class="flag flag-collapsed"' in rows["sigma_ens"]
    for method in ("deep_ensemble", "single"):  # separated members; a single model
        assert "data-collapsed" not in rows[method] and "flag-collapsed" not in rows[method]
    # the threshold is stated on the page
    assert "fewer than 0.1% of the clean test images" in html and COLLAPSE_DISAGREEMENT == 0.001

    lines = format_table(results.summary).splitlines()
    (sigma,) = [line for line in lines if "sigma_ens" in line]
    assert "sigma_ens [collapsed]" in sigma
    assert not [line for line in lines if "deep_ensemble [collapsed]" in line]
    assert "[collapsed]: members disagree on < 0.1% of test images" in lines[-1]

    text = render_markdown(results)
    assert "| sigma_ens (collapsed) |" in text and "deep_ensemble (collapsed)" not in text


def test_separated_members_are_not_flagged():
    results = _results(SEPARATED)
    html = render_html(results, figures=[])
    for row in _rows(html).values():
        assert "data-collapsed" not in row and "flag-collapsed" not in row
    table = format_table(results.summary)
    assert "[collapsed]" not in table
    assert "(collapsed)" not in render_markdown(results)


def test_the_flag_is_the_mean_over_seeds_below_the_threshold():
    assert collapsed(0.0, 4) and collapsed(0.0009, 2)
    assert not collapsed(0.001, 4) and not collapsed(0.0, 1) and not collapsed(float("nan"), 4)
    assert not collapsed(None, 4) and not collapsed(0.0, None)
    # one seed at 0, one at 0.0017 (the smoke suite's σN-Ens before it changed): mean 0.00085
    recs = [_sigma(0, 0.0), _sigma(1, 0.0017)]
    assert "sigma_ens [collapsed]" in format_table(from_records(recs).summary)


def test_disagreement_and_k_eff_are_shown_by_default():
    summary = _results(SEPARATED).summary
    shown = {c.key for c in leaderboard_columns(summary, hidden=False)}
    assert {"disagreement", "k_eff"} <= shown
    assert not {"mi", "k_eff_scale", "grad_ratio"} & shown  # in the column picker
    header = format_table(summary).splitlines()[0]
    assert "Disagr.%" in header and "k_eff" in header
    rows = _rows(render_html(_results(SEPARATED), figures=[]))
    for key in ("disagreement", "k_eff"):
        cell = re.search(rf'<td data-col="{re.escape(key)}"[^>]*>', rows["sigma_ens"]).group(0)
        assert " hidden" not in cell
    cell = re.search(r'<td data-col="disagreement"[^>]*>(.*?)</td>', rows["sigma_ens"]).group(1)
    assert '<span class="v">4.00</span>' in cell  # percent


def test_reliability_diagrams_carry_each_bins_count():
    from reports.figures.base import FIGURES
    from reports.figures.reliability import COUNT_STRIP, reliability

    recs = []
    for seed, (n_low, n_high) in enumerate(((3, 100), (1, 60))):
        rec = calibrated(make_record(method="deep_ensemble", seed=seed), t=1.2, nll=0.3, ece=0.02)
        count = [0] * 15
        count[5], count[14] = n_low, n_high  # a bin of a few images beside a full one
        conf = [None] * 15
        conf[5], conf[14] = 0.35, 0.97
        rec["metrics"]["clean"]["reliability"] = {"count": count, "confidence": conf,
                                                  "accuracy": conf}  # fmt: skip
        recs.append(rec)
    fig = reliability(from_records(recs).cells)
    (strip,) = [ax for ax in fig.axes if ax.get_gid() == COUNT_STRIP]
    heights = np.array([p.get_height() for p in strip.patches])
    expected = np.zeros(15)
    expected[5], expected[14] = 4, 160  # the seeds' bins added
    assert heights == pytest.approx(expected)
    assert sorted(t.get_text() for t in strip.texts) == ["160", "4"]  # empty bins: no label
    spec = FIGURES.get("fig-reliability")
    assert "number of test images in each bin" in spec.caption
