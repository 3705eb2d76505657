"""Resuming a cell onto a device that is not the CPU.

The runner loads ``checkpoint.pt`` with ``map_location=<the cell's device>``, so on a GPU every
tensor of it (the random states included) is a CUDA tensor, and ``.numpy()`` of a CUDA tensor
raises. The ``meta`` device cannot stand in for the GPU on this value path (``.cpu()`` of a meta
tensor fails too), so the stand-in is a ``TorchFunctionMode`` that refuses ``.numpy()`` and
``.tolist()`` on every tensor the runner loaded from the checkpoint, unless it went through
``.cpu()`` first: exactly what a CUDA tensor would require.
"""

from __future__ import annotations

import textwrap
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from harness.config.parse import load_suite
from harness.engine.runner import run_cell
from harness.storage.checkpoint import load_weights

SUITE = """
name: resume_device
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0]
  methods: [single]
recipe: {epochs: 2, batch_size: 128, augment: crop_flip}
evaluation: {cost: false, corruptions: [], ood: []}
"""


class OnDevice(TorchFunctionMode):
    """Tagged tensors behave as if they lived on an accelerator: host conversions
    (``.numpy()``, ``.tolist()``) raise as they would for CUDA, ``.cpu()`` gives a host copy."""

    def __init__(self) -> None:
        super().__init__()
        self._tagged: dict[int, weakref.ref] = {}  # by id: a tensor's == is elementwise
        self.refused: list[str] = []

    def tag(self, t: torch.Tensor) -> None:
        self._tagged[id(t)] = weakref.ref(t)

    def is_tagged(self, t: torch.Tensor) -> bool:
        ref = self._tagged.get(id(t))
        return ref is not None and ref() is t

    @property
    def count(self) -> int:
        """How many tensors were ever tagged."""
        return len(self._tagged)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if args and isinstance(args[0], torch.Tensor) and self.is_tagged(args[0]):
            if name in ("numpy", "tolist"):
                self.refused.append(name)
                raise TypeError(
                    f"can't convert cuda:0 device type tensor to {name}. Use Tensor.cpu() to "
                    "copy the tensor to host memory first."
                )
            if name == "cpu":  # a host copy: a new tensor object, not tagged
                return args[0].detach().clone()
        return func(*args, **kwargs)


def test_stand_in_refuses_what_cuda_refuses():
    mode = OnDevice()
    t = torch.arange(3)
    mode.tag(t)
    with mode:
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            t.numpy()
        with pytest.raises(TypeError, match="to tolist"):
            t.tolist()
        assert t.cpu().tolist() == [0, 1, 2]
    assert mode.refused == ["numpy", "tolist"]


def test_resume_onto_a_device_stand_in_continues_the_run(write_suite, tmp_path, monkeypatch):
    from harness.engine import runner

    cell = load_suite(write_suite(textwrap.dedent(SUITE))).cells()[0]
    whole = run_cell(cell, tmp_path / "whole", progress=False)

    real_epoch, calls = runner.train_epoch, {"n": 0}

    def stop_in_second_epoch(*args, **kwargs):
        if calls["n"] == 1:
            raise KeyboardInterrupt("simulated preemption")
        calls["n"] += 1
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", stop_in_second_epoch)
    with pytest.raises(KeyboardInterrupt, match="simulated preemption"):
        run_cell(cell, tmp_path / "resumed", progress=False)
    monkeypatch.setattr(runner, "train_epoch", real_epoch)

    mode, loads = OnDevice(), []

    def load_onto_device(path, map_location="cpu"):
        obj = load_weights(path, map_location="cpu")
        if path.name == "checkpoint.pt":  # the runner asked for map_location=<device>
            loads.append(map_location)
            for leaf in tree_leaves(obj):
                if isinstance(leaf, torch.Tensor):
                    mode.tag(leaf)
        return obj

    from harness.storage import checkpoint

    # The runner reads its checkpoint through checkpoint.load_checkpoint → load_weights.
    monkeypatch.setattr(checkpoint, "load_weights", load_onto_device)
    with mode:
        resumed = run_cell(cell, tmp_path / "resumed", progress=False)
    assert loads == [torch.device("cpu")]  # the checkpoint was loaded for the cell's device
    assert mode.count > 10 and mode.refused == []
    assert resumed["status"] == "done", resumed.get("error")
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    assert resumed["metrics"]["clean"] == whole["metrics"]["clean"]  # bit-identical resume
