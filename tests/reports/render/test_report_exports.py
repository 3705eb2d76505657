"""Reports for papers: new columns, mCE, intervals, the bolding rule, LaTeX, published values."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from record_factory import make_record, write_records
from test_reports import parse

from harness.cli import main as harness_main
from reports.columns import format_number, leaderboard_columns
from reports.records.results import from_records
from reports.render.latex import render_latex
from reports.render.leaderboard import render_html, render_markdown, write_report
from reports.render.page import ReportOptions
from reports.render.paired import paired_stats
from reports.render.published import read_published

PDFLATEX = shutil.which("pdflatex")
SOURCE = "https://example.org/paper, Table 2"


def _cells_on(method: str, M: int, accs, corr_shift: float = 0.0, **kw) -> list[dict]:
    """One record per seed; per-corruption accuracies: gaussian_noise acc − 0.1, contrast − 0.3."""
    recs = []
    for s, acc in enumerate(accs):
        cells = [
            {"corruption": c, "severity": sev, "acc": acc - d + corr_shift, "nll": 1.0, "ece": 0.1}
            for c, d in (("gaussian_noise", 0.1), ("contrast", 0.3))
            for sev in (1, 2)
        ]
        recs.append(
            make_record(
                method=method,
                M=M,
                seed=s,
                acc=acc,
                dataset="cifar10",
                backbone="wrn28_10",
                ood_sets=("svhn", "cifar100", "mnist"),
                overrides={"metrics": {"corruption": {"cells": cells}}},
                **kw,
            )
        )
    return recs


@pytest.fixture
def results():
    recs = _cells_on("single", 1, [0.80, 0.82, 0.81])
    recs += _cells_on("deep_ensemble", 4, [0.85, 0.86, 0.87], corr_shift=0.05)
    return from_records(recs)


def test_mce_against_the_named_baseline(results):
    s = results.summary.set_index("method")
    # single's mean error per corruption: gaussian 1 − (0.81 − 0.1) = 0.29, contrast 0.49.
    de_err = {"gaussian_noise": 1 - (0.86 - 0.1 + 0.05), "contrast": 1 - (0.86 - 0.3 + 0.05)}
    expected = np.mean([de_err["gaussian_noise"] / 0.29, de_err["contrast"] / 0.49])
    assert s.loc["deep_ensemble", "mCE_mean"] == pytest.approx(expected)
    assert s.loc["single", "mCE_mean"] == pytest.approx(1.0)
    assert s.loc["deep_ensemble", "corr/contrast/acc_mean"] == pytest.approx(0.86 - 0.3 + 0.05)
    none = results.with_mce_baseline(None).summary
    assert none["mCE_mean"].isna().all()
    html = render_html(results, [], options=ReportOptions(mce_baseline="deep_ensemble"))
    row = {r["cells"]["method"]["value"]: r["cells"] for r in parse(html).rows}
    assert float(row["deep_ensemble"]["mCE"]["value"]) == pytest.approx(1.0)
    assert "corruption error relative to deep_ensemble" in html


def test_new_columns_hidden_or_shown_with_a_picker(results):
    html = render_html(results, [])
    row = {r["cells"]["method"]["value"]: r["cells"] for r in parse(html).rows}["single"]
    shown = {k for k, c in row.items() if "hidden" not in c["attrs"]}
    hidden = set(row) - shown
    assert {"aurc", "mCE", "train_device_h", "ood_near/msp/auroc", "ood_far/msp/fpr95"} <= shown
    assert {"ood/svhn/entropy/auroc", "ood/svhn/mi/aupr_out", "ood/svhn/msp/aupr_in"} <= hidden
    assert {"ood_near/entropy/auroc", "aece", "train_ips"} <= hidden
    # near = CIFAR-100 only; far = SVHN and MNIST (OpenOOD v1.5), and the make_record values
    assert float(row["ood_near/msp/auroc"]["value"]) == pytest.approx(0.85)
    assert float(row["train_device_h"]["value"]) == pytest.approx(12.5 / 3600)
    toggles = re.findall(r'class="col-toggle" data-col="([^"]+)"( checked)?', html)
    assert ("aurc", " checked") in toggles and ("ood/svhn/mi/auroc", "") in toggles
    assert 'id="corruption-table"' in html and '<th class="num" data-col="contrast">' in html
    assert "Cost (measured on cpu)" in html  # the device the cost columns come from
    assert "Train CPU-h" in html  # device-hours named by the one kind of device


def test_interval_view_is_the_t_interval(results):
    html = render_html(results, [], options=ReportOptions(interval="ci"))
    acc = {r["cells"]["method"]["value"]: r["cells"] for r in parse(html).rows}["single"]["acc"]
    half = 4.302652729911275 * 0.01 / math.sqrt(3)  # t_{2,0.975} · std / √3
    assert acc["attrs"]["data-ci"] == f"81.00 ± {100 * half:.2f}"
    assert acc["attrs"]["data-std"] == "81.00 ± 1.00" and acc["text"].startswith("81.00 ± 2.48")
    md = render_markdown(results, options=ReportOptions(interval="ci"))
    assert "81.00 ± 2.48 (3)" in md and "95% t-interval" in md
    # per-corruption table: contrast = acc − 0.3 per seed, ± its 95% interval
    assert "| cifar10 | wrn28_10 | single | 1 |  | 71.00 ± 2.48 | 51.00 ± 2.48 |" in md


def test_shared_device_throughput_is_greyed_with_its_reason():
    cost = {"device": "cuda:0 NVIDIA H200", "precision": "bf16", "shared_device": True}
    recs = [make_record(method="single", M=1, seed=s, overrides={"cost": cost}) for s in (0, 1)]
    recs += [make_record(method="deep_ensemble", seed=s) for s in (0, 1)]
    html = render_html(from_records(recs), [])
    rows = {r["cells"]["method"]["value"]: r["cells"] for r in parse(html).rows}
    eval_ips = rows["single"]["eval_ips"]
    assert "shared" in eval_ips["classes"] and "2 of 2 seeds" in eval_ips["attrs"]["title"]
    assert "shared" not in rows["deep_ensemble"]["eval_ips"]["classes"]
    assert "shared" not in rows["single"]["params"]["classes"]  # counts are not throughput
    assert "several: cpu | cuda:0 NVIDIA H200, bf16" in html
    assert "Train device-h" in html and "Train GPU-h" not in html  # two kinds: not one name
    gpu_only = render_html(from_records(recs[:2]), [])
    assert "Train GPU-h" in gpu_only and "Cost (measured on cuda:0 NVIDIA H200, bf16)" in gpu_only


def test_bold_is_the_best_and_whatever_is_not_significantly_different():
    """Six seeds: B is 0.1 pp below A on every seed (told apart), C noisy around A (not)."""
    accs = [0.80, 0.82, 0.81, 0.83, 0.79, 0.84]
    recs = [make_record(method="A", seed=s, acc=a) for s, a in enumerate(accs)]
    recs += [make_record(method="B", seed=s, acc=a - 0.001) for s, a in enumerate(accs)]
    noise = [0.02, -0.03, 0.01, -0.02, 0.03, -0.015]
    recs += [
        make_record(method="C", seed=s, acc=a + e) for s, (a, e) in enumerate(zip(accs, noise))
    ]
    res = from_records(recs)
    for test in ("signflip", "t"):
        paired = paired_stats(res, "A", test=test)
        html = render_html(res, [], paired=paired, options=ReportOptions(test=test))
        rows = {r["cells"]["method"]["value"]: r["cells"] for r in parse(html).rows}
        bold = {m for m, cells in rows.items() if "best" in cells["acc"]["classes"]}
        assert bold == {"A", "C"}, (test, bold)
    # two seeds: nothing can be told apart by the sign-flip test, so no row is bold (issue 60
    # item 8: bold on every row read as every row winning)
    two = from_records([r for r in recs if r["config"]["seed"] < 2])
    rows = parse(render_html(two, [])).rows
    assert not any("best" in r["cells"]["acc"]["classes"] for r in rows)


def _published_csv(path, rows):
    lines = ["dataset,backbone,method,M,hparams,metric,value,source", *rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_published_vs_measured_from_a_file_and_from_the_suite(tmp_path, results):
    res_dir = tmp_path / "res"
    recs = _cells_on("single", 1, [0.80, 0.82, 0.81])
    recs += _cells_on("sigma_ens", 4, [0.9, 0.9, 0.9], hparams={"tau": 0.5})
    write_records(res_dir, recs)
    suite = tmp_path / "suites" / "paper.yaml"
    suite.parent.mkdir()
    suite.write_text("name: paper\n")
    _published_csv(
        tmp_path / "suites" / "paper.published.csv",
        [
            f'cifar10,wrn28_10,single,1,,acc,0.83,"{SOURCE}"',
            f"cifar10,wrn28_10,sigma_ens,4,tau=5e-1,nll,0.30,{SOURCE}",
            f"cifar10,wrn28_10,sigma_ens,4,tau=0.7,acc,0.95,{SOURCE}",  # not run here
        ],
    )
    (res_dir / "suite.json").write_text(json.dumps({"name": "paper", "source": str(suite)}))
    write_report(res_dir, tmp_path / "out", figures=False)
    out = pd.read_csv(tmp_path / "out" / "published.csv")
    single = out[out["method"] == "single"].iloc[0]
    assert single["measured_mean"] == pytest.approx(0.81)
    assert single["difference"] == pytest.approx(-0.02) and single["source"] == SOURCE
    assert out[out["hparams"] == "tau=5e-1"].iloc[0]["measured_mean"] == pytest.approx(0.35)
    assert pd.isna(out[out["hparams"] == "tau=0.7"].iloc[0]["measured_mean"])
    html = (tmp_path / "out" / "leaderboard.html").read_text()
    assert 'id="published-table"' in html and "−2.00 pp" not in html and "-2.00 pp" in html
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "## Published vs measured" in md and "| 83.00 | 81.00 ± 1.00 | 3 | -2.00 pp |" in md
    bad = _published_csv(tmp_path / "bad.csv", ["cifar10,wrn28_10,single,one,,acc,0.8,x"])
    with pytest.raises(ValueError, match=r"bad.csv:2: M must be an integer"):
        read_published(bad)
    (tmp_path / "hdr.csv").write_text("dataset,metric,value\n")
    with pytest.raises(ValueError, match="header must be dataset,backbone,method,M,hparams"):
        read_published(tmp_path / "hdr.csv")


def _latex_numbers(tex: str) -> dict[tuple[str, str], str]:
    """(method, metric key) → the mean as printed, from the first table of ``tex``."""
    keys = tex.split("% COLUMNS ", 1)[1].split("\n", 1)[0].split()
    body = tex.split(r"\midrule", 1)[1].split(r"\bottomrule", 1)[0]
    out = {}
    for line in body.strip().splitlines():
        cells = [c.strip().removesuffix(r"\\").strip() for c in re.split(r"(?<!\\)&", line)]
        for key, cell in zip(keys, cells[-len(keys) :]):
            mean = re.sub(r"\\textbf\{(.*)\}", r"\1", cell).split(r" $\pm$ ")[0]
            out[(cells[1], key)] = mean
    return out


@pytest.mark.latex
def test_latex_numbers_match_the_csv_and_it_compiles(tmp_path):
    recs = _cells_on("single", 1, [0.80, 0.82, 0.81])
    recs += _cells_on("deep_ensemble", 4, [0.85, 0.86, 0.87], hparams={"note": "50%_&_$x"})
    write_records(tmp_path / "res", recs)
    assert (
        harness_main(
            [
                "report",
                str(tmp_path / "res"),
                "-o",
                str(tmp_path / "out"),
                "--format",
                "latex",
                "--test",
                "t",
                "--holm",
            ]
        )
        == 0
    )
    tex = (tmp_path / "out" / "leaderboard.tex").read_text()
    csv = pd.read_csv(tmp_path / "out" / "leaderboard.csv").set_index("method")
    numbers = _latex_numbers(tex)
    kinds = {c.key: c.kind for c in leaderboard_columns(csv, hidden=False)}
    assert {"acc", "nll", "ece", "aurc", "cAcc", "mCE", "ood_far/msp/auroc"} <= set(kinds)
    for (method, key), printed in numbers.items():  # every number of the table
        want = csv.loc[method.replace("\\_", "_"), f"{key}_mean"]
        text = "--" if pd.isna(want) else format_number(want, kinds[key])
        assert printed == text, (method, key)
    # a single model's disagreement: no number in either (issue 60 item 8; the record holds 0)
    assert numbers[("single", "disagreement")] == "--"
    assert pd.isna(csv.loc["single", "disagreement_mean"])
    assert len(numbers) == 2 * len(kinds)
    assert r"\textbf{86.00 $\pm$ 2.48}" in tex  # best accuracy, ± the 95% t-interval
    assert r"50\%\_\&\_\$x" in tex and "paired t-test" in tex
    assert "% BEGIN TABLE cifar10" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    for fig in ("fig-corruption", "fig-ood"):  # every drawn figure, PNG and PDF beside the page
        assert (tmp_path / "out" / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
        assert (tmp_path / "out" / f"{fig}.pdf").read_bytes()[:5] == b"%PDF-"
    if PDFLATEX is None:
        if os.environ.get("HARNESS_REQUIRE_LATEX") == "1":
            pytest.fail("HARNESS_REQUIRE_LATEX=1 but pdflatex is not on PATH")
        pytest.skip(
            "pdflatex not found (apt-get install texlive-latex-base texlive-latex-recommended)"
        )
    run = subprocess.run(
        [PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", "leaderboard.tex"],
        cwd=tmp_path / "out",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert (tmp_path / "out" / "leaderboard.pdf").read_bytes()[:5] == b"%PDF-"


def test_latex_without_results_and_bad_options(tmp_path):
    empty = from_records([])
    tex = render_latex(empty, paired_stats(empty), ReportOptions())
    assert "No done cells." in tex and tex.startswith(r"\documentclass{article}")
    with pytest.raises(ValueError, match="unknown interval 'sd'; expected one of: std, ci"):
        ReportOptions(interval="sd")
    write_records(tmp_path / "res", [make_record()])
    with pytest.raises(ValueError, match="unknown format"):
        write_report(tmp_path / "res", tmp_path / "o", formats=("pdf",), figures=False)
