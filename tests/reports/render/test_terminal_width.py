"""The terminal table ``harness run`` ends with fits 160 characters by default (issue 60 item 8):
hparams shows only the settings that differ within a method, constant identity columns move to
the footer and the least needed metric columns go, the footer naming them; ``$COLUMNS`` wider
than 160 shows more. Before: 262 characters on the smoke suite, hparams cut before τ and λ."""

from __future__ import annotations

import pytest
from record_factory import write_records

from reports.records.results import from_records
from reports.render.terminal import WIDTH, differing_hparams, format_results, format_table
from tests.reports.smoke_like import smoke_like_records


@pytest.fixture(scope="module")
def summary():
    return from_records(smoke_like_records()).summary


@pytest.fixture
def no_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


def _rows(table: str) -> dict[str, dict[str, str]]:
    """Each row's cells by header, by its method and hparams."""
    lines = table.splitlines()
    header = [h.strip() for h in _split(lines[0], lines[1])]
    out = {}
    for line in lines[2:]:
        if line.startswith(("mean±std", "every row")):
            break
        row = dict(zip(header, (c.strip() for c in _split(line, lines[1])), strict=True))
        out[f"{row['method']} {row['hparams']}".strip()] = row
    return out


def _split(line: str, rule: str) -> list[str]:
    """``line`` cut where the rule's dashes are (a cell may hold spaces)."""
    cuts, pos = [], 0
    for dashes in rule.split("  "):
        cuts.append((pos, pos + len(dashes)))
        pos += len(dashes) + 2
    return [line[a:b] for a, b in cuts]


def test_the_smoke_like_table_fits_160_characters(summary, no_columns):
    table = format_table(summary)
    lines = table.splitlines()
    assert WIDTH == 160 and max(len(line) for line in lines) <= 160
    header = lines[0].split()
    assert header[:4] == ["method", "M", "hparams", "n"]  # dataset, backbone: one value each
    assert {"Acc%", "NLL", "ECE%", "Disagr.%", "k_eff"} <= set(header)
    assert "Params" not in lines[0] and "Eval img/s" not in lines[0]
    footer = " ".join(lines[lines.index(next(x for x in lines if x.startswith("every row"))) :])
    assert footer.startswith("every row: dataset digits_hard, backbone digits_cnn; mean±std")
    assert "hparams: only what differs within a method" in footer
    assert "left out to fit 160 characters: Eval img/s, Params, APS α=0.1 cov.%" in footer
    assert "(COLUMNS=<more> widens the table; harness report writes every column)" in footer
    rows = _rows(table)
    # the two σN-Ens rows differ in τ alone: that is what their hparams shows
    assert {k for k in rows if k.startswith("sigma_ens")} == {
        "sigma_ens tau=0.2",
        "sigma_ens tau=2.0",
    }
    assert "packed_ensemble" in rows  # alpha=2, gamma=1: its only configuration, nothing differs
    # a single model's disagreement is no number
    assert rows["single"]["Disagr.%"] == "–" and rows["single+TS"]["Disagr.%"] == "–"
    assert rows["mimo"]["Disagr.%"] == "5.00" and rows["sigma_ens tau=2.0"]["k_eff"] == "3.00"
    assert rows["single"]["n"] == "2" and rows["sigma_ens tau=0.2"]["Acc%"] == "94.40±0.14"


def test_columns_wider_than_160_shows_every_column(summary, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    table = format_table(summary)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["dataset", "backbone"]
    assert "Params" in lines[0] and "Eval img/s" in lines[0] and "APS α=0.1 cov.%" in lines[0]
    assert max(len(line) for line in lines) == 223 and "left out" not in table
    assert format_table(summary, width=400) == table  # the same through the argument


@pytest.mark.parametrize("value", ["", "80", "0", "-300", "wide", "1e3", " 90 "])
def test_a_narrower_or_unreadable_columns_leaves_the_default(summary, monkeypatch, value):
    """$COLUMNS only ever widens the table: 80 (a narrow terminal) or text gives 160."""
    monkeypatch.delenv("COLUMNS", raising=False)
    default = format_table(summary)
    monkeypatch.setenv("COLUMNS", value)
    assert format_table(summary) == default


def test_differing_hparams_keeps_what_differs_within_each_method():
    methods = ["sigma_ens", "sigma_ens", "sigma_ens", "packed_ensemble", "single"]
    hparams = [
        "gate_fold=constant, lam=0.01, tau=0.2",
        "gate_fold=constant, lam=0.01, tau=2.0",
        "gate_fold=constant, lam=0.1, member_grad=shared, tau=2.0",
        "alpha=2, gamma=1",
        "",
    ]
    shown, narrowed = differing_hparams(methods, hparams)
    assert shown == [
        "lam=0.01, tau=0.2",
        "lam=0.01, tau=2.0",
        "lam=0.1, member_grad=shared, tau=2.0",  # the others have no member_grad: it differs
        "",
        "",
    ]
    assert narrowed
    # a list value keeps its commas; nothing to leave out when every setting differs
    assert differing_hparams(["m", "m"], ["sizes=[1, 2], w=1", "sizes=[3], w=1"]) == (
        ["sizes=[1, 2]", "sizes=[3]"],
        True,
    )
    assert differing_hparams(["m", "m"], ["w=1", "w=2"]) == (["w=1", "w=2"], False)


def test_the_summary_harness_run_prints_fits_too(tmp_path, no_columns):
    write_records(tmp_path, smoke_like_records())
    text = format_results(tmp_path)
    assert max(len(line) for line in text.splitlines()) <= 160
    assert "sigma_ens        4  tau=0.2" in text
