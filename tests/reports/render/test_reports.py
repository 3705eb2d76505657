"""Reports: aggregation numbers, escaping, failed/missing cells, best-value direction, figures."""

from __future__ import annotations

import base64
import math
import re
from html.parser import HTMLParser

import pandas as pd
import pytest
from record_factory import DELETE, make_record, tau_sweep_records, write_records

from harness.cli import main
from harness.contract.errors import UsageError
from harness.contract.record import validate_record
from reports.columns import DIRECTIONS, cell_text, direction, leaderboard_columns
from reports.figures.base import FIGURES
from reports.figures.draw import pareto_front, render_figures
from reports.records.flatten import format_hparams
from reports.records.index import load_frame, load_results
from reports.records.results import from_records, missing_cells, records_to_frame
from reports.render.leaderboard import render_html, render_markdown, write_report
from reports.render.paired import paired_stats
from reports.render.terminal import format_results, format_table
from reports.stats.summary import aggregate

HOSTILE = "<script>alert(1)</script>"
HOSTILE_ATTR = '"><img src=x onerror=alert(2)>'
MATH = r"$\undefinedmacro{$"  # would break matplotlib's math text if not escaped


class _Table(HTMLParser):
    """Rows of ``table#leaderboard``, ``table#paired-table`` and ``table#problems``.

    Leaderboard and paired rows: their attrs and, per column, the td's classes, attrs and text.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []
        self.paired: list[dict] = []
        self.problems: list[dict] = []
        self._row: dict | None = None
        self._td: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            classes = (a.get("class") or "").split()
            self._row = {"attrs": a, "cells": {}}
            if "lb-row" in classes:
                self.rows.append(self._row)
            elif "paired-row" in classes:
                self.paired.append(self._row)
            else:
                self._row = None
                if "problem" in classes:
                    self.problems.append(a)
        elif tag == "td" and self._row is not None and "data-col" in a:
            self._td = {
                "classes": (a.get("class") or "").split(),
                "value": a["data-value"],
                "attrs": a,
                "text": "",
            }
            self._row["cells"][a["data-col"]] = self._td

    def handle_endtag(self, tag):
        if tag == "td":
            self._td = None

    def handle_data(self, data):
        if self._td is not None:
            self._td["text"] += data


def parse(html: str) -> _Table:
    t = _Table()
    t.feed(html)
    return t


def _seeds(acc, nll, **kw):
    return [make_record(seed=s, acc=a, nll=n, **kw) for s, (a, n) in enumerate(zip(acc, nll))]


@pytest.fixture
def records():
    """Group A: 3 seeds with known acc/nll + 1 failed seed; group B: one seed; C: a NaN seed."""
    recs = _seeds(
        [0.80, 0.85, 0.90], [1.0, 1.2, 1.7], method="deep_ensemble", M=4, params=4_000_000
    )
    recs.append(make_record(method="deep_ensemble", M=4, seed=3, status="failed"))
    recs.append(make_record(method="single", M=1, seed=0, acc=0.70, nll=1.5, params=1_000_000))
    recs += _seeds(
        [0.86, 0.88, 0.87],
        [0.5, 0.6, float("nan")],
        method="sigma_ens",
        M=4,
        hparams={"tau": 0.5, "lam": 0.1},
        k_eff=1.8,
        params=1_100_000,
    )
    return recs


def _row(summary: pd.DataFrame, method: str) -> pd.Series:
    rows = summary[summary["method"] == method]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def test_factory_records_are_valid(records):
    for rec in records:
        validate_record(rec)
    assert math.isnan(records[-1]["metrics"]["clean"]["nll"])


def test_aggregate_matches_hand_computed_mean_std_n(records):
    summary = aggregate(records_to_frame(records))
    assert len(summary) == 3
    a = _row(summary, "deep_ensemble")
    assert (a["n"], a["n_failed"], a["n_nonfinite"], a["seeds"]) == (3, 1, 0, "0, 1, 2")
    assert a["acc_mean"] == pytest.approx(0.85)
    assert a["acc_std"] == pytest.approx(0.05)  # sqrt(((-.05)² + 0 + .05²) / (3 - 1))
    assert a["acc_n"] == 3
    assert a["nll_mean"] == pytest.approx(1.3)
    assert a["nll_std"] == pytest.approx(math.sqrt((0.09 + 0.01 + 0.16) / 2))
    assert a["cAcc_mean"] == pytest.approx(0.85 - 0.24)  # mean over severities of acc - 0.08·s
    assert a["params_mean"] == 4_000_000 and a["params_std"] == 0
    b = _row(summary, "single")
    assert b["n"] == 1 and b["acc_mean"] == pytest.approx(0.70) and math.isnan(b["acc_std"])
    c = _row(summary, "sigma_ens")
    assert c["hparams"] == "lam=0.1, tau=0.5" and c["hp_tau"] == 0.5
    assert (c["n"], c["nll_n"], c["n_nonfinite"]) == (3, 2, 1)  # the NaN seed is left out of NLL
    assert c["nll_mean"] == pytest.approx(0.55)
    assert c["nll_std"] == pytest.approx(math.sqrt(0.005))
    assert c["acc_n"] == 3 and c["acc_mean"] == pytest.approx(0.87)
    assert c["k_eff_mean"] == pytest.approx(1.8)  # the last epoch's k_eff_mean


def test_flattened_columns():
    rec = make_record(
        method="sigma_ens",
        hparams={"tau": 0.1},
        ood_sets=("svhn", "mnist"),
        auroc=0.9,
        fpr95=0.3,
        k_eff=2.0,
    )
    row = records_to_frame([rec]).iloc[0]
    assert row["ood/svhn/msp/auroc"] == pytest.approx(0.9)
    assert row["ood/mnist/entropy/fpr95"] == pytest.approx(0.31)
    assert row["sev5_ece"] == pytest.approx(0.03 + 0.05)
    assert row["member_acc"] == pytest.approx(0.9 - 0.025)  # mean of 0.89, 0.88, 0.87, 0.86
    assert row["eval_ips"] == 5000 and math.isnan(row["eval_mem_mib"])  # null on CPU
    assert row["k_eff"] == pytest.approx(2.0) and row["hparams"] == "tau=0.1"
    # k_eff on the effective member scale, last epoch; the gradient ratio of the first epoch.
    assert row["k_eff_scale"] == pytest.approx(2.1) and row["grad_ratio"] == pytest.approx(4.0)
    columns = {c.key: c for c in leaderboard_columns(aggregate(records_to_frame([rec])))}
    assert (columns["grad_ratio"].label, columns["grad_ratio"].group) == (
        "∇ ratio ep.1",
        "Diversity",
    )
    assert columns["importance_mean"].kind == "f3" and "num_features" not in columns  # undeclared


def test_records_without_declarations_show_their_last_epochs_numeric_diagnostics():
    """Records written before methods declared diagnostics (docs/results/**): every numeric key
    of the last epoch, under its own name and label, in the "Diagnostics" group, hidden but for
    k_eff (shown by default: reports.columns.SHOWN_DIAGNOSTICS)."""
    old = make_record(method="sigma_ens", hparams={"tau": 0.1}, k_eff=2.0)
    del old["diagnostics"]["declared"]
    row = records_to_frame([old]).iloc[0]
    assert row["k_eff"] == pytest.approx(2.0) and row["grad_ratio"] == pytest.approx(2.0)  # last
    assert row["num_features"] == 192 and "epoch" not in row and "layers" not in row
    columns = {c.key: c for c in leaderboard_columns(aggregate(records_to_frame([old])))}
    assert {"k_eff", "k_eff_scale", "grad_ratio", "importance", "l_div", "tau", "lam"} <= set(
        columns
    )
    assert (columns["k_eff"].label, columns["k_eff"].group, columns["k_eff"].hidden) == (
        "k_eff",
        "Diagnostics",
        False,
    )
    assert columns["grad_ratio"].hidden and columns["k_eff_scale"].hidden
    assert [f.id for f in render_figures(records_to_frame([old])) if f.id == "fig-keff"] == []
    plain = make_record(method="single", M=1)  # no per-epoch diagnostics: no columns
    columns = leaderboard_columns(aggregate(records_to_frame([plain])))
    assert [c.key for c in columns if c.group == "Diagnostics"] == []


def test_a_declared_diagnostic_never_overwrites_a_metric():
    rec = make_record(method="sigma_ens", hparams={"tau": 0.1}, k_eff=2.0)
    rec["diagnostics"]["declared"] = [{"key": "k_eff", "label": "x", "column": "acc"}]
    assert records_to_frame([rec]).iloc[0]["acc"] == rec["metrics"]["clean"]["acc"]


def test_format_helpers():
    assert format_hparams({"tau": 0.5, "lam": 1e-3, "name": "x"}) == "lam=0.001, name=x, tau=0.5"
    assert cell_text(0.85, 0.05, 3, "pct", show_n=True) == "85.00 ± 5.00 (3)"
    assert cell_text(0.7, float("nan"), 1, "pct", show_n=True) == "70.00 (1)"
    assert cell_text(4_000_000.0, 0.0, 3, "count", show_n=True) == "4.00M (3)"
    assert cell_text(float("nan"), float("nan"), 0, "f3", show_n=True) == "–"


def test_directions_table():
    """The metric columns' directions come from their registration, the rest from the table."""
    assert "acc" not in DIRECTIONS  # a registered metric column declares its own
    higher = ("acc", "cAcc", "auroc", "eval_ips", "train_ips", "ts/acc", "val_acc")
    assert {direction(k) for k in higher} == {"higher"}
    lower = ("nll", "ece", "brier", "fpr95", "params", "flops", "eval_mem_mib", "cECE", "ts/nll")
    assert {direction(k) for k in lower} == {"lower"}
    assert direction("disagreement") is None and direction("k_eff") is None
    assert direction("ood/svhn/msp/auroc") == "higher"
    assert direction("ood/svhn/entropy/fpr95") == "lower"
    assert direction("sev3_acc") == "higher"
    assert direction("disagreement") is None and direction("k_eff") is None


def test_variant_keeps_different_recipes_apart():
    recs = [
        make_record(seed=s, overrides={"config": {"recipe": {"epochs": e}}})
        for s in (0, 1)
        for e in (2, 50)
    ]
    summary = aggregate(records_to_frame(recs))
    assert sorted(summary["variant"]) == ["recipe.epochs=2", "recipe.epochs=50"]
    assert list(summary["n"]) == [2, 2]


@pytest.mark.slow  # renders every output of a hostile folder (~10 s); CI runs it
def test_hostile_config_values_are_escaped_everywhere(tmp_path):
    recs = [
        make_record(
            method=HOSTILE,
            hparams={"note": HOSTILE_ATTR, "m": MATH},
            dataset=HOSTILE_ATTR,
            seed=s,
            backbone=MATH,
        )
        for s in (0, 1)
    ]
    recs.append(
        make_record(
            method="deep_ensemble",
            backbone=HOSTILE,
            status="failed",
            error={"type": "ValueError", "message": HOSTILE, "traceback": HOSTILE},
        )
    )
    recs.append(make_record(method="deep_ensemble", dataset=HOSTILE_ATTR, acc=0.8))
    write_records(tmp_path / "res", recs)
    html = write_report(tmp_path / "res", tmp_path / "out").read_text()
    assert HOSTILE not in html and HOSTILE_ATTR not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert html.count("<script") == 1  # the page's own inline script only
    assert "<img src=x" not in html
    rows = parse(html).rows
    assert {r["attrs"]["data-dataset"] for r in rows} == {HOSTILE_ATTR}  # attribute round-trips
    assert {r["cells"]["method"]["value"] for r in rows} == {HOSTILE, "deep_ensemble"}
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert HOSTILE not in md and "&lt;script&gt;" in md
    assert "failed: " not in html  # no figure broke on the hostile labels
    assert "data:image/png;base64," in html
    # Each drawn figure's PNG beside the page; its PDF only with --format latex (a paper's).
    files = {p.name for p in (tmp_path / "out").glob("fig-*")}
    assert {"fig-ood.png", "fig-cost.png", "fig-curves.png"} <= files
    assert all(name.endswith(".png") for name in files), files
    write_report(tmp_path / "res", tmp_path / "out", formats=("latex",))  # a paper's files
    pdfs = {p.name: p.read_bytes()[:5] for p in (tmp_path / "out").glob("fig-*.pdf")}
    assert pdfs == {name.replace(".png", ".pdf"): b"%PDF-" for name in files}
    write_report(tmp_path / "res", tmp_path / "out")  # a later report: no PDF of older data left
    assert {p.name for p in (tmp_path / "out").glob("fig-*")} == files


def test_markdown_tables_escape_every_cell_and_align_numbers_right():
    """One writer for every Markdown table: headers and cells escaped alike (an OOD set or a
    diagnostic label from a record is a header), text columns left, numbers right."""
    from reports.render.markdown import _table

    assert _table(["set a|b", "<n>"], "lr", [["x&y", 3], ["line\nbreak", "1 | 2"]]) == [
        "| set a\\|b | &lt;n&gt; |",
        "|---|---:|",
        "| x&amp;y | 3 |",
        "| line break | 1 \\| 2 |",
    ]
    assert _table(["a", "b", "c", "d"], "lrl", [])[1] == "|---|---:|---|---|"  # last letter repeats


def test_failed_invalid_and_missing_cells_still_report(tmp_path, records):
    res = tmp_path / "results" / "toy"
    write_records(res, records)
    (res / "pending-cell").mkdir()  # a cell whose worker has not written its record yet
    (res / "broken").mkdir()
    (res / "broken" / "record.json").write_text("{not json")
    (res / "oldschema").mkdir()
    bad = dict(records[0], schema_version=0, cell_id="oldschema")
    (res / "oldschema" / "record.json").write_text(__import__("json").dumps(bad))
    expected = [r["cell_id"] for r in records] + ["never-started"]
    html_path = write_report(res, tmp_path / "report", expected=expected, figures=False)
    html = html_path.read_text()
    problems = {p["data-cell"]: p["data-status"] for p in parse(html).problems}
    failed_id = next(r["cell_id"] for r in records if r["status"] == "failed")
    assert problems == {
        failed_id: "failed",
        "pending-cell": "missing",
        "broken": "invalid",
        "oldschema": "invalid",
        "never-started": "missing",
    }
    assert "RuntimeError: CUDA out of memory" in html
    assert "schema_version 0 is not one of" in html  # the validator names the bad version
    assert re.search(r'id="count-failed"[^>]*>1 failed', html)
    assert len(parse(html).rows) == 3  # all three configurations still on the board
    csv = pd.read_csv(tmp_path / "report" / "leaderboard.csv")
    assert sorted(csv["method"]) == ["deep_ensemble", "sigma_ens", "single"]
    assert csv.loc[csv["method"] == "deep_ensemble", "acc_mean"].item() == pytest.approx(0.85)
    assert len(pd.read_csv(tmp_path / "report" / "cells.csv")) == len(records)
    md = (tmp_path / "report" / "leaderboard.md").read_text()
    assert "| failed |" in md and "never-started" in md
    text = format_results(res)
    assert "1 failed" in text and "2 invalid" in text and "2 missing" not in text


def test_report_writes_next_to_results_by_default(tmp_path, records):
    write_records(tmp_path, records[:3])
    path = write_report(tmp_path, figures=False)
    assert path == tmp_path / "leaderboard.html"
    assert {p.name for p in tmp_path.glob("leaderboard.*")} == {
        "leaderboard.html",
        "leaderboard.csv",
        "leaderboard.md",
    }
    again = load_results(tmp_path)  # the report files are not mistaken for cells
    assert again.problems == []


def test_missing_results_folder_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "nope")


def test_expected_configs_match_records(records):
    cfgs = [
        {"config": {"method": "single", "M": 1, "seed": 0}},  # present
        {"method": "single", "M": 1, "seed": 5},  # a config mapping, absent
        "does-not-exist",
    ]
    missing = missing_cells(cfgs, records)
    assert [(p.cell_id, p.status) for p in missing] == [
        ("(no id)", "missing"),
        ("does-not-exist", "missing"),
    ]
    assert "single" in missing[0].config and "seed=5" in missing[0].config
    with pytest.raises(TypeError, match="give a cell id"):
        missing_cells([3.5], records)


def test_best_value_highlighted_in_the_better_direction():
    # A: higher accuracy, worse NLL and more parameters; B: lower NLL and fewer parameters.
    # Six seeds, so the sign-flip test can tell them apart (p = 2/64); same ECE: a tie.
    seeds = range(6)
    recs = [
        make_record(method="A", acc=0.9, nll=0.8, params=9_000_000, seed=s, ece=0.03) for s in seeds
    ]
    recs += [
        make_record(method="B", acc=0.8, nll=0.4, params=1_000_000, seed=s, ece=0.03) for s in seeds
    ]
    recs += [make_record(method="C", dataset="other", acc=0.1, nll=9.0, seed=0)]
    res = from_records(recs)
    rows = {r["cells"]["method"]["value"]: r["cells"] for r in parse(render_html(res, [])).rows}
    best = {m: {k for k, c in cells.items() if "best" in c["classes"]} for m, cells in rows.items()}
    assert {"acc", "cAcc"} <= best["A"] and "nll" not in best["A"]
    assert {"nll", "params"} <= best["B"] and "acc" not in best["B"]
    assert "ece" in best["A"] and "ece" in best["B"]  # a tie: both are best
    assert best["C"] == set()  # alone in its dataset: nothing to compare against
    assert rows["A"]["acc"]["text"].strip() == "90.00 (6)"  # std 0 → no ± part
    assert rows["A"]["acc"]["value"] == repr(0.9)
    md = render_markdown(res)
    assert "**0.400 (6)**" in md and "**90.00 (6)**" in md


def test_page_is_self_contained(records, sweep_figures):
    html = render_html(from_records(records), sweep_figures)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "default-src 'none'" in html
    imgs = re.findall(r'<img[^>]+src="([^"]+)"', html)
    assert imgs and all(src.startswith("data:image/png;base64,") for src in imgs)
    for key in (
        'id="leaderboard"',
        'id="filter-dataset"',
        'id="filter-backbone"',
        'id="filter-M"',
        'id="provenance"',
        'id="conventions"',
        'id="problems"',
    ):
        assert key in html
    assert "ID as the positive class" in html and "15 equal-width bins" in html
    assert "0123456789abcdef0123456789abcdef01234567" in html and "torch_uncertainty" in html


def _sweep():
    return tau_sweep_records()


def _is_png(b64: str | None) -> bool:
    return b64 is not None and base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_figures():
    """Every figure of a τ × M sweep with a deep-ensemble baseline and a failed cell, once."""
    return render_figures(records_to_frame([*_sweep(), make_record(status="failed")]))


def test_figures_render_png_for_suitable_data(sweep_figures):
    # then the figure σN-Ens's records declare for k_eff (methods/sigma_ens.py), drawn as declared
    assert [f.id for f in sweep_figures] == [*(n for n, _ in FIGURES.registered()), "fig-keff"]
    assert sweep_figures[-1].title == "σN-Ens k_eff vs τ"
    # the factory's records hold no reliability bins
    # (tests/reports/figures/test_report_calibration.py draws it)
    assert {f.id: f.note for f in sweep_figures if not _is_png(f.png)} == {
        "fig-reliability": "skipped: needs reliability bins (metrics.clean.reliability)"
    }


def test_figures_skip_without_their_data():
    recs = [
        make_record(
            method="deep_ensemble",
            M=4,
            seed=s,
            corruption=False,
            ood_sets=(),
            overrides={
                "cost": {"params_total": None, "eval_images_per_s": None},
                "history": [],  # no per-epoch validation metrics: no training curves
            },
        )
        for s in (0, 1)
    ]
    figures = {f.id: f for f in render_figures(records_to_frame(recs))}
    assert all(f.png is None for f in figures.values())
    assert figures["fig-tau-frontier"].note == (
        "skipped: needs σN-Ens (sigma_ens) cells at two or more values of τ"
    )
    assert figures["fig-ood"].note.startswith("skipped: needs OOD results")
    assert render_figures(records_to_frame([])) and all(
        f.png is None for f in render_figures(records_to_frame([]))
    )


def test_pareto_front_by_hand():
    acc = [0.90, 0.85, 0.88, 0.80, 0.91]
    ece = [0.05, 0.02, 0.04, 0.03, 0.08]
    # (.85, .02) has the best ECE; (.88, .04), (.90, .05), (.91, .08) each add accuracy;
    # (.80, .03) is beaten by (.85, .02) on both.
    assert pareto_front(acc, ece) == [1, 2, 0, 4]
    assert pareto_front([0.9, float("nan")], [0.1, 0.0]) == [0]


def test_terminal_table(records):
    evil = make_record(method="evil\x1b[2J\nname", dataset="zz")  # an ANSI clear-screen
    assert "\x1b" not in format_table(records_to_frame([evil]))
    assert "evil?[2J name" in format_table(records_to_frame([evil]))
    cells = records_to_frame(records)
    text = format_table(cells)
    lines = text.splitlines()
    assert lines[0].split()[:6] == ["dataset", "backbone", "method", "M", "hparams", "n"]
    assert "85.00±5.00" in text and "1.300±0.361" in text
    assert "70.00 " in text + " " and "1 failed cell not shown" in lines[-1]
    assert len(lines) == 2 + 3 + 1
    widths = {len(line) for line in lines[:2]}
    assert len(widths) == 1  # fixed width header and rule
    assert format_table(aggregate(cells)).splitlines()[2:5] == lines[2:5]
    assert format_table(records_to_frame([])) == "no done cells"


def test_terminal_table_of_a_results_folder(tmp_path, records):
    write_records(tmp_path, records)
    text = format_table(load_frame(tmp_path))  # what `harness run` prints at the end
    assert "85.00±5.00" in text and "1 failed cell not shown" in text


def test_empty_results_folder_reports(tmp_path):
    html = write_report(tmp_path, tmp_path / "out", figures=False).read_text()
    assert 'id="no-records"' in html and 'id="count-done">0 done' in html


def test_record_without_optional_sections():
    rec = make_record(corruption=False, ood_sets=(), overrides={"metrics": {"val": DELETE}})
    summary = aggregate(records_to_frame([rec, {**rec, "cell_id": "b"}]))
    assert math.isnan(summary["cAcc_mean"].item()) and "ood" not in "".join(summary.columns)
    html = render_html(from_records([rec]), [])
    assert 'data-col="cAcc"' not in html and "cAcc (%)" in html  # listed as left out
    assert 'id="dropped-columns"' in html


def _paired_records(single: bool = True) -> list[dict]:
    """6 seeds (the fewest with which the sign-flip test can mark): σN-Ens +2 pp accuracy over the
    deep ensemble, same NLL; single −10 pp, worse NLL."""
    recs = []
    for s, acc in enumerate([0.80, 0.84, 0.82, 0.86, 0.83, 0.81]):
        nll = 0.40 + 0.01 * s
        recs.append(make_record(method="deep_ensemble", M=4, seed=s, acc=acc, nll=nll))
        recs.append(
            make_record(
                method="sigma_ens", M=4, hparams={"tau": 0.5}, seed=s, acc=acc + 0.02, nll=nll
            )
        )
        if single:
            recs.append(make_record(method="single", M=1, seed=s, acc=acc - 0.1, nll=nll + 0.2))
    recs.append(make_record(method="sigma_ens", M=4, hparams={"tau": 0.5}, seed=7))  # no pair
    return recs


def test_paired_section_csv_and_markers(tmp_path):
    write_records(tmp_path / "res", _paired_records())
    html = write_report(tmp_path / "res", tmp_path / "out", figures=False).read_text()
    assert '<section id="paired">' in html and "<h1>Leaderboard — toy</h1>" in html
    assert "Δ vs deep_ensemble, mean over paired seeds, 95% t-interval" in html
    assert "exact sign-flip permutation test" in html and 'id="no-mark-possible"' not in html
    table = parse(html)
    paired = {r["attrs"]["data-method"]: r for r in table.paired}
    assert set(paired) == {"sigma_ens", "single"}  # the reference is not compared with itself
    assert {r["attrs"]["data-reference"] for r in table.paired} == {"deep_ensemble M=4"}
    acc = paired["sigma_ens"]["cells"]["acc"]
    assert acc["text"].split("▲")[0].strip() == "+2.00 [+2.00, +2.00]"  # pp; constant shift
    assert {"delta", "sig", "better"} <= set(acc["classes"]) and acc["attrs"]["data-n"] == "6"
    assert float(acc["value"]) == pytest.approx(0.02) and float(acc["attrs"]["data-lo"]) > 0
    nll = paired["sigma_ens"]["cells"]["nll"]
    assert nll["text"].strip() == "0.000 [0.000, 0.000]" and "sig" not in nll["classes"]
    worse = paired["single"]["cells"]["nll"]
    assert {"sig", "worse"} <= set(worse["classes"]) and "▼" in worse["text"]
    # the leaderboard marks the same cells next to their means
    board = {r["cells"]["method"]["value"]: r["cells"] for r in table.rows}
    assert {"sig", "sig-better"} <= set(board["sigma_ens"]["acc"]["classes"])
    assert "▲" in board["sigma_ens"]["acc"]["text"]
    assert "sig" not in board["sigma_ens"]["nll"]["classes"]
    assert (
        "▼" in board["single"]["acc"]["text"]
        and "sig" not in board["deep_ensemble"]["acc"]["classes"]
    )
    csv = pd.read_csv(tmp_path / "out" / "paired.csv")
    row = csv[(csv["method"] == "sigma_ens") & (csv["metric"] == "acc")].iloc[0]
    assert row["n_pairs"] == 6 and row["seeds"] == "0, 1, 2, 3, 4, 5"  # seed 7 has no pair
    assert row["mean_diff"] == pytest.approx(0.02) and bool(row["significant"])
    assert row["p_value"] == pytest.approx(2 / 64) and row["test"] == "signflip"
    assert row["ci_lo"] == pytest.approx(float(acc["attrs"]["data-lo"]))
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "## Δ vs deep_ensemble, mean over paired seeds, 95% t-interval" in md
    assert "| deep_ensemble M=4 | 6 | **+2.00 [+2.00, +2.00] ▲** |" in md
    assert "▲/▼: p ≤ 0.05 by the exact sign-flip permutation test (two-sided)" in md


def test_reference_choice(tmp_path, capsys):
    write_records(tmp_path / "res", _paired_records())
    html = write_report(tmp_path / "res", tmp_path / "a", figures=False, reference="single")
    paired = parse(html.read_text()).paired
    assert {r["attrs"]["data-method"] for r in paired} == {"deep_ensemble", "sigma_ens"}
    assert {r["attrs"]["data-reference"] for r in paired} == {"single M=1"}  # M=1 vs M=4
    with pytest.raises(UsageError, match="--reference nope: no done cells of that method"):
        write_report(tmp_path / "res", tmp_path / "b", figures=False, reference="nope")
    assert not (tmp_path / "b").exists()  # nothing half-written
    # on the command line: one line naming the option and the methods there, exit status 2
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "b"), "--reference",
                 "nope", "--no-figures"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("error: --reference nope: no done cells") and "unexpected" not in err
    assert "methods: deep_ensemble, sigma_ens, single" in err
    only = [r for r in _paired_records(single=False) if r["config"]["method"] == "sigma_ens"]
    write_records(tmp_path / "bare", only)
    html = write_report(tmp_path / "bare", tmp_path / "c", figures=False).read_text()
    assert 'id="paired"' not in html and 'id="sig-legend"' not in html
    assert pd.read_csv(tmp_path / "c" / "paired.csv").empty  # header only
    res = from_records(_paired_records(single=False))
    assert "Δ vs deep_ensemble" in render_markdown(res)
    paired = parse(render_html(res, [], reference="sigma_ens")).paired
    assert [r["attrs"]["data-reference"] for r in paired] == ["sigma_ens M=4 (tau=0.5)"]
    apart = [make_record(method="deep_ensemble", dataset="a"), make_record(method="x", dataset="b")]
    html = render_html(from_records(apart), [])
    assert "Δ vs deep_ensemble" in html and 'id="no-pairs"' in html  # nothing shares a dataset


def test_paired_section_escapes_hostile_names():
    recs = []
    for s in (0, 1, 2):
        recs.append(make_record(method=HOSTILE, M=4, seed=s, acc=0.9, hparams={"x": HOSTILE_ATTR}))
        recs.append(make_record(method="deep_ensemble", M=4, seed=s, acc=0.8))
    res = from_records(recs)
    for html in (render_html(res, []), render_html(res, [], reference=HOSTILE)):
        assert HOSTILE not in html and HOSTILE_ATTR not in html
        assert html.count("<script") == 1
        assert len(parse(html).paired) == 1
    assert "Δ vs &lt;script&gt;alert(1)&lt;/script&gt;" in render_html(res, [], reference=HOSTILE)
    row = parse(render_html(res, [])).paired[0]
    assert row["attrs"]["data-method"] == HOSTILE  # attribute round-trips
    md = render_markdown(res)
    assert HOSTILE not in md and "&lt;script&gt;" in md


def test_two_seeds_never_mark_and_the_page_says_why(tmp_path):
    """Smoke-like results (n = 2): a clear shift still gets no mark from the sign-flip test."""
    recs = [
        make_record(method=m, M=4, seed=s, acc=a + 0.01 * s)
        for s in (0, 1)
        for m, a in (("deep_ensemble", 0.8), ("sigma_ens", 0.9), ("single", 0.5))
    ]
    res = from_records(recs)
    html = render_html(res, [])
    table = parse(html)
    assert table.paired and not any(
        "sig" in c["classes"] for r in table.paired for c in r["cells"].values()
    )
    assert "▲" not in html.split('id="sig-legend"')[0] and 'id="no-mark-possible"' in html
    assert "cannot reach p ≤ 0.05 with fewer than 6 paired seeds" in html
    # the t-test can mark at n = 2; the page then names it
    by_t = render_html(res, [], paired=paired_stats(res, test="t", holm=True))
    assert "paired t-test" in by_t and "Holm-adjusted" in by_t


def _history(accs, nlls):
    return [
        {"epoch": e, "lr": 0.1, "train_loss": 1.0, "val_acc": a, "val_nll": n}
        for e, (a, n) in enumerate(zip(accs, nlls), start=1)
    ]


def test_training_curves_are_columns_per_epoch_and_drawn_as_the_seed_mean():
    """The plateau figure: validation accuracy/NLL from `history` and k_eff from the per-epoch
    diagnostics become `curve/<key>/<epoch>` columns; each line is the mean over seeds."""
    from reports.figures.draw import training_curves

    recs = [
        make_record(method="single", M=1, seed=s, corruption=False, ood_sets=(),
                    overrides={"history": _history(accs, [0.9, 0.6, 0.5])})
        for s, accs in ((0, [0.70, 0.80, 0.84]), (1, [0.72, 0.84, 0.86]))
    ]  # fmt: skip
    recs.append(
        make_record(method="sigma_ens", hparams={"tau": 0.1}, corruption=False, ood_sets=(),
                    k_eff=2.0, overrides={"history": _history([0.6, 0.7], [1.0, 0.8])})
    )  # fmt: skip
    frame = records_to_frame(recs)
    single = frame[frame["method"] == "single"].sort_values("seed")
    assert list(single["curve/val_acc/002"]) == [0.80, 0.84]
    assert list(single["curve/val_nll/003"]) == [0.5, 0.5]
    sigma = frame[frame["method"] == "sigma_ens"].iloc[0]
    assert sigma["curve/k_eff/000"] == pytest.approx(2.3) and sigma["curve/k_eff/001"] == 2.0
    assert math.isnan(single.iloc[0]["curve/k_eff/001"])  # single keeps no sharing

    fig = training_curves(frame)
    acc_ax, nll_ax, keff_ax = fig.axes[:3]
    assert [a.get_ylabel() for a in (acc_ax, nll_ax, keff_ax)] == [
        "Validation accuracy (%)  ↑", "Validation NLL  ↓", "k_eff on σ(γ)"
    ]  # fmt: skip
    lines = {tuple(line.get_xdata()): list(line.get_ydata()) for line in acc_ax.get_lines()}
    assert lines[(1, 2, 3)] == pytest.approx([71.0, 82.0, 85.0])  # single, mean of two seeds
    assert lines[(1, 2)] == pytest.approx([60.0, 70.0])  # σN-Ens, one seed
    (keff,) = [line for line in keff_ax.get_lines() if len(line.get_xdata())]
    assert list(keff.get_xdata()) == [0, 1] and keff.get_ydata()[-1] == pytest.approx(2.0)
    # no per-epoch values at all: nothing to draw
    bare = make_record(corruption=False, overrides={"history": []})
    assert training_curves(records_to_frame([bare])) is None
    assert figures_note(bare) == (
        "skipped: needs per-epoch validation metrics (recipe.validation) or σN-Ens's per-epoch "
        "k_eff"
    )


def figures_note(record):
    return {f.id: f.note for f in render_figures(records_to_frame([record]))}["fig-curves"]


def test_records_without_diagnostic_declarations_say_how_to_get_their_figures():
    """A σN-Ens τ sweep written before methods declared their diagnostics draws no k_eff vs τ;
    the page says why and what to run instead of leaving the figure out silently."""
    old = [
        make_record(method="sigma_ens", hparams={"tau": t}, k_eff=2.0, corruption=False,
                    ood_sets=(), overrides={"diagnostics": {"declared": DELETE}})
        for t in (0.1, 1.0)
    ]  # fmt: skip
    figures = {f.id: f for f in render_figures(records_to_frame(old))}
    assert "fig-keff" not in figures
    assert figures["fig-diagnostics"].png is None
    assert figures["fig-diagnostics"].note == (
        "skipped: 2 record(s) keep per-epoch diagnostics without their methods' declarations "
        "(written by an older harness); `harness upgrade <results folder>` adds them, and the "
        "figures they declare (k_eff vs τ)"
    )
    new = [make_record(method="sigma_ens", hparams={"tau": t}, k_eff=2.0) for t in (0.1, 1.0)]
    figures = {f.id: f for f in render_figures(records_to_frame(new))}
    assert "fig-diagnostics" not in figures and figures["fig-keff"].png is not None
