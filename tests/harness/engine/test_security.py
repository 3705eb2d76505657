"""Untrusted files and shared folders: weights files never run code; files the harness writes get
the umask's mode like a plain ``open()``; resume is bit-identical with the plain-types checkpoint.
"""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest
import torch

from harness.config.parse import load_suite
from harness.contract.record import read_record, validate_record
from harness.engine import runner
from harness.engine.runner import run_cell
from harness.storage.checkpoint import TRUST_ENV, UnsafeWeightsError, load_weights, save_atomic

SUITE = """
name: sec
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0]
  methods: [single]
recipe: {epochs: 2, batch_size: 128, lr: 0.05}
evaluation: {cost: false}
"""


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the file appears iff code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def write_payload(path: Path, marker: Path) -> Path:
    torch.save({"state_dict": {"w": torch.zeros(1)}, "extra": Payload(marker)}, path)
    return path


@pytest.fixture
def cell(write_suite):
    return load_suite(write_suite(textwrap.dedent(SUITE))).cells()[0]


def test_pickle_as_pretrained_is_refused_and_runs_nothing(write_suite, tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    marker = tmp_path / "pwned"
    evil = write_payload(tmp_path / "evil.pt", marker)
    text = textwrap.dedent(SUITE).replace(
        "methods: [single]",
        f"methods: [{{name: sigma_ens, M: [2], hparams: {{pretrained: '{evil}'}}}}]",
    )
    cell = load_suite(write_suite(text)).cells()[0]
    rec = run_cell(cell, tmp_path / "results", progress=False)
    validate_record(rec)
    assert rec["status"] == "failed"
    assert rec["error"]["type"] == "UnsafeWeightsError"
    assert rec["error"]["phase"] == "setup"
    assert f"refused to load {evil}: it needs full unpickling" in rec["error"]["message"]
    assert TRUST_ENV in rec["error"]["message"]
    assert not marker.exists()


def test_pickle_as_checkpoint_is_refused_and_runs_nothing(cell, tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    marker = tmp_path / "pwned"
    cell_dir = tmp_path / "results" / cell.cell_id
    cell_dir.mkdir(parents=True)
    write_payload(cell_dir / "checkpoint.pt", marker)
    rec = run_cell(cell, tmp_path / "results", progress=False)
    assert rec["status"] == "failed" and rec["error"]["phase"] == "train"
    assert rec["error"]["type"] == "UnsafeWeightsError"
    assert "checkpoint.pt: it needs full unpickling" in rec["error"]["message"]
    assert not marker.exists()


def test_trust_is_an_explicit_per_file_opt_in(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    evil = write_payload(tmp_path / "evil.pt", marker)
    monkeypatch.setenv(TRUST_ENV, str(tmp_path / "other.pt"))  # another file: no trust
    with pytest.raises(UnsafeWeightsError, match=r"refused to load .*evil\.pt"):
        load_weights(evil)
    assert not marker.exists()
    monkeypatch.setenv(TRUST_ENV, f"{tmp_path / 'other.pt'}{os.pathsep}{evil}")
    assert torch.equal(load_weights(evil)["state_dict"]["w"], torch.zeros(1))
    assert marker.exists()  # the user vouched for this file: full unpickling, code ran


def plain_open_mode(folder: Path) -> int:
    probe = folder / "probe.txt"
    with open(probe, "w") as f:
        f.write("x")
    mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    return mode


def interrupt_after(monkeypatch, epochs: int) -> None:
    """Make training raise KeyboardInterrupt (a Ctrl-C) when epoch ``epochs + 1`` starts."""
    real, calls = runner.train_epoch, {"n": 0}

    def interrupting(*args, **kwargs):
        if calls["n"] == epochs:
            raise KeyboardInterrupt("simulated Ctrl-C")
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", interrupting)


@pytest.mark.parametrize("umask", [0o002, 0o022])
def test_written_files_honour_the_umask(cell, tmp_path, monkeypatch, umask):
    from reports.render.leaderboard import write_report

    old = os.umask(umask)
    try:
        results = tmp_path / "results"
        results.mkdir()
        expected = plain_open_mode(results)
        assert expected == 0o666 & ~umask
        interrupt_after(monkeypatch, 1)
        with pytest.raises(KeyboardInterrupt, match="simulated Ctrl-C"):
            run_cell(cell, results, progress=False)
        cell_dir = results / cell.cell_id
        modes = {"checkpoint.pt": stat.S_IMODE((cell_dir / "checkpoint.pt").stat().st_mode)}
        monkeypatch.undo()
        assert run_cell(cell, results, progress=False)["status"] == "done"
        for name in ("record.json", "cell.json", "final.pt", "trained.json", "events.jsonl"):
            modes[name] = stat.S_IMODE((cell_dir / name).stat().st_mode)
        write_report(results, figures=False)
        for name in ("leaderboard.html", "leaderboard.csv", "leaderboard.md"):
            modes[name] = stat.S_IMODE((results / name).stat().st_mode)
    finally:
        os.umask(old)
    assert modes == dict.fromkeys(modes, expected)
    group_writable = bool(expected & stat.S_IWGRP)
    world_readable = bool(expected & stat.S_IROTH)
    assert (group_writable, world_readable) == (umask == 0o002, True)


def test_atomic_save_leaves_no_temp_and_keeps_old_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "w.pt"
    save_atomic({"a": torch.ones(2)}, path)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_atomic({"a": torch.zeros(2)}, path)
    assert torch.equal(load_weights(path)["a"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


def test_resume_is_bit_identical_with_mc_dropout_and_augmentation(
    write_suite, tmp_path, monkeypatch
):
    """MC Dropout draws from the global torch generator, crop/flip from the loader's per-epoch
    generator: a run interrupted after epoch 1 and resumed from its plain-types checkpoint ends
    with exactly the weights of an uninterrupted run."""
    text = (
        textwrap.dedent(SUITE)
        .replace("methods: [single]", "methods: [{name: mc_dropout, M: [2]}]")
        .replace("epochs: 2,", "epochs: 3, augment: crop_flip,")
    )
    cell = load_suite(write_suite(text)).cells()[0]
    assert cell.recipe.augment == "crop_flip"
    whole = run_cell(cell, tmp_path / "whole", progress=False)
    interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt, match="simulated Ctrl-C"):
        run_cell(cell, tmp_path / "resumed", progress=False)
    ckpt = torch.load(tmp_path / "resumed" / cell.cell_id / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 0 and set(ckpt["rng"]) == {"torch", "cuda", "numpy", "python"}
    monkeypatch.undo()
    resumed = run_cell(cell, tmp_path / "resumed", progress=False)
    a = load_weights(tmp_path / "whole" / cell.cell_id / "final.pt")
    b = load_weights(tmp_path / "resumed" / cell.cell_id / "final.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["metrics"] == whole["metrics"]
    assert read_record(tmp_path / "resumed" / cell.cell_id)["history"] == resumed["history"]
