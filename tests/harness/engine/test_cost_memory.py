"""Peak memory accounting (harness.engine.cost.throughput) on a model whose true peak is known.

The "device" is ``meta`` (shapes and sizes, no data), its memory read by :class:`MetaLedger`, a
``TorchDispatchMode`` that counts the bytes of every meta storage from its creation to its
release (a weak reference to the storage: autograd's saved tensors keep it alive, as on a
GPU). The model is one bias-free ``Linear(1024, 1024)`` (4 MiB of weights) on a batch of 4, so
activations are a few KiB: training needs weights + gradients + momentum = 12 MiB, evaluation
the weights, 4 MiB. A restore copy of the state dict on the device (+4 MiB in both) or the
momentum kept through evaluation (+4 MiB) would show.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from harness.contract.config import Recipe
from harness.engine.cost import host_copy, throughput
from methods._base import EnsembleModel

META = torch.device("meta")
MIB = 2**20


class MetaLedger(TorchDispatchMode):
    """A :class:`harness.engine.cost.MemoryReader` of the meta device: live bytes of the meta
    storages
    of ``existing`` tensors and of those created while the mode is active."""

    def __init__(self, existing: list[Tensor] = ()) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.sizes: dict[int, int] = {}
        for t in existing:
            self.track(t)

    def track(self, t: Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata  # the C++ storage: views, detach and in-place results share it
        if key not in self.sizes and storage.nbytes():
            self.sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor) and t.device == META:
                self.track(t)
        return out

    def _release(self, key: int) -> None:
        self.live -= self.sizes.pop(key)

    def reset(self) -> None:
        self.peak = self.live

    def peak_bytes(self) -> int:
        return self.peak


class OneLinear(EnsembleModel):
    num_members = 1

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(1024, 1024, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).unsqueeze(0)  # (1, B, K)


def test_ledger_counts_saved_activations_and_releases():
    x = torch.ones(256, 1024, device=META, requires_grad=True)  # 1 MiB, before the ledger
    with MetaLedger([x]) as ledger:
        y = x.sin()  # 1 MiB, saved by cos for its backward
        z = y.cos()
        del y
        assert ledger.live == 3 * MIB  # x, and y saved for cos's backward
        z.sum().backward()
        del z
        assert ledger.peak_bytes() >= 4 * MIB and ledger.live == 2 * MIB  # x and x.grad


@pytest.mark.filterwarnings("ignore:for net.weight. copying from a non-meta parameter")
@pytest.mark.parametrize("bug", [None, "device_copy", "keep_momentum"])
def test_peaks_are_what_the_method_needs(monkeypatch, bug):
    from harness.engine import cost

    if bug == "device_copy":  # what throughput did before: the restore copy on the device
        monkeypatch.setattr(
            cost, "host_copy", lambda m: {k: v.clone() for k, v in m.state_dict().items()}
        )
    else:  # meta tensors hold no data to copy: the host copy's allocation stands in for it
        monkeypatch.setattr(cost, "host_copy", meta_host_copy)
    if bug == "keep_momentum":  # ... and the optimizer's momentum kept through evaluation
        monkeypatch.setattr(torch.optim, "SGD", _KeepingSGD)
    torch.manual_seed(0)
    model = OneLinear().to(META)
    x, y = torch.ones(4, 1024, device=META), torch.zeros(4, dtype=torch.long, device=META)
    ledger = MetaLedger([*model.parameters(), x, y])
    with ledger:
        out = throughput(model, x, y, Recipe(), META, steps=1, warmup=1, memory=ledger)
    small = 0.1  # MiB: the batch's activations and the loss's temporaries
    train, evaluation = out["peak_train_mem_mib"], out["peak_eval_mem_mib"]
    if bug is None:
        assert 12 <= train < 12 + small  # weights, gradients, momentum
        assert 4 <= evaluation < 4 + small  # weights only
    elif bug == "device_copy":
        assert 16 <= train < 16 + small and 8 <= evaluation < 8 + small
    else:
        assert 12 <= train < 12 + small and 8 <= evaluation < 8 + small


class _KeptState(defaultdict):
    def clear(self) -> None:  # momentum kept through evaluation
        pass


class _KeepingSGD(torch.optim.SGD):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.state = _KeptState(dict, self.state)


def meta_host_copy(model: nn.Module) -> dict[str, Tensor]:
    """:func:`harness.engine.cost.host_copy` for a meta model: host tensors of the same sizes."""
    return {k: torch.empty_like(v, device="cpu") for k, v in model.state_dict().items()}


def test_host_copy_is_on_the_host_and_equal():
    model = OneLinear()
    copy = host_copy(model)
    assert {v.device for v in copy.values()} == {torch.device("cpu")}
    assert torch.equal(copy["net.weight"], model.net.weight)
    assert copy["net.weight"].data_ptr() != model.net.weight.data_ptr()
