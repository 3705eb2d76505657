"""The one pre-training decision (harness.engine.pretrain.single_to_train) and who trains the
`single` cell a conversion starts from: the runner, by calling itself (no callback), or the
executors before they start a multi-process cell's ranks (issue 40)."""

from __future__ import annotations

import dataclasses
import textwrap

from harness.config.parse import load_suite
from harness.engine import pretrain, runner
from harness.executors import ranks
from harness.executors.base import write_manifest

SUITE = """
name: conv
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  M: [2]
  seeds: [0]
  methods:
    - single
    - name: sigma_ens
      hparams: {pretrain_epochs: 1}
    - name: sigma_ens
      hparams: {pretrained: /nowhere/final.pt}
    - deep_ensemble
recipe: {epochs: 1, batch_size: 64}
evaluation: {cost: false}
"""


def cells(write_suite, tmp_path):
    suite = load_suite(write_suite(textwrap.dedent(SUITE)))
    write_manifest(suite, tmp_path)
    by = {}
    for c in suite.cells():
        key = c.method if c.method != "sigma_ens" else f"sigma_{sorted(c.shown_hparams())[0]}"
        by[key] = c
    return by


def test_single_to_train_is_the_one_decision(write_suite, tmp_path):
    c = cells(write_suite, tmp_path)
    assert pretrain.single_to_train(c["sigma_pretrain_epochs"], tmp_path) == c["single"]
    assert pretrain.single_to_train(c["sigma_pretrained"], tmp_path) is None  # given weights
    assert pretrain.single_to_train(c["deep_ensemble"], tmp_path) is None  # converts nothing
    assert pretrain.single_to_train(c["single"], tmp_path) is None


def test_the_runner_waits_for_a_leased_single_cell_then_takes_it_over(
    write_suite, tmp_path, monkeypatch
):
    """``leased``: another live process trains it, its record is waited for; when that
    process dies without one, the runner runs it again itself."""
    single = cells(write_suite, tmp_path)["single"]
    answers = iter([{"status": "leased"}, {"status": "leased"}, {"status": "done", "n": 3}])
    calls = []

    def fake_run_cell(
        cell, results_dir, data_root=None, force=False, progress=True, shared=False, trackers=None
    ):
        calls.append(cell.cell_id)
        return next(answers)

    waited = iter([None, {"status": "done", "n": 2}])  # the first trainer was killed
    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    monkeypatch.setattr(pretrain, "wait_for_record", lambda cell, results_dir: next(waited))
    assert runner.train_single(single, tmp_path, None) == {"status": "done", "n": 2}
    assert calls == [single.cell_id, single.cell_id]


def test_executors_train_the_single_cell_first_only_when_ranks_need_it(
    write_suite, tmp_path, monkeypatch
):
    """A one-process conversion leaves its `single` cell to the runner (a failed one is then
    attempted once, not once here and again there); a multi-process one has it trained before
    its ranks start."""
    c = cells(write_suite, tmp_path)
    conv = c["sigma_pretrain_epochs"]
    run: list[str] = []
    monkeypatch.setattr(
        ranks, "run_one", lambda cell, *a, **k: run.append(cell.cell_id) or {"status": "failed"}
    )
    ranks.pretrain_first(conv, tmp_path, None)
    assert run == []
    two = dataclasses.replace(conv, recipe=dataclasses.replace(conv.recipe, processes=2))
    ranks.pretrain_first(two, tmp_path, None)
    assert run == [c["single"].cell_id]
