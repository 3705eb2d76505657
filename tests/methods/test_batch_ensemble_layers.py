"""BatchEnsemble's rank-1 layers: torch-uncertainty's function, without device reads, in the
activation's dtype (methods.batch_ensemble.sync_free)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch_uncertainty.layers import BatchConv2d, BatchLinear

from methods.batch_ensemble import sync_free

aten = torch.ops.aten


class Reads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` (every ``.item()``/``int(t)``: a device read)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket is aten._local_scalar_dense
        return func(*args, **(kwargs or {}))


def pair(layer: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(torch-uncertainty's layer, the same weights with our forward)."""
    ours = copy.deepcopy(layer)
    wrapper = torch.nn.Sequential(ours)
    sync_free(wrapper)
    assert type(ours) is not type(layer) and isinstance(ours, type(layer))
    return layer, ours


LAYERS = {
    "linear": (lambda: BatchLinear(6, 5, num_estimators=3), (6,)),
    "conv": (lambda: BatchConv2d(4, 5, 3, num_estimators=3, padding=1, bias=True), (4, 6, 6)),
}


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("rows", [9, 7])  # divisible by M=3, and 2 extra rows
def test_same_function_and_gradients_as_torch_uncertainty_in_fp32(kind, rows):
    make, shape = LAYERS[kind]
    torch.manual_seed(0)
    theirs, ours = pair(make())
    x = torch.randn(rows, *shape)
    a, b = theirs(x), ours(x)
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    a.square().sum().backward()
    b.square().sum().backward()
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert ours.state_dict().keys() == theirs.state_dict().keys()


@pytest.mark.parametrize("kind", LAYERS)
def test_no_device_reads(kind):
    make, shape = LAYERS[kind]
    theirs, ours = pair(make())
    x = torch.randn(6, *shape)
    with Reads() as theirs_reads:
        theirs(x)
    with Reads() as ours_reads:
        ours(x).sum().backward()
    assert ours_reads.n == 0
    if kind == "linear":  # torch.tensor(B // M) handed to einops, read back per repeat
        assert theirs_reads.n == 6  # 2 reads per einops repeat, 3 repeats


@pytest.mark.parametrize("kind", LAYERS)
def test_bf16_activations_stay_bf16_under_autocast(kind):
    make, shape = LAYERS[kind]
    theirs, ours = pair(make())
    x = torch.randn(6, *shape)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert theirs(x).dtype == torch.float32  # the fp32 fast weights promote it
        out = ours(x)
        assert out.dtype == torch.bfloat16
        out.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in ours.parameters())  # fp32 master weights
    torch.testing.assert_close(out.float(), theirs(x).float(), rtol=0.05, atol=0.05)
