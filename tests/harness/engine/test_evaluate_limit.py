"""``evaluation.limit`` (issue 60 item 6): a quick first look on N test images.

One tiny digits suite run with ``limit: 50``: its records carry the limit, its outcomes have 50
rows whose means are the record's metrics, its OOD and corruption sets are cut, the page and the
terminal say so, and ``h.paired`` refuses results that mix limited and full-set cells. Misuse of
the key is refused before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.misuse import TINY_SUITE, copy_results, no_traceback, run_tiny, tree_hashes

LIMITED = TINY_SUITE.replace(
    "evaluation: {",
    "evaluation: {limit: 50, corruptions: [gaussian_noise], severities: [1], ",
)


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Path:
    return run_tiny(tmp_path_factory.mktemp("limit"), LIMITED)[1]


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/record.json"))]


def test_limit_indices_fixed_nested_sorted():
    from harness.data._machinery.base import LIMIT_SEED, limit_indices

    a = limit_indices(1000, 50)
    assert a is not None and len(a) == 50 and torch.equal(a, a.sort().values)
    assert torch.equal(a, limit_indices(1000, 50))  # the same every call and run
    expected = torch.randperm(1000, generator=torch.Generator().manual_seed(LIMIT_SEED))[:50]
    assert torch.equal(a, expected.sort().values)
    assert set(a.tolist()) <= set(limit_indices(1000, 100).tolist())  # nested
    assert limit_indices(1000, None) is None and limit_indices(1000, 1000) is None
    assert limit_indices(1000, 5000) is None  # more than the set: the whole set


def test_zero_means_whole_set():
    from harness.contract import Evaluation

    assert Evaluation(limit=0).limit is None and Evaluation(limit=7).limit == 7


def test_records_outcomes_and_metrics_on_the_subset(limited):
    from harness.metrics.outcomes import read_outcomes

    recs = _records(limited)
    assert len(recs) == 2
    for rec in recs:
        assert rec["status"] == "done" and rec["evaluation"]["limit"] == 50
        clean = rec["metrics"]["clean"]
        assert sum(clean["reliability"]["count"]) == 50
        out = read_outcomes(limited / rec["cell_id"], 50, rec)
        assert out is not None and len(out["correct"]) == 50
        assert float(np.mean(out["correct"])) == pytest.approx(clean["acc"], abs=1e-6)
        assert float(np.mean(out["nll"])) == pytest.approx(clean["nll"], rel=1e-5)
        corr = rec["metrics"]["corruption"]["cells"][0]
        assert corr["corruption"] == "gaussian_noise" and 0 <= corr["acc"] <= 1
        assert set(rec["metrics"]["ood"]) == {"digits_heldout"}


def test_manual_computation_on_the_same_subset(limited):
    """The clean accuracy recomputed by hand: the trained single model on the 50 images that
    limit_indices picks from the test split harness.api.data gives."""
    from harness.contract import Cell
    from harness.data._machinery.base import default_data_root, limit_indices
    from harness.data._machinery.base import limited as cut
    from harness.engine.build import build_model, load_data, load_trained
    from harness.engine.evaluate import evaluate_split

    rec = next(r for r in _records(limited) if r["config"]["method"] == "single")
    cell_dir = limited / rec["cell_id"]
    cell = Cell.from_json(json.loads((cell_dir / "cell.json").read_text()))
    spec, splits = load_data(cell, default_data_root(None))
    model, _ = build_model(cell, spec, device=torch.device("cpu"))
    load_trained(cell, cell_dir, model, torch.device("cpu"))
    idx = limit_indices(len(splits["test"]), 50)
    subset = splits["test"].subset(idx)
    assert torch.equal(subset.labels, cut(splits["test"], 50).labels)
    m = evaluate_split(model, subset, spec, cell.recipe, torch.device("cpu"))
    assert m["acc"] == pytest.approx(rec["metrics"]["clean"]["acc"], abs=1e-6)
    assert m["nll"] == pytest.approx(rec["metrics"]["clean"]["nll"], rel=1e-5)


def test_ood_set_limited():
    from harness.data._machinery.base import default_data_root
    from harness.engine.evaluate import ood_split
    from harness.registry import DATASETS

    spec = DATASETS.get("digits")
    whole = ood_split("digits_heldout", spec, default_data_root(None))
    cut = ood_split("digits_heldout", spec, default_data_root(None), 50)
    assert len(whole) > 50 and len(cut) == 50
    assert len(ood_split("digits_heldout", spec, default_data_root(None), 10**6)) == len(whole)


def test_page_and_terminal_state_it(limited, tmp_path):
    from harness.cli import main
    from reports.render.terminal import format_results

    folder = copy_results(limited, tmp_path / "r")
    assert main(["report", str(folder)]) == 0
    html = (folder / "leaderboard.html").read_text()
    assert 'id="limit-note">Note: test limited to 50 images' in html
    # beside each limited row: single, deep_ensemble and the derived single+TS
    assert html.count('<span class="flag flag-limited">test limited to 50 images</span>') == 3
    text = format_results(folder)
    assert "single [limited]" in text and "deep_ensemble [limited]" in text
    assert "[limited]: test limited to 50 images" in " ".join(text.split())


def test_paired_refuses_limited_with_full(limited, tmp_path):
    import harness.api as h
    from harness.api._common import HarnessError
    from reports.records.index import load_results

    folder = copy_results(limited, tmp_path / "r")
    h.paired(folder, "single")  # one kind: compared
    rec_path = next(p for p in folder.glob("*/record.json")
                    if json.loads(p.read_text())["config"]["method"] == "single")  # fmt: skip
    rec = json.loads(rec_path.read_text())
    rec["evaluation"]["limit"] = None  # as a full-set evaluation of this cell records it
    rec_path.write_text(json.dumps(rec))
    cells = load_results(folder).cells
    assert sorted(cells["limit"].fillna(0).astype(int)) == [
        0,
        0,
        50,
    ]  # single, its +TS row; deep_ensemble
    before = tree_hashes(folder)
    with pytest.raises(HarnessError, match=r"mix cells scored on the whole test set \(cell "
                       r"[0-9a-f]+\) and on evaluation\.limit=50 \(cell [0-9a-f]+\)"):  # fmt: skip
        h.paired(folder, "single")
    assert tree_hashes(folder) == before


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.5", r"evaluation\.limit: expected int \| null, got float 0\.5"),
        ("-3", r"evaluation\.limit: must be >= 0, got -3"),
        ('"all"', r"evaluation\.limit: expected int \| null, got str 'all'"),
        ("true", r"evaluation\.limit: expected int \| null, got bool True"),
    ],
)
def test_misuse_refused_before_anything_is_written(tmp_path, capsys, value, message):
    import re

    from harness.cli import main

    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY_SUITE.replace("evaluation: {", f"evaluation: {{limit: {value}, "))
    assert main(["run", str(suite), "--executor", "inprocess", "--results",
                 str(tmp_path / "r"), "-q"]) != 0  # fmt: skip
    _, err = no_traceback(capsys)
    assert re.search(message, err), err
    assert tree_hashes(tmp_path / "r") == {}


def test_n_examples_suggests_limit(tmp_path, capsys):
    from harness.cli import main

    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY_SUITE.replace("evaluation: {", "evaluation: {n_examples: 50, "))
    assert main(["run", str(suite), "--executor", "inprocess", "--results",
                 str(tmp_path / "r"), "-q"]) != 0  # fmt: skip
    _, err = no_traceback(capsys)
    assert "evaluation.n_examples: unknown key. Did you mean 'limit'?" in err, err
    assert tree_hashes(tmp_path / "r") == {}
