"""One way to register (issue 48, item 7): a plugin file adds a tracker and a figure with the
registry type and the ``--plugin`` route a method plugin uses; `harness run` sends the cells to
the plugin's tracker and `harness report` draws the plugin's figure."""

from __future__ import annotations

import json
import os
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
    monkeypatch.setenv(PLUGINS_ENV, os.environ.get(PLUGINS_ENV, ""))


def test_a_plugin_file_adds_a_tracker_and_a_figure(tmp_path, capsys, restore_plugins):
    from harness.storage.loggers import TRACKERS
    from reports.figures.base import FIGURES

    assert isinstance(TRACKERS, Registry) and isinstance(FIGURES, Registry)
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
    assert "jsonlines" in TRACKERS.names()
    assert [n for n, _ in FIGURES.registered()][-1] == "fig-acc-by-seed"  # after the built-ins

    assert main(["report", str(folder), "--plugin", PLUGIN]) == 0
    page = (folder / "leaderboard.html").read_text()
    assert 'id="fig-acc-by-seed"' in page and "Accuracy by seed (plugin)" in page


def test_an_unknown_tracker_names_the_registered_ones(tmp_path, capsys):
    suite = tmp_path / "plugged.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    assert main(["validate", str(suite), "--skip-data", "--logger", "jsonline"]) == 2
    err = capsys.readouterr().err
    assert "unknown tracker 'jsonline'" in err and "mlflow, tensorboard, wandb" in err
