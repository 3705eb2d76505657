"""One way to register (issue 48, item 7): a plugin file adds a tracker, a figure and a metric
column with the registry type and the ``--plugin`` route a method plugin uses; `harness run`
sends the cells to the plugin's tracker and computes its metric, and `harness report` draws the
plugin's figure and shows the metric's column (from the records, plugin loaded or not)."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap

import pytest

from harness.cli import main
from harness.registry.core import PLUGINS_ENV, Registry

PLUGIN = "tests.fixtures.tracker_figure_plugin"

SUITE = """
name: plugged
grid:
  datasets: [digits_hard]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  seeds: [0, 1]
  methods: [single]
recipe: {epochs: 2, batch_size: 32}
evaluation: {cost: false}
"""


@pytest.fixture
def restore_plugins(monkeypatch):
    """Undo what loading the plugin does in this process: ``$HARNESS_PLUGINS``, and its tracker,
    figure and metric in the registries. Left registered, its figure drew for every later
    report of the session and its metric was computed in every later cell (a test expecting
    no figure, or a record's exact keys, failed when it ran after this file)."""
    from harness.registry import METRICS
    from harness.registry import core as registry_core
    from harness.storage.loggers import TRACKERS
    from reports.figures.base import FIGURES

    monkeypatch.setenv(PLUGINS_ENV, os.environ.get(PLUGINS_ENV, ""))
    registries = (TRACKERS, FIGURES, METRICS)
    before = [set(r.names()) for r in registries]  # the built-ins loaded, then remembered
    yield
    for registry, names in zip(registries, before, strict=True):
        for name in set(registry._items) - names:
            del registry._items[name]
    # Imported again (and so registered again) by the next test that names it.
    registry_core._imported_plugins.discard(PLUGIN)
    sys.modules.pop(PLUGIN, None)


def test_a_plugin_file_adds_a_tracker_a_figure_and_a_metric(tmp_path, capsys, restore_plugins):
    import numpy as np

    import harness.api as h
    from harness.api import predictions
    from harness.registry import METRICS
    from harness.storage.loggers import TRACKERS
    from reports.figures.base import FIGURES

    assert all(isinstance(r, Registry) for r in (TRACKERS, FIGURES, METRICS))
    suite = tmp_path / "plugged.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    results = tmp_path / "results"
    code = main(["run", str(suite), "--results", str(results), "-q", "--executor", "inprocess",
                 "--plugin", PLUGIN, "--logger", "jsonlines"])  # fmt: skip
    assert code == 0
    folder = results / "plugged"
    for rec_path in folder.glob("*/record.json"):
        rec = json.loads(rec_path.read_text())
        lines = [
            json.loads(x) for x in (rec_path.parent / "jsonlines.log").read_text().splitlines()
        ]
        assert [x["step"] for x in lines[:-1]] == [1, 2]  # one line per epoch
        assert lines[0]["train.loss"] == pytest.approx(rec["history"][0]["train_loss"])
        assert lines[-1] == {"final_acc": rec["metrics"]["clean"]["acc"]}
        # The metric, computed by the engine, equals top-2 accuracy recomputed here from the
        # cell's own test-set probabilities.
        p = predictions(rec_path.parent, "test")
        top2 = np.argsort(-p.probs.mean(0), axis=-1)[:, :2]
        expected = float((top2 == p.labels[:, None]).any(-1).mean())
        assert rec["metrics"]["clean"]["top2"] == pytest.approx(expected, abs=1e-6)
        assert expected > rec["metrics"]["clean"]["acc"]  # top-2 ≥ top-1, strictly here
        assert rec["metrics"]["declared"] == [{"key": "top2", "label": "Top-2 acc (%)",
            "group": "Plugin", "kind": "pct", "direction": "higher", "hidden": False}]  # fmt: skip
    assert "jsonlines" in TRACKERS.names()
    assert [n for n, _ in FIGURES.registered()][-1] == "fig-acc-by-seed"  # after the built-ins
    assert [n for n, _ in METRICS.registered()][-1] == "top2"  # after the built-ins

    assert main(["report", str(folder), "--plugin", PLUGIN]) == 0
    page = (folder / "leaderboard.html").read_text()
    assert 'id="fig-acc-by-seed"' in page and "Accuracy by seed (plugin)" in page
    assert 'data-col="top2"' in page and 'data-better="higher"' in page
    assert "Top-2 acc (%)" in page
    # The Markdown leaderboard's column: its label, and the mean over the seeds in percent.
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*/record.json"))]
    mean = 100 * sum(r["metrics"]["clean"]["top2"] for r in records) / len(records)
    lines = [x for x in (folder / "leaderboard.md").read_text().splitlines() if x.startswith("| ")]
    header, row = ([c.strip() for c in x.split("|")] for x in lines[:2])  # one configuration
    at = header.index("Top-2 acc (%) ↑")  # its label, and ↑: higher is better
    assert row[at].startswith(f"{mean:.2f} ± ")
    # load_results has it too, under its key (docs/results.md)
    table = h.load_results(folder).set_index("cell_id")
    assert {r["cell_id"]: r["metrics"]["clean"]["top2"] for r in records} == table["top2"].to_dict()

    # Reported where the plugin is not loaded (its metric out of the registry, no --plugin):
    # the column, its label and its direction come from the records.
    top2 = METRICS._items.pop("top2")
    assert main(["report", str(folder)]) == 0
    page = (folder / "leaderboard.html").read_text()
    assert 'data-col="top2"' in page and "Top-2 acc (%)" in page
    (th,) = re.findall(r'<th [^>]*data-col="top2"[^>]*>', page)  # its leaderboard header
    assert 'data-better="higher"' in th
    assert "top2" in page.split("higher is better:", 1)[1].split(";", 1)[0]

    # Re-evaluated without it, the records would lose the metric: refused before any cell,
    # naming it and the way out; records unchanged. With the plugin, or --add-only, it runs.
    before = {p: p.read_text() for p in folder.glob("*/record.json")}
    assert main(["evaluate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no loaded plugin computes: top2 (2 cells" in err and "--add-only" in err
    assert before == {p: p.read_text() for p in folder.glob("*/record.json")}
    assert main(["evaluate", str(folder), "--add-only"]) == 0
    METRICS._items["top2"] = top2  # as loading the plugin (already imported here) registers it
    assert main(["evaluate", str(folder), "--plugin", PLUGIN]) == 0
    for rec_path in folder.glob("*/record.json"):
        old, new = json.loads(before[rec_path]), json.loads(rec_path.read_text())
        assert new["metrics"]["clean"]["top2"] == old["metrics"]["clean"]["top2"]
        assert new["metrics"]["declared"] == old["metrics"]["declared"]

    # A record that declares another metric gains the plugin's by --add-only: value and
    # declaration (a list add_missing would keep whole, hiding the new column).
    gain = {"key": "gain", "label": "Gain", "group": "Extra", "kind": "f3",
            "direction": "lower", "hidden": False}  # fmt: skip
    for rec_path in folder.glob("*/record.json"):
        rec = json.loads(rec_path.read_text())
        rec["metrics"]["clean"]["gain"] = 0.5
        del rec["metrics"]["clean"]["top2"]
        rec["metrics"]["declared"] = [gain]
        rec_path.write_text(json.dumps(rec))
    assert main(["evaluate", str(folder), "--add-only", "--plugin", PLUGIN]) == 0
    for rec_path in folder.glob("*/record.json"):
        old, new = json.loads(before[rec_path]), json.loads(rec_path.read_text())
        assert new["metrics"]["declared"] == [gain, *old["metrics"]["declared"]]
        assert new["metrics"]["clean"]["top2"] == old["metrics"]["clean"]["top2"]
        assert new["metrics"]["clean"]["gain"] == 0.5


def test_a_declared_metric_is_shown_and_bolded_from_the_records_alone():
    """A record's declaration gives the column its label, group, format and direction: the
    reporter needs no plugin for it, and the direction decides the bold best."""
    from reports.columns import leaderboard_columns
    from reports.records.results import from_records
    from reports.stats.bolding import bold_rows
    from tests.record_factory import make_record

    decl = {"key": "gain", "label": "Gain", "group": "Extra", "kind": "f3",
            "direction": "lower", "hidden": False}  # fmt: skip
    records = [
        make_record(method=method, seed=seed, M=4, overrides={
            "metrics": {"clean": {"gain": base + 0.01 * seed * seed}, "declared": [decl]}})
        for method, base in (("single", 0.9), ("deep_ensemble", 0.2))
        for seed in range(6)
    ]  # fmt: skip
    results = from_records(records)
    summary = results.summary
    (column,) = [c for c in leaderboard_columns(summary) if c.key == "gain"]
    assert (column.label, column.group, column.kind, column.better) == ("Gain", "Extra", "f3",
                                                                        "lower")  # fmt: skip
    bold = bold_rows(summary, results.cells, [column])
    assert summary.loc[sorted(bold["gain"]), "method"].tolist() == ["deep_ensemble"]
    flipped = dict(decl, direction="higher")  # the same values, the other direction
    for rec in records:
        rec["metrics"]["declared"] = [flipped]
    results = from_records(records)
    (column,) = [c for c in leaderboard_columns(results.summary) if c.key == "gain"]
    bold = bold_rows(results.summary, results.cells, [column])
    assert results.summary.loc[sorted(bold["gain"]), "method"].tolist() == ["single"]


def _gain_records(direction: str | None) -> list[dict]:
    """Six seeds each of two methods whose records hold and declare a metric ``gain`` (lower
    for deep_ensemble), declared with ``direction``."""
    from tests.record_factory import make_record

    decl = {"key": "gain", "label": "Gain", "group": "Extra", "kind": "f3",
            "direction": direction, "hidden": False}  # fmt: skip
    return [
        make_record(method=method, seed=seed, M=4, overrides={
            "metrics": {"clean": {"gain": base + 0.01 * seed * seed}, "declared": [decl]}})
        for method, base in (("single", 0.9), ("deep_ensemble", 0.2))
        for seed in range(6)
    ]  # fmt: skip


@pytest.fixture
def unregister_gain():
    """Takes ``gain`` out of the metric registry after the test (registered in this process)."""
    from harness.registry import METRICS

    yield
    METRICS._items.pop("gain", None)


@pytest.mark.parametrize(("registered", "best"), [("lower", "deep_ensemble"),
                                                  ("higher", "single")])  # fmt: skip
def test_a_registered_metric_direction_drives_bolding(registered, best, unregister_gain):
    """A metric registered here (``register_metric``) bolds its best by its registered
    direction: the same values bold the other method when the direction is the other one (the
    records, written before the plugin declared one, say none)."""
    from harness.contract.metric_spec import MetricSpec
    from harness.registry import register_metric
    from reports.columns import direction, leaderboard_columns
    from reports.records.results import from_records
    from reports.stats.bolding import bold_rows

    register_metric(MetricSpec("gain", "Gain", "Extra", "f3", registered))
    assert direction("gain") == registered
    results = from_records(_gain_records(None))
    (column,) = [c for c in leaderboard_columns(results.summary) if c.key == "gain"]
    assert column.better == registered
    bold = bold_rows(results.summary, results.cells, [column])
    assert results.summary.loc[sorted(bold["gain"]), "method"].tolist() == [best]


def test_a_computed_metric_cannot_take_a_key_the_engine_writes():
    """The engine writes metrics.clean's own keys (kl has no column but is measured): a plugin
    metric computed under one would overwrite the measurement, so declaring it fails."""
    from harness.contract.metric_spec import MetricSpec

    with pytest.raises(ValueError, match=r"metrics\.clean\.kl"):
        MetricSpec("kl", "KL", compute=lambda probs, targets: 0.0)
    assert MetricSpec("kl", "KL").compute is None  # a column of the measured value is fine


def test_records_with_and_without_plugin_metrics_report_together():
    """Only a record that declares metrics has the declarations column (an old record's rows
    and CSVs are unchanged); mixed with records that do not, the summary joins only theirs."""
    from reports.records.flatten import METRICS_DECLARED, flatten_record
    from reports.records.results import from_records
    from tests.record_factory import make_record

    plain = [make_record(method="single", seed=s, M=4) for s in range(6, 12)]  # other cells
    assert METRICS_DECLARED not in flatten_record(plain[0])
    assert METRICS_DECLARED not in from_records(plain).cells
    summary = from_records([*plain, *_gain_records("lower")]).summary
    texts = summary.set_index("method")[METRICS_DECLARED]
    assert summary.set_index("method").loc["single", "n"] == 12  # the old and new records
    assert texts["single"].startswith("[{") and "nan" not in texts["single"]
    assert json.loads(texts["deep_ensemble"])[0]["key"] == "gain"


def test_a_declared_key_never_replaces_what_groups_the_rows():
    """A record declaring a metric under a key of the row's identity (``method``) or a built-in
    measurement (``acc``) keeps its own: the declaration is left out, not the method's name."""
    from reports.records.flatten import METRICS_DECLARED, flatten_record
    from tests.record_factory import make_record

    # also keys of columns written after the clean metrics (validation, cost, errors)
    keys = ("method", "acc", "val_nll", "total_time_s", "error_type", "gain")
    decls = [{"key": k, "label": k} for k in keys]
    rec = make_record(method="single", acc=0.8, overrides={"metrics": {
        "clean": {"method": 1.0, "val_nll": 9.0, "total_time_s": 9.0, "error_type": 9.0,
                  "gain": 0.5},
        "val": {"nll": 0.3}, "declared": decls}})  # fmt: skip
    row = flatten_record(rec)
    assert (row["method"], row["acc"], row["gain"]) == ("single", 0.8, 0.5)
    assert (row["val_nll"], row["error_type"]) == (0.3, "")
    assert row["total_time_s"] != 9.0
    assert [d["key"] for d in json.loads(row[METRICS_DECLARED])] == ["gain"]


def test_an_unknown_tracker_names_the_registered_ones(tmp_path, capsys):
    suite = tmp_path / "plugged.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    assert main(["validate", str(suite), "--skip-data", "--logger", "jsonline"]) == 2
    err = capsys.readouterr().err
    assert "unknown tracker 'jsonline'" in err and "mlflow, tensorboard, wandb" in err


def test_a_declaration_this_reporter_cannot_read_leaves_its_column_out():
    """One record from a newer harness (a kind this one does not know) warns and leaves that
    column out; the report's other columns, and a readable declaration, are shown."""
    from reports.columns import metric_columns
    from reports.records.results import from_records
    from tests.record_factory import make_record

    good = {"key": "gain", "label": "Gain", "kind": "f3", "direction": "lower"}
    odd = {"key": "odd", "label": "Odd", "kind": "sparkline", "direction": "lower"}
    metrics = {"clean": {"gain": 0.5, "odd": 1.0}, "declared": [good, odd]}
    records = [make_record(method="single", seed=s, overrides={"metrics": metrics}) for s in (0, 1)]
    with pytest.warns(UserWarning, match="'odd' not shown"):
        keys = [c.key for c in metric_columns(None, from_records(records).summary)]
    assert "gain" in keys and "odd" not in keys and "acc" in keys


def test_harness_ls_lists_the_metric_columns_a_plugin_adds(capsys, restore_plugins):
    """`harness ls` lists the metric columns, built-in and a plugin's, with their group and
    direction: how a user finds which columns a record can hold."""
    assert main(["ls", "--plugin", PLUGIN]) == 0
    block = capsys.readouterr().out.split("metrics:\n", 1)[1].split("executors:\n", 1)[0]
    lines = block.splitlines()
    assert lines[0].split() == ["acc", "Acc", "(%)", "(Quality;", "higher", "is", "better;",
                                "built-in)"]  # fmt: skip
    assert "  nll              NLL (Quality; lower is better; built-in)" in lines
    assert (
        lines[-1]
        == "  top2             Top-2 acc (%) (Plugin; higher is better; computed by a plugin)"
    )
