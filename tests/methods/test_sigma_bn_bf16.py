"""σN-Ens's member BatchNorm in bf16: float32-accurate statistics and gradients, without
activation-sized float32 temporaries (methods._sigma.batchnorm._MemberBatchNormTrain).

The reference is the same function in float32 on the same (bf16-representable) inputs. The
temporaries are counted with a ``TorchDispatchMode`` recording every op output that has the
activation's number of elements and dtype float32.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from methods._sigma.batchnorm import _MemberBatchNormTrain

M, B, C, H, W = 2, 8, 3, 5, 5
DIMS = (1, 3, 4)


class Float32Activations(TorchDispatchMode):
    """Counts op outputs of ``numel`` elements in float32 (activation-sized temporaries)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() == self.numel:
                self.ops.append(str(func))
        return out


def inputs(offset: float, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(M, B, C, H, W, generator=g) * 0.5 + offset).to(torch.bfloat16)
    grad_y = torch.randn(M, B, C, H, W, generator=g).to(torch.bfloat16)
    scale = torch.rand(M, 1, C, 1, 1, generator=g) + 0.5
    shift = torch.randn(M, 1, C, 1, 1, generator=g)
    x = x.to(dtype).requires_grad_()
    return x, grad_y.to(dtype), scale.requires_grad_(), shift.requires_grad_()


def run(x, grad_y, scale, shift):
    y, mean, var, rstd = _MemberBatchNormTrain.apply(x, scale, shift, 1e-5, DIMS)
    assert torch.equal(rstd, torch.rsqrt(var + 1e-5)) and not rstd.requires_grad
    y.backward(grad_y)
    return y, mean, var, x.grad, scale.grad, shift.grad


@pytest.mark.parametrize("offset", [0.0, 20.0])  # a mean 40× the spread: no cancellation loss
def test_bf16_matches_float32_within_bf16_tolerance(offset):
    got = run(*inputs(offset, torch.bfloat16))
    ref = run(*inputs(offset, torch.float32))
    assert got[0].dtype == torch.bfloat16 and got[3].dtype == torch.bfloat16
    y, mean, var, gx, gs, gb = got
    ry, rmean, rvar, rgx, rgs, rgb = ref
    torch.testing.assert_close(mean, rmean, rtol=1e-6, atol=1e-6)  # float32 statistics
    torch.testing.assert_close(var, rvar, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(y.float(), ry, rtol=2e-2, atol=2e-2)
    scale_gx = rgx.abs().max()
    torch.testing.assert_close(gx.float(), rgx, rtol=2e-2, atol=2e-2 * scale_gx)
    torch.testing.assert_close(gs, rgs, rtol=1e-2, atol=1e-2 * rgs.abs().max())
    torch.testing.assert_close(gb, rgb, rtol=1e-5, atol=1e-4)


def count_float32_activations(dtype: torch.dtype) -> tuple[list[str], list[str]]:
    x, grad_y, scale, shift = inputs(1.0, dtype)
    with Float32Activations(x.numel()) as forward:
        y, *_ = _MemberBatchNormTrain.apply(x, scale, shift, 1e-5, DIMS)
    with Float32Activations(x.numel()) as backward:
        y.backward(grad_y)
    return forward.ops, backward.ops


def test_float32_activation_temporaries_in_bf16():
    forward, backward = count_float32_activations(torch.bfloat16)
    assert forward == ["aten._to_copy.default"]  # the transient upcast for exact statistics
    assert backward == []
    # the counter sees them where they exist: bf16 inputs upcast, as the float32 path does
    upcast = [t.float() for t in inputs(1.0, torch.bfloat16)[:2]]
    with Float32Activations(upcast[0].numel()) as float_path:
        torch.addcmul(upcast[0], upcast[1], upcast[0])
    assert float_path.ops == ["aten.addcmul.default"]
