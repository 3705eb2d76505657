"""The local executor places cells on every visible GPU, each worker seeing only its own.

Device discovery is injected (a fake set of GPU ids), so this runs on a CPU-only machine: a
worker restricted by ``CUDA_VISIBLE_DEVICES`` to a GPU that does not exist simply trains on the
CPU, and what is checked is the environment each worker ran its cells in.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.parse import load_suite
from harness.executors import resolve_name
from harness.executors.base import ExecutorOptions
from harness.executors.devices import ExecutorError, choose_gpus, parse_gpus, worker_slots
from harness.executors.local import LocalWorkersExecutor, _run_cell_json

SIX_CELLS = """
name: six
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0, 1, 2, 3, 4, 5]
  methods: [single]
recipe: {epochs: 1, batch_size: 128}
evaluation: {cost: false}
"""

FAKE_GPUS = ["0", "1", "2"]


def barrier_then_run(cell_json, results_dir, data_root, force, threads, shared, trackers=None):
    """Wait until 3 distinct workers hold a cell, then run it for real: proves the cells are
    spread over 3 workers without depending on how fast each one starts."""
    gate = Path(results_dir) / "_gate"
    gate.mkdir(exist_ok=True)
    (gate / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while len(list(gate.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    return _run_cell_json(cell_json, results_dir, data_root, force, threads, shared, trackers)


@pytest.mark.slow
def test_six_cells_spread_over_three_fake_gpus_each_worker_on_its_own(write_suite, tmp_path):
    cells = load_suite(write_suite(SIX_CELLS)).cells()
    assert len(cells) == 6
    executor = LocalWorkersExecutor(
        ExecutorOptions(threads=1, progress=False),
        discover=lambda: list(FAKE_GPUS),
        task=barrier_then_run,
    )
    assert "in 3 worker processes on GPUs 0, 1, 2" in executor.describe(6)
    outcome = executor.run(cells, tmp_path, None, False)
    assert outcome.finished is True and outcome.messages == []
    records = outcome.records
    assert sorted(r["cell_id"] for r in records) == sorted(c.cell_id for c in cells)
    assert all(r["status"] == "done" for r in records), [r.get("error") for r in records]
    device_of: dict[int, set[str]] = {}
    for r in records:
        device_of.setdefault(r["worker"]["pid"], set()).add(r["worker"]["cuda_visible_devices"])
    assert len(device_of) == 3  # three workers ran cells
    assert all(len(d) == 1 for d in device_of.values())  # each always on one device
    assert sorted(d for ds in device_of.values() for d in ds) == FAKE_GPUS  # a GPU each
    assert all(r["cost"]["shared_device"] is False for r in records)  # one cell per GPU
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "0"  # the parent was never restricted


def test_gpu_choice_and_cells_per_gpu():
    assert parse_gpus("0, 2") == ("0", "2") and parse_gpus(None) is None
    assert choose_gpus(("2", "0"), lambda: FAKE_GPUS) == ["2", "0"]
    assert choose_gpus(None, lambda: FAKE_GPUS) == FAKE_GPUS
    with pytest.raises(ExecutorError, match=r"^--gpus 7: no such GPU; visible GPUs: 0, 1, 2$"):
        choose_gpus(("0", "7"), lambda: FAKE_GPUS)
    # two cells per GPU: the GPUs interleaved, so fewer workers still spread first
    assert worker_slots(["0", "2"], 2, 4) == ["0", "2", "0", "2"]
    assert worker_slots(["0", "2"], 2, 3) == ["0", "2", "0"]
    with pytest.raises(ExecutorError, match=r"^--cells-per-gpu must be >= 1, got 0$"):
        worker_slots(["0"], 0, 1)

    ex = LocalWorkersExecutor(
        ExecutorOptions(gpus=("0", "2"), cells_per_gpu=2, threads=1), lambda: FAKE_GPUS
    )
    assert ex.describe(10).startswith("running 10 cells in 4 worker processes on GPUs 0, 2")
    assert ex.describe(1).startswith("running 1 cells in 1 worker processes on GPUs 0,")
    cpu = LocalWorkersExecutor(ExecutorOptions(workers=2, threads=1), lambda: [])
    assert cpu.describe(5).startswith("running 5 cells in 2 worker processes, 1 thread")


def test_auto_uses_local_workers_on_several_gpus():
    assert resolve_name("auto", 6, gpu_count=lambda: 3) == "local"
    assert resolve_name("auto", 6, gpu_count=lambda: 1) == "inprocess"
    assert resolve_name("auto", 6, gpu_count=lambda: 0) == "local"
    assert resolve_name("auto", 1, gpu_count=lambda: 3) == "inprocess"


def test_cli_rejects_a_gpu_that_is_not_visible(write_suite, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # discovery reads it; nothing runs
    path = str(write_suite(SIX_CELLS))
    argv = ["run", path, "--executor", "local", "--gpus", "3", "--results", str(tmp_path)]
    assert main(argv) == 2
    assert "error: --gpus 3: no such GPU; visible GPUs: 0, 1" in capsys.readouterr().err


def test_one_function_resolves_every_device_name(monkeypatch, capsys, write_suite):
    """``resolve_device``: what the runner, re-evaluation, a launcher (NCCL or gloo) and
    ``harness bench --device`` all use, on a machine faked to have 0 or 2 GPUs."""
    import dataclasses

    import torch

    from harness.cli import main
    from harness.engine import build
    from harness.engine.distributed import uses_cuda
    from harness.engine.environment import resolve_device

    assert not hasattr(build, "pick_device")  # the engine's second resolution is gone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda")  # torch's first CUDA call says why not
    with pytest.raises(ValueError, match=r"device 'cuda:0': this process sees 0 GPU\(s\)"):
        resolve_device("cuda:0")
    with pytest.raises(ValueError, match=r"unknown device 'gpu'; valid: auto, cpu, cuda, cuda:N"):
        resolve_device("gpu")
    assert main(["bench", "--device", "gpu", "--steps", "1"]) == 2
    assert "harness bench: error: --device: unknown device 'gpu'" in capsys.readouterr().err
    cell = load_suite(write_suite(SIX_CELLS)).cells()[0]  # recipe.device: auto
    assert not uses_cuda(cell)  # auto on a CPU machine: gloo
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"'cuda:2': this process sees 2 GPU\(s\)"):
        resolve_device("cuda:2")
    assert uses_cuda(cell)
    cpu = dataclasses.replace(cell, recipe=dataclasses.replace(cell.recipe, device="cpu"))
    assert not uses_cuda(cpu)


def test_a_device_has_one_name_in_every_file_of_a_cell(tmp_path, monkeypatch, write_suite):
    """``device_name``: the record's ``cost.device``, its ``environment.device`` (a CPU's detail
    added) and ``progress.json``'s device (the physical GPU added) say the same name."""
    import json

    import torch

    from harness.engine.cell_setup import run_conditions
    from harness.engine.environment import device_name, environment
    from harness.storage.progress import ProgressLog

    cell = load_suite(write_suite(SIX_CELLS)).cells()[0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    for device, name in (
        (torch.device("cuda"), "cuda:0 NVIDIA H200 #0"),
        (torch.device("cuda", 1), "cuda:1 NVIDIA H200 #1"),
        (torch.device("cpu"), "cpu"),
    ):
        assert device_name(device) == name
        assert run_conditions(cell, device, False)["device"] == name
        provenance = environment(device)["device"]
        assert provenance == name if device.type == "cuda" else provenance.startswith("cpu (")
        cell_dir = tmp_path / name.replace(" ", "_")
        ProgressLog(cell_dir, 0, 1, device_name(device), tensorboard=False).close()
        shown = json.loads((cell_dir / "progress.json").read_text())["device"]
        assert shown == (f"{name} (GPU 2)" if device.type == "cuda" else "cpu")


def test_a_record_names_the_processor_model(tmp_path, monkeypatch):
    """``environment.cpu``: the model from ``/proc/cpuinfo`` (seeded CPU cells agree to the last
    digit on one model, not across models), the architecture where the system does not say it."""
    import builtins
    import platform

    import torch

    from harness.engine import environment as env

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n")
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if str(path) == "/proc/cpuinfo":
            if not cpuinfo.exists():
                raise FileNotFoundError(path)
            return real_open(cpuinfo, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    cached = (env._cpuinfo, env._process)  # read once per process: this test's machines
    for reading in cached:
        reading.cache_clear()
    try:
        assert env.environment(torch.device("cpu"))["cpu"] == "AMD EPYC 7B13"
        cpuinfo.unlink()  # macOS, Windows: no /proc/cpuinfo
        env._cpuinfo.cache_clear()
        monkeypatch.setattr(platform, "processor", lambda: "")
        assert env.cpu_model() == platform.machine()
    finally:  # the next test reads the real machine
        for reading in cached:
            reading.cache_clear()
