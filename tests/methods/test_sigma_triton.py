"""The fused Triton σBatchNorm kernels (methods/_triton) against the PyTorch reference path.

The kernels run here in Triton's CPU interpreter (``TRITON_INTERPRET=1``, which tests/conftest.py
sets on a machine without CUDA before Triton is imported): the same kernel code a GPU compiles,
executed program by program on CPU tensors. The reference is the layer's PyTorch path, which is
the specification.

Tolerances, and why:
- float32: the kernels sum in another order (tiles of rows, then Chan's combination of
  partial results) than ``var_mean``/``sum``; float32 rounding of n ≤ 10³ terms gives relative
  errors ~1e-6, so outputs and gradients agree to rtol 1e-5 with an absolute floor of 1e-5 × the
  tensor's largest magnitude (terms that cancel).
- bfloat16: both paths are compared with the exact function, the reference run in float64 on the
  same bf16-representable inputs. The kernels compute in float32 and round once to bf16, so each
  output is within one bf16 ulp (2^-8 relative; atol 2^-8 × max for values near zero after
  cancellation). Parameter gradients are float32 sums of bf16 products: rtol 1e-4.
"""

from __future__ import annotations

import copy

import pytest
import torch

from methods._sigma.norm import SigmaBatchNorm1d, SigmaBatchNorm2d
from methods._triton import interpreted, kernels, triton_available, use_kernels

pytestmark = pytest.mark.skipif(
    not triton_available() or not (interpreted() or torch.cuda.is_available()),
    reason="Triton is not installed, or neither CUDA nor TRITON_INTERPRET=1 can run its kernels",
)

DEVICE = "cuda" if torch.cuda.is_available() and not interpreted() else "cpu"
BF16_ULP = 2.0**-8


def make_layer(cls, c: int, m: int, variant: str, momentum=0.1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    layer = cls(c, m, variant=variant, momentum=momentum, gamma_init_mean=0.5,
                gamma_init_std=1.0, generator=g)  # fmt: skip
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * 0.5 + 1)
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g))
        layer.running_var.uniform_(0.5, 2.0, generator=g)
        layer.running_mean.normal_(generator=g)
    layer.member_grad_scale = float(m)  # as the ensemble sets it: the kernels must scale too
    return layer.to(DEVICE)


def close(got: torch.Tensor, want: torch.Tensor, rtol: float, floor: float) -> None:
    atol = floor * float(want.detach().abs().max()) + 1e-12
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


def run(layer, x, grad, mode: str):
    """One training forward and backward through ``mode``; y and every gradient."""
    x = x.clone().requires_grad_()
    with kernels(mode):
        y = layer(x)
        y.backward(grad)
    grads = [x.grad] + [p.grad for p in (layer.weight, layer.bias, layer.gamma) if p is not None]
    return y, grads


CASES = [  # (M, B per member, C, H, W): odd channels, H·W not a power of two, one image
    (1, 3, 5, 3, 5),
    (2, 2, 3, 5, 3),
    (4, 1, 7, 3, 3),
    (16, 2, 3, 1, 3),
    (4, 3, 70, 2, 3),  # more channels than one channel block
]


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("variant", ["sigma", "film"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}xB{}xC{}x{}x{}".format(*c))
def test_triton_float32_training_matches_reference(case, variant, fmt):
    m, b, c, h, w = case
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m * b, c, h, w, generator=gen) * 3 + 5  # a mean larger than the spread
    grad = torch.randn(m * b, c, h, w, generator=gen)
    memory = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
    x, grad = x.to(DEVICE, memory_format=memory), grad.to(DEVICE, memory_format=memory)
    ref, tri = (
        make_layer(SigmaBatchNorm2d, c, m, variant),
        make_layer(SigmaBatchNorm2d, c, m, variant),
    )
    y_ref, g_ref = run(ref, x, grad, "reference")
    y_tri, g_tri = run(tri, x, grad, "triton")
    assert y_tri.dtype == x.dtype and y_tri.stride() == x.stride()
    close(y_tri, y_ref, 1e-5, 1e-5)
    for got, want in zip(g_tri, g_ref, strict=True):
        close(got, want, 1e-5, 1e-5)
    close(tri.running_mean, ref.running_mean, 1e-6, 1e-6)
    close(tri.running_var, ref.running_var, 1e-5, 1e-6)
    assert torch.equal(tri.num_batches_tracked, ref.num_batches_tracked)
    assert tri.num_batches_tracked.tolist() == [1] * m
    # evaluation: running statistics folded, one launch
    ref.eval(), tri.eval()
    with torch.no_grad():
        with kernels("reference"):
            e_ref = ref(x)
        with kernels("triton"):
            e_tri = tri(x)
    assert e_tri.stride() == x.stride()
    close(e_tri, e_ref, 1e-5, 1e-6)


def test_triton_second_backward_through_a_retained_graph_keeps_the_first_gradients():
    """The kernels' backward writes the parameter gradients into a buffer the forward made; a
    second backward through the same (retained) graph must not overwrite the gradients the
    first one handed out."""
    m, b, c = 2, 3, 5
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(m * b, c, 3, 3, generator=gen).to(DEVICE)
    g1, g2 = (torch.randn(m * b, c, 3, 3, generator=gen).to(DEVICE) for _ in range(2))
    want = []
    for mode in ("reference", "triton"):
        layer = make_layer(SigmaBatchNorm2d, c, m, "sigma")
        params = [layer.weight, layer.bias, layer.gamma]
        with kernels(mode):
            y = layer(x)
            first = torch.autograd.grad(y, params, g1, retain_graph=True)
            second = torch.autograd.grad(y, params, g2)
        want.append((first, second))
    (r1, r2), (t1, t2) = want
    for got, ref in zip(t1 + t2, r1 + r2, strict=True):
        close(got, ref, 1e-5, 1e-5)
    assert not torch.allclose(t1[0], t2[0])  # two different gradients, both kept


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("offset", [0.0, 20.0])  # 20: a mean 40× the spread, no cancellation
def test_triton_bf16_within_one_ulp_of_the_exact_function(offset, fmt):
    m, b, c, h, w = 4, 2, 5, 3, 5
    gen = torch.Generator().manual_seed(2)
    memory = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
    x = (torch.randn(m * b, c, h, w, generator=gen) * 0.5 + offset).to(torch.bfloat16)
    grad = torch.randn(m * b, c, h, w, generator=gen).to(torch.bfloat16)
    x, grad = x.to(DEVICE, memory_format=memory), grad.to(DEVICE, memory_format=memory)
    exact = make_layer(SigmaBatchNorm2d, c, m, "sigma").double()
    tri = make_layer(SigmaBatchNorm2d, c, m, "sigma")
    y_ex, g_ex = run(exact, x.double(), grad.double(), "reference")
    y_tri, g_tri = run(tri, x, grad, "triton")
    assert y_tri.dtype == torch.bfloat16 and g_tri[0].dtype == torch.bfloat16
    close(y_tri, y_ex, BF16_ULP, BF16_ULP)
    close(g_tri[0], g_ex[0], BF16_ULP, BF16_ULP)
    for got, want in zip(g_tri[1:], g_ex[1:], strict=True):  # float32 parameter gradients
        assert got.dtype == torch.float32
        close(got, want, 1e-4, 1e-4)
    close(tri.running_mean, exact.running_mean, 1e-6, 1e-6)
    close(tri.running_var, exact.running_var, 1e-5, 1e-6)


def test_triton_cumulative_average_and_no_tracking_match_reference():
    """momentum=None (1/batches, counted before the update) and track_running_stats=False."""
    m, b, c = 2, 4, 3
    gen = torch.Generator().manual_seed(3)
    ref = make_layer(SigmaBatchNorm1d, c, m, "sigma", momentum=None)
    tri = copy.deepcopy(ref)
    for _ in range(3):
        x = (torch.randn(m * b, c, 6, generator=gen) + 2).to(DEVICE)
        grad = torch.randn(m * b, c, 6, generator=gen).to(DEVICE)
        y_ref, _ = run(ref, x, grad, "reference")
        y_tri, _ = run(tri, x, grad, "triton")
        close(y_tri, y_ref, 1e-5, 1e-5)
    assert tri.num_batches_tracked.tolist() == [3, 3]
    close(tri.running_mean, ref.running_mean, 1e-6, 1e-6)
    close(tri.running_var, ref.running_var, 1e-5, 1e-6)
    free = SigmaBatchNorm1d(c, m, track_running_stats=False).to(DEVICE).eval()
    x = torch.randn(m * b, c, generator=gen).to(DEVICE)  # (M·B, C): eval uses batch statistics
    with torch.no_grad():
        with kernels("reference"):
            want = free(x)
        with kernels("triton"):
            got = free(x)
    close(got, want, 1e-5, 1e-5)


def test_triton_refuses_one_value_per_member_like_the_reference():
    layer = SigmaBatchNorm1d(3, 2).to(DEVICE)
    with kernels("triton"), pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(torch.randn(2, 3, device=DEVICE))


def test_cuda_selects_the_kernels_and_the_cpu_the_reference(monkeypatch):
    """The choice, with availability monkeypatched: CUDA tensors take the kernels unless the
    mode says "reference" or Triton is missing or torch.compile traces; CPU tensors take the
    reference unless a test asks for the interpreter."""
    import methods._triton as sel

    class FakeCuda:
        is_cuda = True

    cpu = torch.zeros(1)
    monkeypatch.setattr(sel, "triton_available", lambda: True)
    assert use_kernels(FakeCuda()) and not use_kernels(cpu)
    with kernels("reference"):
        assert not use_kernels(FakeCuda())
    with kernels("triton"):
        assert use_kernels(cpu) == interpreted()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not use_kernels(FakeCuda())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(sel, "triton_available", lambda: False)
    assert not use_kernels(FakeCuda())
    with pytest.raises(ValueError, match="must be one of"), kernels("fast"):
        pass


def test_layer_dispatches_to_the_kernels_when_selected(monkeypatch):
    """The layer calls methods._triton.sigma_bn when use_kernels says so, and not otherwise."""
    import methods._sigma.batchnorm as bn
    from methods._triton import sigma_bn

    calls = []
    real = sigma_bn.MemberBatchNorm.apply
    monkeypatch.setattr(sigma_bn.MemberBatchNorm, "apply", lambda *a: calls.append(1) or real(*a))
    layer = SigmaBatchNorm2d(3, 2).to(DEVICE)
    x = torch.randn(4, 3, 2, 2, device=DEVICE)
    monkeypatch.setattr(bn, "use_kernels", lambda t: False)
    layer(x)
    assert calls == []
    monkeypatch.setattr(bn, "use_kernels", lambda t: True)
    layer(x)
    assert calls == [1]


def test_a_whole_resnet18_sigma_ens_training_step_matches_reference():
    """ResNet-18 (CIFAR style, 20 σBatchNorm layers) as σN-Ens, M = 2: one SGD step through
    each path from the same weights and batch; the loss, every parameter after the step and
    every running statistic agree.

    The backbone's ReLUs are swapped for GELU here: the two paths round differently in the
    last float32 bit, and a pre-activation within that rounding of 0 takes the other side of
    a ReLU's kink on one path, which moves that element's gradient by O(1) (measured: with
    ReLU, 1% relative difference in the stem's gradients from such flips; with GELU, 4.5e-5).
    Tolerance: each tensor's difference ≤ 1e-4 of its norm (float32 rounding through 20
    layers), the loss to 1e-5."""
    import torch.nn.functional as F

    from harness.config.suite import expand_hparams
    from harness.contract.config import Recipe
    from harness.engine.train import ensemble_loss
    from harness.registry import METHODS
    from methods._base import BuildContext

    spec = METHODS.get("sigma_ens")
    hp = spec.make_hparams(expand_hparams(spec, {"tau": 0.5, "lam": 0.01})[0])
    torch.manual_seed(0)
    ref = spec.build(BuildContext("resnet18", (3, 8, 8), 10, 2), hp).to(DEVICE)
    swapped = [m for m in ref.modules() if getattr(m, "activation_fn", None) is F.relu]
    assert len(swapped) == 9  # the stem and the 8 basic blocks
    for m in swapped:
        m.activation_fn = F.gelu
    tri = copy.deepcopy(ref)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 3, 8, 8, generator=gen).to(DEVICE)
    y = torch.randint(0, 10, (4,), generator=gen).to(DEVICE)
    recipe = Recipe(epochs=1, batch_size=4)
    losses, grads = [], []
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    for model, mode in ((ref, "reference"), (tri, "triton")):
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with kernels(mode):
            loss, _, _ = ensemble_loss(model, x, y, recipe)
            loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        losses.append(loss.detach())
    close(losses[1], losses[0], 1e-5, 1e-6)
    for name, want in grads[0].items():  # the step's substance: every gradient
        got = grads[1][name]
        assert want.norm() > 0, name  # every parameter took part in the step
        assert (got - want).norm() <= 1e-4 * want.norm(), name
    gammas = 0
    for name, want in ref.state_dict().items():  # parameters after SGD, running statistics
        got = tri.state_dict()[name]
        gammas += name.endswith("gamma")
        if name in grads[0]:  # after SGD: the update 0.1·g moved by at most 1e-4 of itself
            update = 0.1 * grads[0][name].norm()
            assert (got - want).norm() <= 1e-4 * update + 1e-6 * want.norm(), name
        elif want.is_floating_point():  # running statistics: their update, to 1e-3 of it
            # (the deepest layers' inputs already differ by ~1e-4 relative: float32 rounding
            # compounded over 20 layers; their means are over 2 values per member)
            update = (want - before[name]).norm()
            assert update > 0 and (got - want).norm() <= 1e-3 * update, name
        else:
            assert torch.equal(got, want), name
    assert gammas == 20  # every BatchNorm of ResNet-18 went through the σNorm path


def test_eval_forward_is_the_backbones_work_plus_one_launch_per_layer(monkeypatch):
    """σN-Ens's evaluation forward on the kernel path dispatches the plain backbone's operators
    (BatchNorm's ``native_batch_norm`` + ``empty`` swapped for one ``empty_like`` and one kernel
    launch per layer) plus the member repeat: no gate, affine or cast operators on the host.
    The launches are counted by replacing the kernel (interpreting it adds host copies that a
    GPU does not make); the training-time gradient scaling is skipped without gradients."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from harness.config.suite import expand_hparams
    from harness.registry import METHODS
    from methods._base import BuildContext
    from methods._sigma import norm_base
    from methods._triton import sigma_bn

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
            return func(*args, **(kwargs or {}))

    launches = []
    monkeypatch.setattr(sigma_bn, "_eval_apply", _Launches(launches))
    scaled = []
    real_apply = norm_base._GradScale.apply
    monkeypatch.setattr(
        norm_base._GradScale, "apply", lambda *a: scaled.append(1) or real_apply(*a)
    )
    counts = {}
    for name, m, b in (("single", 1, 8), ("sigma_ens", 4, 2)):
        spec = METHODS.get(name)
        hp = spec.make_hparams(expand_hparams(spec, {})[0])
        model = spec.build(BuildContext("resnet18", (3, 8, 8), 10, m), hp).to(DEVICE).eval()
        with torch.no_grad(), kernels("triton"), Count() as c:
            model(torch.randn(b, 3, 8, 8, device=DEVICE))
        counts[name] = c.ops
    sigma, single = counts["sigma_ens"], counts["single"]
    assert len(launches) == 20 and scaled == []
    assert sigma["empty_like"] == single["native_batch_norm"] == 20
    plain = single - Counter({"native_batch_norm": 20, "empty": 20})
    extra = sigma - Counter({"empty_like": 20}) - plain
    assert extra == Counter({"repeat": 1, "view": 1}), extra  # the M copies in, (M, B, K) out
    assert sum(sigma.values()) <= sum(single.values()) + 2


class _Launches:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` records the launch, computes
    nothing."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(grid)
