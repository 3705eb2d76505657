"""A report at scale reads its 18 MB manifest once per process while it is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from record_factory import make_record, write_records

from harness.cli import main
from reports.render.terminal import manifest_of


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
