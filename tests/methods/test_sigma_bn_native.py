"""σBatchNorm's CPU path (PyTorch's batch-norm kernel per member) against the reference path.

The reference (``methods._triton.kernels("reference")``: ``var_mean`` over the strided
(M, B, C, *S) view and a closed-form backward) is the specification; the CPU path must compute
the same function. Stated tolerance, float32: outputs and input gradients within
``torch.testing.assert_close``'s float32 defaults (rtol 1.3e-6, atol 1e-5), parameter gradients
(sums over B·prod(S) values) within rtol 1e-5 / atol 1e-4, running statistics within 1e-6;
float64: within 1e-12. Measured differences are 1e-7 to 8e-6 (float32) and 1e-14 (float64).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from methods._sigma.norm import SigmaBatchNorm1d, SigmaBatchNorm2d
from methods._triton import kernels
from tests.sigma_helpers import _gen, _randomize_affine, _single_thread  # noqa: F401


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func.overloadpacket).removeprefix("aten."))
        return func(*args, **(kwargs or {}))


def _run(layer, x, up, mode: str):
    """Three training steps (forward + backward) then one eval forward under kernel ``mode``;
    returns outputs, input gradients, parameter gradients, the buffers and the eval output."""
    outs, grads = [], []
    with kernels(mode):
        for step in range(3):
            xi = (x * (1 + step)).requires_grad_(True)
            y = layer(xi)
            y.backward(up)
            outs.append(y.detach())
            grads.append(xi.grad)
        layer.eval()
        y_eval = layer(x)
        layer.train()
    params = {n: p.grad.clone() for n, p in layer.named_parameters()}
    return outs, grads, params, {n: b.clone() for n, b in layer.named_buffers()}, y_eval


@pytest.mark.parametrize("members", [1, 2, 4, 16])
@pytest.mark.parametrize("variant", ["sigma", "film"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_cpu_path_equals_reference(members, variant, dtype, momentum):
    c, b = 6, 5
    layer = SigmaBatchNorm2d(c, members, momentum=momentum, variant=variant, generator=_gen())
    _randomize_affine(layer)
    layer = layer.to(dtype)
    if dtype == torch.float64:  # running statistics follow the layer's dtype
        layer.running_mean, layer.running_var = (
            layer.running_mean.double(),
            layer.running_var.double(),
        )
    x = (torch.randn(members * b, c, 4, 3, generator=_gen(2)) * 3 + 1).to(dtype)
    up = torch.randn(x.shape, generator=_gen(3)).to(dtype)
    got = _run(copy.deepcopy(layer), x, up, "auto")
    want = _run(copy.deepcopy(layer), x, up, "reference")
    tight = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    loose = (
        {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-4}
    )
    for a, w in zip(got[0] + got[1], want[0] + want[1], strict=True):  # outputs, input grads
        torch.testing.assert_close(a, w, **tight)
    for name in got[2]:  # weight, bias, gamma
        torch.testing.assert_close(got[2][name], want[2][name], **loose, msg=name)
    for name in got[3]:  # running_mean, running_var, num_batches_tracked
        torch.testing.assert_close(got[3][name], want[3][name], rtol=1e-6, atol=1e-6, msg=name)
    torch.testing.assert_close(got[4], want[4], **tight)
    assert got[3]["num_batches_tracked"].tolist() == [3] * members


@pytest.mark.parametrize("shape", [(3, 4), (3, 4, 7)])
def test_cpu_path_batchnorm1d_and_no_running_stats(shape):
    for track in (True, False):
        layer = SigmaBatchNorm1d(shape[1], 3, track_running_stats=track, generator=_gen())
        _randomize_affine(layer)
        x = torch.randn(3 * shape[0], *shape[1:], generator=_gen(4)) * 2 - 1
        up = torch.randn(x.shape, generator=_gen(5))
        got, want = (_run(copy.deepcopy(layer), x, up, mode) for mode in ("auto", "reference"))
        for a, w in zip(got[0] + got[1] + [got[4]], want[0] + want[1] + [want[4]], strict=True):
            torch.testing.assert_close(a, w)


def test_cpu_path_runs_pytorchs_batch_norm_not_var_mean():
    """The point of the path: PyTorch's batch-norm kernel per member, no strided var_mean;
    the reference mode still runs the specification."""
    layer = SigmaBatchNorm2d(4, 4, generator=_gen())
    x = torch.randn(16, 4, 3, 3, generator=_gen(1), requires_grad=True)
    for mode, present, absent in (
        ("auto", "native_batch_norm", "var_mean"),
        ("reference", "var_mean", "native_batch_norm"),
    ):
        with kernels(mode), _Ops() as ops:
            layer(x).sum().backward()
        assert present in ops.names and absent not in ops.names, (mode, sorted(ops.names))


def test_cpu_path_keeps_channels_last_and_isolates_members():
    m, b, c = 3, 4, 5
    layer = SigmaBatchNorm2d(c, m, generator=_gen())
    x = torch.randn(m * b, c, 4, 4, generator=_gen(6)).contiguous(memory_format=torch.channels_last)
    y = copy.deepcopy(layer)(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    x2 = x.clone()
    x2[b : 2 * b] = x2[b : 2 * b] ** 2  # member 1's rows only (not affine: BN would undo it)
    y2 = copy.deepcopy(layer)(x2)
    for rows in (slice(0, b), slice(2 * b, 3 * b)):  # members 0 and 2 do not see the change
        torch.testing.assert_close(y2[rows], y[rows], rtol=0, atol=0)
    assert not torch.allclose(y2[b : 2 * b], y[b : 2 * b])


def test_cpu_path_rejects_one_value_per_member_channel():
    layer = SigmaBatchNorm1d(3, 2)
    with pytest.raises(ValueError, match="more than 1 value per channel per member"):
        layer(torch.randn(2, 3))
