"""What keeps a report over 10,000 records cheap beyond the record index: the manifest parsed
once per report, and the rows of the last report reused (reports/row_cache.py) for the same page
and Markdown as a report without any cache."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
from record_factory import make_record, write_records

import reports.csv_cache as csv_cache
import reports.page as page
import reports.paired_rows as paired_rows
from harness.cli import main
from reports.csv_cache import write_csv
from reports.leaderboard import write_report
from reports.manifest_cache import manifest_of
from reports.row_cache import CACHE_FILE as ROWS_FILE
from reports.row_cache import RowCache


def _results_with_manifest(tmp_path):
    results = tmp_path / "toy"
    recs = [make_record(method=m, seed=s) for m in ("single", "deep_ensemble") for s in (0, 1)]
    write_records(results, recs)
    source = tmp_path / "toy.yaml"
    published = tmp_path / "toy.published.csv"
    published.write_text("dataset,backbone,method,M,hparams,metric,value,source\n"
                         "digits,mlp,deep_ensemble,4,,acc,0.91,paper\n")  # fmt: skip
    cells = {r["cell_id"]: {"label": r["cell_id"], "cell": r["config"]} for r in recs}
    manifest = {"suite": "toy", "source": str(source), "cells": cells, "current": list(cells)}
    (results / "suite.json").write_text(json.dumps(manifest), encoding="utf-8")
    return results


def test_a_report_parses_the_manifest_once_and_again_when_it_changes(tmp_path, monkeypatch):
    results = _results_with_manifest(tmp_path)
    parses = []  # reads of suite.json (each is followed by its parse)
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "suite.json":
            parses.append(self)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    out = tmp_path / "page"
    assert main(["report", str(results), "--no-figures", "-o", str(out)]) == 0
    assert len(parses) == 1  # expected cells and the published values' suite: one parse
    assert (out / "published.csv").is_file()  # found through the manifest's source
    # The manifest rewritten (a cell more expected): parsed again, the new cell is missing.
    data = json.loads(real(results / "suite.json"))
    data["cells"]["ffff0000"] = {"label": "toy/extra", "cell": {"dataset": "digits"}}
    data["current"].append("ffff0000")
    (results / "suite.json").write_text(json.dumps(data), encoding="utf-8")
    assert main(["report", str(results), "--no-figures", "-o", str(out)]) == 0
    assert len(parses) == 2
    assert "ffff0000" in (out / "leaderboard.html").read_text(encoding="utf-8")
    assert manifest_of(results)["current"][-1] == "ffff0000"


def test_the_manifest_is_digested_beside_it_and_the_digest_never_trusted(tmp_path, monkeypatch):
    from reports import manifest_cache
    from reports.manifest_cache import DIGEST_FILE

    def run(args: list[str]) -> int:
        manifest_cache._parsed.cache_clear()  # as in a new process
        return main(args)

    results = _results_with_manifest(tmp_path)
    parses = []
    real = Path.read_bytes
    monkeypatch.setattr(
        Path,
        "read_bytes",
        lambda p: (parses.append(p) if p.name == "suite.json" else None) or real(p),
    )
    out = tmp_path / "page"
    report = ["report", str(results), "--no-figures", "-o", str(out)]
    assert run(report) == 0
    assert not (results / DIGEST_FILE).exists()  # a manifest written within 2 s: not digested
    old = time.time() - 60
    os.utime(results / "suite.json", (old, old))
    assert run(report) == 0
    digest = json.loads((results / DIGEST_FILE).read_text())
    assert digest["source"] == str(tmp_path / "toy.yaml") and len(digest["expected"]) == 4
    parses.clear()
    assert run(report) == 0 and run(["report", str(results), "--no-figures"]) == 0
    assert parses == []  # expected cells and the published values' suite: from the digest
    assert (out / "published.csv").is_file()
    # A forged digest (another manifest's key, or a cell that is not a string) is ignored.
    for forged in ({**digest, "manifest": [1, 2]}, {**digest, "expected": [[1, "x"]]}):
        (results / DIGEST_FILE).write_text(json.dumps(forged))
        parses.clear()
        assert run(report) == 0
        assert len(parses) == 1
        assert json.loads((results / DIGEST_FILE).read_text()) == digest  # rewritten
    # --no-index neither reads nor writes it.
    (results / DIGEST_FILE).write_text("not json")
    parses.clear()
    assert run([*report, "--no-index"]) == 0
    assert len(parses) == 1 and (results / DIGEST_FILE).read_text() == "not json"


def _page_and_md(out) -> tuple[str, str]:
    """The page and the Markdown, less the one line that differs between runs (its time)."""
    strip = re.compile(r"report generated.*?(</li>|$)", re.M)
    html = (out / "leaderboard.html").read_text(encoding="utf-8")
    md = (out / "leaderboard.md").read_text(encoding="utf-8")
    return strip.sub("", html), strip.sub("", md)


def test_cached_rows_give_the_page_and_markdown_of_an_uncached_report(tmp_path, monkeypatch):
    results = tmp_path / "toy"
    recs = [make_record(method=m, M=M, seed=s, acc=0.8 + 0.01 * M + 0.002 * s + 0.01 * len(m))
            for m, M in (("deep_ensemble", 4), ("single", 1), ("mimo", 2), ("mimo", 4))
            for s in range(6)]  # fmt: skip
    write_records(results, recs)
    warm, cold = tmp_path / "warm", tmp_path / "cold"
    write_report(results, warm, figures=False)
    assert (warm / ROWS_FILE).is_file()
    made, made_paired = [], []  # leaderboard rows and paired-table rows formatted
    real = page.leaderboard_cells
    monkeypatch.setattr(page, "leaderboard_cells", lambda cells: made.append(1) or real(cells))
    real_row = paired_rows._row
    monkeypatch.setattr(
        paired_rows, "_row", lambda *a: made_paired.append(a[1][0]["method"]) or real_row(*a)
    )
    write_report(results, warm, figures=False)
    assert made == [] and made_paired == []  # every row from the cache
    write_report(results, cold, figures=False, index=False)
    assert _page_and_md(warm) == _page_and_md(cold)
    # mimo M=2 seed 0 changes: its row (and only it: the reference is deep_ensemble) is written
    # again, and the page is the page of a report without any cache.
    changed = next(r for r in recs if r["config"]["method"] == "mimo" and r["config"]["M"] == 2)
    changed["metrics"]["clean"]["acc"] = 0.5
    write_records(results, [changed])
    made.clear()
    made_paired.clear()
    write_report(results, warm, figures=False)
    assert len(made) == 1 and made_paired == ["mimo"]
    write_report(results, cold, figures=False, index=False)
    assert _page_and_md(warm) == _page_and_md(cold)
    assert "0.5" in _page_and_md(warm)[0] or "50.00" in _page_and_md(warm)[0]
    # A damaged cache is rebuilt, not trusted.
    (warm / ROWS_FILE).write_text('{"format": "harness-report-rows/1", "rows": 3}')
    made.clear()
    made_paired.clear()
    write_report(results, warm, figures=False)
    assert len(made) == 4 and sorted(made_paired) == ["mimo", "mimo", "single"]
    assert _page_and_md(warm) == _page_and_md(cold)


def test_the_row_cache_reads_the_rows_markup_back_from_the_page(tmp_path, monkeypatch):
    """The cache holds where each row's markup is in the page, not the markup; a page edited
    since (or gone) is not read from: its rows are written again, the same page results."""
    results, warm, cold = tmp_path / "toy", tmp_path / "warm", tmp_path / "cold"
    configs = (("deep_ensemble", 4), ("single", 1), ("mimo", 2))
    recs = [make_record(method=m, M=M, seed=s, acc=0.8 + 0.01 * M + 0.002 * s)
            for m, M in configs for s in range(6)]  # fmt: skip
    write_records(results, recs)
    write_report(results, warm, figures=False)
    write_report(results, cold, figures=False, index=False)
    cache = json.loads((warm / ROWS_FILE).read_bytes())
    spans = [v["cells_html"] for v in cache["rows"].values() if isinstance(v, dict)]
    assert len(spans) == 5 and all(isinstance(x, list) for x in spans)  # 3 + 2 paired rows
    page_text = (warm / "leaderboard.html").read_text(encoding="utf-8")
    assert all(page_text[a:b].startswith("<td data-col=") for a, b in spans)
    made = []
    real = page.leaderboard_cells
    monkeypatch.setattr(page, "leaderboard_cells", lambda cells: made.append(1) or real(cells))
    write_report(results, warm, figures=False)
    assert made == [] and _page_and_md(warm) == _page_and_md(cold)
    for damage in (lambda p: p.write_text(p.read_text().replace("digits", "DIGITS")), Path.unlink):
        damage(warm / "leaderboard.html")
        made.clear()
        write_report(results, warm, figures=False)
        assert len(made) == 3 and _page_and_md(warm) == _page_and_md(cold)


def _frame(n: int, change: int | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    acc = rng.random(n)
    if change is not None:
        acc[change] = 0.125
    tb = ['Traceback:\n  line 1, "x"\nError' if i % 7 == 3 else "" for i in range(n)]
    return pd.DataFrame({
        "cell_id": [f"c{i}" for i in range(n)], "acc": acc, "n": np.arange(n),
        "nll": [math.nan if i % 5 == 0 else 1 / (i + 1) for i in range(n)],
        "hparams": ['tau=0.5, "q"' if i % 2 else "" for i in range(n)], "error_traceback": tb,
        "ok": [i % 3 == 0 for i in range(n)], "label": ["σN-Ens €" for _ in range(n)],
    })  # fmt: skip


def test_csv_rows_are_reused_and_the_file_is_pandas_own(tmp_path, monkeypatch):
    out = tmp_path / "page"
    out.mkdir()
    path, want = out / "cells.csv", tmp_path / "want.csv"
    cache = RowCache(out)
    write_csv(_frame(40), path, cache)
    _frame(40).to_csv(want, index=False)
    assert path.read_bytes() == want.read_bytes()
    cache.save()
    formatted = []
    real = csv_cache._texts
    monkeypatch.setattr(csv_cache, "_texts", lambda f, pos: formatted.append(pos) or real(f, pos))
    for change in (None, 3, 10):  # unchanged; a row with a line break in a value; a plain row
        cache = RowCache(out)
        write_csv(_frame(40, change), path, cache)
        _frame(40, change).to_csv(want, index=False)
        assert path.read_bytes() == want.read_bytes()
        cache.save()
    assert formatted == [[], [3], [3, 10]]  # row 3 back to its first value: formatted again
    # The file edited since (same size): written in full, not spliced.
    text = bytearray(path.read_bytes())
    text[-3:-2] = b"9" if text[-3:-2] != b"9" else b"8"
    path.write_bytes(bytes(text))
    formatted.clear()
    write_csv(_frame(40, 10), path, RowCache(out))
    assert path.read_bytes() == want.read_bytes() and formatted == [list(range(40))]


def test_rows_that_cannot_be_hashed_are_written_by_pandas_without_a_cache(tmp_path):
    frame = pd.DataFrame({"cell_id": ["a", "b"], "members": [[0.9, 0.8], [0.7]], "acc": [0.5, 1.0]})
    cache = RowCache(tmp_path)
    write_csv(frame, tmp_path / "cells.csv", cache)
    frame.to_csv(tmp_path / "want.csv", index=False)
    assert (tmp_path / "cells.csv").read_bytes() == (tmp_path / "want.csv").read_bytes()
    assert cache.new_csv == {}  # nothing remembered for a frame it cannot key


def test_a_row_cache_written_by_someone_else_cannot_put_markup_into_the_page(tmp_path):
    results, out = tmp_path / "toy", tmp_path / "page"
    write_records(
        results, [make_record(method=m, seed=s) for m in ("single", "mimo") for s in (0, 1)]
    )
    write_report(results, out, figures=False)
    cache = json.loads((out / ROWS_FILE).read_bytes())
    evil = '<td data-col="acc" onmouseover="alert(1)"><script>alert(2)</script></td>'
    for key, row in cache["rows"].items():
        if isinstance(row, dict):
            row["cells_html"] = evil
        else:
            cache["rows"][key] = "| <img src=x onerror=alert(3)> |"
    forged = json.dumps(cache)
    # Written by someone else: a file others may write, or (where this test may give files
    # away) one another user owns.
    owners = [lambda p: p.chmod(0o666)]
    if os.geteuid() == 0:
        owners.append(lambda p: os.chown(p, 65534, 65534))
    for give_away in owners:
        (out / ROWS_FILE).write_text(forged, encoding="utf-8")
        give_away(out / ROWS_FILE)
        assert not RowCache(out).private
        write_report(results, out, figures=False)
        page_text = (out / "leaderboard.html").read_text(encoding="utf-8")
        md = (out / "leaderboard.md").read_text(encoding="utf-8")
        assert "alert(" not in page_text and "onerror" not in md
    assert page.is_leaderboard_markup(str(page.leaderboard_cells([])))
    assert not page.is_leaderboard_markup(evil)


def test_a_row_cache_only_this_user_could_write_is_not_checked_again(tmp_path, monkeypatch):
    results, out = tmp_path / "toy", tmp_path / "page"
    write_records(
        results, [make_record(method=m, seed=s) for m in ("single", "mimo") for s in (0, 1)]
    )
    umask = os.umask(0o022)  # (a umask of 002 leaves the file group-writable: not private)
    try:
        write_report(results, out, figures=False)
    finally:
        os.umask(umask)
    assert RowCache(out).private  # written by this report, 0644
    checked = []
    real = page.is_leaderboard_markup
    monkeypatch.setattr(page, "is_leaderboard_markup", lambda h: checked.append(h) or real(h))
    first = _page_and_md(out)
    write_report(results, out, figures=False)
    assert checked == []
    (out / ROWS_FILE).chmod(0o664)  # a group that may write it: every cached row checked
    write_report(results, out, figures=False)
    assert len(checked) == 2
    assert _page_and_md(out) == first
