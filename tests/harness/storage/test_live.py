"""A working cell's heartbeat (``live.json``, harness/storage/live.py): written at each epoch's
start and end and otherwise at most every ``every_s`` seconds, never per step; whole whenever
read; an earlier attempt's removed when a new one starts, its own once the record is written."""

from __future__ import annotations

import json

import pytest

from harness.storage.live import (
    HEARTBEAT_S,
    SLURM_HEARTBEAT_S,
    Heartbeat,
    duration,
    heartbeat_s,
    live_parts,
    read_live,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def on_disk(folder) -> dict:
    return json.loads((folder / "live.json").read_text())


def test_steps_are_written_at_most_every_interval_and_the_epochs_ends_always(tmp_path):
    clock = Clock()
    beat = Heartbeat(tmp_path, every_s=2.0, clock=clock)
    assert not (tmp_path / "live.json").exists()  # nothing until training or evaluation says
    beat.training(2, 10, 100)  # resumed after two epochs
    beat.begin_epoch(2)
    assert on_disk(tmp_path) == {"phase": "train", "epoch": 3, "epochs": 10, "step": 0,
                                 "steps": 100, "loss": None, "eta_s": None}  # fmt: skip
    for _ in range(50):  # 50 steps within the interval: not one write
        clock.t += 0.01
        beat.update(1)
    assert on_disk(tmp_path)["step"] == 0
    beat.set_postfix(loss="0.750")
    clock.t = 5.0  # past the interval: the next step writes
    beat.update(1)
    state = on_disk(tmp_path)
    assert (state["step"], state["loss"]) == (51, 0.75)
    # 51 steps in 5 s since training started; 749 steps left
    assert state["eta_s"] == pytest.approx(5.0 / 51 * 749)
    beat.update(1)
    assert on_disk(tmp_path)["step"] == 51  # just written: the next waits
    beat.end_epoch(0.5)
    assert (on_disk(tmp_path)["step"], on_disk(tmp_path)["loss"]) == (100, 0.5)  # at once
    assert [p.name for p in tmp_path.iterdir()] == ["live.json"]  # no temporary file left


def test_evaluation_passes_and_batches(tmp_path):
    clock = Clock()
    beat = Heartbeat(tmp_path, every_s=2.0, clock=clock)
    beat.evaluating("clean", 0, None, 0, 4)  # the evaluation starts: at once
    assert on_disk(tmp_path) == {"phase": "evaluate", "pass": "clean", "batch": 0,
                                 "batches": None, "passes_done": 0, "passes": 4}  # fmt: skip
    beat.evaluating("clean", 1, 10, 0, 4)
    assert on_disk(tmp_path)["batch"] == 0  # within the interval
    clock.t = 3.0
    beat.evaluating("clean", 3, 10, 0, 4)
    assert live_parts(read_live(tmp_path)) == ["evaluating: clean 3/10 batches (pass 1/4)"]
    beat.finish()
    assert read_live(tmp_path) is None


def test_a_new_attempt_removes_the_last_ones_heartbeat(tmp_path):
    (tmp_path / "live.json").write_text(json.dumps({"phase": "train", "epoch": 7}))
    Heartbeat(tmp_path)
    assert read_live(tmp_path) is None


def test_an_unwritable_heartbeat_is_not_the_cells_failure(tmp_path):
    beat = Heartbeat(tmp_path / "gone")  # its folder does not exist: every write fails
    beat.training(0, 2, 5)
    beat.begin_epoch(0)
    beat.update(5)
    beat.end_epoch(1.0)
    assert read_live(tmp_path / "gone") is None


def test_parts_and_the_eta_less_the_heartbeats_age():
    state = {"phase": "train", "epoch": 5, "epochs": 12, "step": 120, "steps": 312,
             "loss": 0.4123, "eta_s": 200.0, "age_s": 10.0}  # fmt: skip
    assert live_parts(state) == ["epoch 5/12", "step 120/312", "loss 0.412", "ETA 3m10s"]
    assert live_parts({**state, "loss": None, "eta_s": None}) == ["epoch 5/12", "step 120/312"]
    evaluating = {"phase": "evaluate", "pass": "fog s3", "batch": 2, "batches": None,
                  "passes_done": 3, "passes": 9}  # fmt: skip
    assert live_parts(evaluating) == ["evaluating: fog s3 2 batches (pass 4/9)"]
    assert live_parts({"phase": "setup"}) == []
    assert duration(3725) == "1h02m" and duration(-5) == "0m00s"


def test_a_slurm_task_beats_less_often_on_the_shared_file_system():
    assert heartbeat_s("slurm") == SLURM_HEARTBEAT_S > HEARTBEAT_S
    assert heartbeat_s("local") == heartbeat_s("inprocess") == HEARTBEAT_S
