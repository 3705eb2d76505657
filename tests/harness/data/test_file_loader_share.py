"""Decoder workers of concurrent local cells share the node's cores, and the loader's
throughput is timed after its start-up."""

from __future__ import annotations

import pytest
import torch

from harness.data._machinery import file_loader
from harness.data._machinery.file_loader import CONCURRENT_ENV, SMALL_SPLIT, default_workers
from harness.engine import cell_setup
from harness.executors.devices import bind_worker


@pytest.fixture
def cores_32(monkeypatch):
    monkeypatch.setattr(file_loader.os, "sched_getaffinity", lambda pid: set(range(32)))
    for name in ("HARNESS_LOADER_WORKERS", "LOCAL_WORLD_SIZE", CONCURRENT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_concurrent_cells_split_the_cores(cores_32, monkeypatch):
    big = SMALL_SPLIT + 1
    assert default_workers(big) == 16  # one cell: 31 cores for decoding, capped at 16
    monkeypatch.setenv(CONCURRENT_ENV, "4")
    assert default_workers(big) == 7  # 4 cells at once: 8 cores each, one for the loop
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_workers(big) == 3  # ... and 2 ranks per cell
    assert default_workers(SMALL_SPLIT) == 0


def test_local_worker_is_told_how_many_cells_run_at_once(monkeypatch):
    monkeypatch.setattr("harness.executors.interrupt.install_worker_handler", lambda: None)
    monkeypatch.delenv(CONCURRENT_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    bind_worker("1", 3)
    import os

    assert os.environ[CONCURRENT_ENV] == "3" and os.environ["CUDA_VISIBLE_DEVICES"] == "1"


class SlowStart:
    """A loader of 10 batches of 8 whose first batch takes 100 clock units (worker start-up),
    the others 1 each, on the fake clock below."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def __len__(self) -> int:
        return 10

    def __iter__(self):
        for i in range(10):
            self.clock[0] += 100.0 if i == 0 else 1.0
            yield torch.zeros(8, 1), torch.zeros(8)


def test_loader_throughput_excludes_the_start_up(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(cell_setup, "train_loader", lambda *a, **k: SlowStart(clock))
    monkeypatch.setattr(cell_setup.time, "perf_counter", lambda: clock[0])
    rate = cell_setup.loader_throughput(None, None, {"train": None}, torch.device("cpu"))
    assert rate == pytest.approx(8.0)  # 5 warm-up batches, then 1 unit per batch of 8
