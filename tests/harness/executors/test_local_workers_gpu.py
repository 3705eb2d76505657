"""The local executor on a multi-GPU node: multi-process cells and broken CUDA contexts.

GPU discovery is injected (fake ids), as in test_gpu_placement.py: on this CPU-only machine a
worker restricted to GPUs that do not exist trains on the CPU, and what is checked is the
``CUDA_VISIBLE_DEVICES`` each worker ran its cells under.

* A ``processes: 2`` cell runs in a worker that sees 2 GPUs (each worker of a one-process cell
  sees one, and a cell of 2 ranks needs 2), and finishes.
* A sticky CUDA error (simulated: the message CUDA gives for an illegal memory access) costs
  the one cell: its worker is replaced, and the cells after it run in a fresh process.
"""

from __future__ import annotations

import textwrap

import pytest

from harness.config.parse import load_suite
from harness.contract import Cell
from harness.contract.record import read_record
from harness.executors.base import ExecutorOptions
from harness.executors.devices import gpu_groups, is_sticky_cuda_error
from harness.executors.local import LocalWorkersExecutor, _run_cell_json

SUITE = """
name: gpus
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0, 1, 2]
  methods: [single]
recipe: {epochs: 1, batch_size: 128}
evaluation: {cost: false, corruptions: [], ood: []}
"""

ILLEGAL_ADDRESS = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call"
)
_broken = [False]  # this worker's CUDA context, as the simulation sees it


def poisoning_task(cell_json, results_dir, data_root, force, threads, shared, trackers=None):
    """Seed 1's training hits an illegal memory access; afterwards, like a real broken CUDA
    context, every training step in this process fails the same way."""
    from harness.engine import runner

    if Cell.from_json(cell_json).seed == 1 or _broken[0]:
        _broken[0] = True

        def broken_epoch(*args, **kwargs):
            raise RuntimeError(ILLEGAL_ADDRESS)

        runner.train_epoch = broken_epoch  # in this worker process only
    return _run_cell_json(cell_json, results_dir, data_root, force, threads, shared, trackers)


def test_sticky_error_messages_and_gpu_groups():
    assert is_sticky_cuda_error(ILLEGAL_ADDRESS)
    assert is_sticky_cuda_error("CUDA error: device-side assert triggered")
    assert not is_sticky_cuda_error("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not is_sticky_cuda_error("an illegal memory access was encountered")  # not CUDA's
    assert gpu_groups(["0", "1", "2", "3", "4"], 2) == ["0,1", "2,3"]
    assert gpu_groups(["0"], 2) == ["0"]  # too few: the cell fails with the launcher's message


@pytest.mark.slow
def test_sticky_cuda_error_costs_one_cell_and_replaces_the_worker(write_suite, tmp_path):
    cells = load_suite(write_suite(textwrap.dedent(SUITE))).cells()
    executor = LocalWorkersExecutor(
        ExecutorOptions(workers=1, threads=1, progress=False),
        discover=lambda: [],
        task=poisoning_task,
    )
    outcome = executor.run(cells, tmp_path, None, False)
    assert outcome.finished is True
    by_seed = {r["config"]["seed"]: r for r in outcome.records}
    assert [by_seed[s]["status"] for s in (0, 1, 2)] == ["done", "failed", "done"]
    assert by_seed[1]["error"]["message"].startswith("CUDA error: an illegal memory access")
    assert by_seed[1]["worker"]["poisoned"] is True
    assert not by_seed[0]["worker"]["poisoned"] and not by_seed[2]["worker"]["poisoned"]
    # One worker slot: seeds 0 and 1 ran in the first process, seed 2 in its replacement.
    assert by_seed[0]["worker"]["pid"] == by_seed[1]["worker"]["pid"]
    assert by_seed[2]["worker"]["pid"] != by_seed[1]["worker"]["pid"]
    assert read_record(tmp_path / cells[1].cell_id)["status"] == "failed"  # on disk too


@pytest.mark.slow
def test_two_process_cell_runs_in_a_worker_with_two_gpus(write_suite, tmp_path):
    text = (
        textwrap.dedent(SUITE)
        .replace("seeds: [0, 1, 2]", "seeds: [0]")
        .replace("batch_size: 128}", "batch_size: 128, processes: 2}")
    )
    cells = load_suite(write_suite(text)).cells()
    assert [c.recipe.processes for c in cells] == [2]
    executor = LocalWorkersExecutor(
        ExecutorOptions(threads=1, progress=False), discover=lambda: ["0", "1", "2"]
    )
    outcome = executor.run(cells, tmp_path, None, False)
    assert outcome.finished is True
    (rec,) = outcome.records
    assert rec["status"] == "done", rec.get("error")
    assert rec["worker"]["cuda_visible_devices"] == "0,1"
    assert [h["epoch"] for h in rec["history"]] == [1]


def test_inprocess_stops_after_a_sticky_cuda_error(write_suite, tmp_path, monkeypatch, capsys):
    """In the executor's own process a broken CUDA context cannot be replaced: the cell is
    recorded failed, no later cell starts, and the CLI says so in one line (exit 2)."""
    from harness.cli import main
    from harness.engine import runner

    real = runner.train_epoch

    def broken_for_seed_1(model, *args, **kwargs):
        if broken_for_seed_1.seed == 1:
            raise RuntimeError(ILLEGAL_ADDRESS)
        return real(model, *args, **kwargs)

    real_build = runner.build_model  # the runner calls the name it imported: patched there

    def build(cell, *args, **kwargs):
        broken_for_seed_1.seed = cell.seed
        return real_build(cell, *args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", broken_for_seed_1)
    monkeypatch.setattr(runner, "build_model", build)
    path = write_suite(textwrap.dedent(SUITE))
    argv = ["run", str(path), "--executor", "inprocess", "-q", "--results", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: digits/digits_cnn/single(M=1)/seed1")
    assert "the 1 cells after it were not started" in err[0]
    cells = load_suite(path).cells()
    results = tmp_path / "gpus"
    assert [read_record(results / c.cell_id) for c in cells][2] is None  # never started
    assert read_record(results / cells[1].cell_id)["status"] == "failed"
    assert read_record(results / cells[0].cell_id)["status"] == "done"
