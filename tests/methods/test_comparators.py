"""The comparators as their reference code trains them: FiLM-Ensemble's init (official CBN.py),
BatchEnsemble's fast-weight learning rate (uncertainty-baselines), per-member gradient clipping
of the deep ensemble, Masksembles' masks as buffers, MC Dropout's placement and Packed-Ensembles'
head, text qkv and effective γ (torch-uncertainty)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.contract import Recipe
from harness.engine.train import make_optimizer
from harness.registry import METHODS
from methods._base import BuildContext, count_parameters


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _build(method: str, seed: int = 0, width: int = 8, members: int = 4, **hp):
    spec = METHODS.get(method)
    ctx = BuildContext("digits_cnn", (1, 8, 8), 8, members, {"width": width}, None, seed=seed)
    return spec.build(ctx, spec.make_hparams(hp))


# --- FiLM-Ensemble ------------------------------------------------------------------------------


@pytest.mark.parametrize("gain", [1.0, 2.0])
def test_film_init_is_the_official_zero_mean_xavier_uniform(gain):
    """CBN2D: nn.init.xavier_uniform_(gamma (M, C), gain=cbn_gain), the same for beta; nothing
    added to the scale. Bound a = gain·√(6/(M+C)); mean 0, std a/√3."""
    m, width = 4, 32
    model = _build("film_ensemble", width=width, members=m, cbn_gain=gain)
    layers = [layer for _, layer in model.norm_layers()]
    assert len(layers) == 3
    for layer in layers:
        for p in (layer.weight, layer.bias):
            c = p.shape[1]
            bound = gain * math.sqrt(6.0 / (m + c))
            assert p.shape == (m, c)
            assert p.abs().max().item() <= bound + 1e-7
            assert p.abs().max().item() > 0.9 * bound  # uniform up to the bound, not tighter
    # pooled over the 6 tensors (~1,300 draws): mean 0 (not 1), std a/√3
    w = torch.cat([layer.weight.detach().flatten() for layer in layers[1:]])  # C = 64 layers
    bound = gain * math.sqrt(6.0 / (m + 64))
    assert abs(w.mean().item()) < 0.1 * bound
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


def test_film_perturb_keeps_the_converted_affine_at_zero_spread():
    """init: perturb with init_std 0 is the identity on the converted affine (weight 1, bias 0)."""
    model = _build("film_ensemble", init="perturb", init_std=0.0)
    for _, layer in model.norm_layers():
        assert torch.equal(layer.weight.detach(), torch.ones_like(layer.weight))
        assert torch.equal(layer.bias.detach(), torch.zeros_like(layer.bias))


def test_film_unknown_init_is_refused(tmp_path):
    from harness.config.includes import SuiteError
    from harness.config.parse import load_suite

    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\ngrid: {datasets: [digits], backbones: [digits_cnn], methods: "
        "[{name: film_ensemble, hparams: {init: normal}}]}\n"
    )
    with pytest.raises(SuiteError, match="init"):
        load_suite(path)


# --- BatchEnsemble -----------------------------------------------------------------------------


def _one_sgd_step(model, lr: float = 0.1) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (parameter change, gradient)} of one plain SGD step (no momentum, no decay)."""
    recipe = Recipe(optimizer="sgd", lr=lr, momentum=0.0, weight_decay=0.0, nesterov=False)
    opt = make_optimizer(model, recipe)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(0)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 8, (8,))
    model.train()
    out = model.training_outputs(x, y)
    torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), out.targets.flatten()).backward()
    opt.step()
    return {n: (p.detach() - before[n], p.grad.detach()) for n, p in model.named_parameters()}


@pytest.mark.parametrize("multiplier", [0.5, 1.0])
def test_batch_ensemble_fast_weights_step_at_the_multiplier(multiplier):
    """UB's fast_weight_lr_multiplier (default 0.5): r, s and the per-member biases move by
    multiplier·lr·grad, every slow weight by lr·grad; 1.0 is torch-uncertainty's."""
    lr = 0.1
    model = _build("batch_ensemble", fast_weight_lr_multiplier=multiplier)
    steps = _one_sgd_step(model, lr)
    kinds = {"fast": 0, "bias": 0, "slow": 0}
    for name, (delta, grad) in steps.items():
        leaf = name.rsplit(".", 1)[-1]
        kind = "fast" if leaf in ("r_group", "s_group") else "slow"
        if name == "net.core_model.head.bias":  # BatchLinear's (M, K) per-member bias
            kind = "bias"
        factor = multiplier if kind in ("fast", "bias") else 1.0
        assert grad.abs().sum() > 0, name
        # the step, to float32 rounding of p + Δp (Δp ≪ p for r, s ≈ 1)
        torch.testing.assert_close(delta, -lr * factor * grad, rtol=1e-4, atol=1e-6)
        ratio = (delta.norm() / (lr * grad.norm())).item()
        assert ratio == pytest.approx(factor, rel=1e-3), name
        kinds[kind] += 1
    assert kinds["fast"] >= 4 and kinds["bias"] == 1 and kinds["slow"] >= 4


def test_batch_ensemble_default_is_ubs_recipe():
    model = _build("batch_ensemble")
    groups = model.param_groups(5e-4)
    assert [g.get("lr_scale", 1.0) for g in groups] == [1.0, 0.5, 0.5]
    assert [g["weight_decay"] for g in groups] == [5e-4, 0.0, 5e-4]  # no decay on r, s only
    opt = make_optimizer(model, Recipe(lr=0.2))
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2, 0.1, 0.1])
    every = sorted(id(p) for g in groups for p in g["params"])
    assert every == sorted(id(p) for p in model.parameters())  # a partition


# --- deep ensemble: gradient clipping per member -----------------------------------------------


def test_deep_ensemble_clips_each_member_as_if_trained_alone():
    """grad_clip on a deep ensemble = each member trained alone with grad_clip (the members'
    losses are summed, so member m's gradient is its own loss's; the clip must not mix them)."""
    import copy

    from harness.engine.train import make_scheduler, train_epoch

    torch.manual_seed(0)
    ens = _build("deep_ensemble", members=3, independent_data=False)
    alone = [copy.deepcopy(m) for m in ens.ensemble.core_models]
    recipe = Recipe(optimizer="sgd", lr=0.5, momentum=0.9, weight_decay=0.0, grad_clip=0.05)
    batches = [(torch.randn(16, 1, 8, 8), torch.randint(0, 8, (16,))) for _ in range(3)]

    def train(model):
        opt = make_optimizer(model, recipe)
        train_epoch(
            model, batches, opt, make_scheduler(opt, recipe, 3), recipe, torch.device("cpu")
        )

    train(ens)
    single_spec = METHODS.get("single")
    ctx = BuildContext("digits_cnn", (1, 8, 8), 8, 1, {"width": 8}, None, seed=0)
    for member, start in zip(ens.ensemble.core_models, alone, strict=True):
        solo = single_spec.build(ctx, single_spec.make_hparams({}))
        solo.net.load_state_dict(start.state_dict())
        train(solo)
        for (name, p), q in zip(member.named_parameters(), solo.net.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
        moved = sum((p - s).abs().sum() for p, s in zip(member.parameters(), start.parameters()))
        assert moved > 0


# --- Masksembles: masks are buffers ------------------------------------------------------------


def test_masksembles_masks_are_buffers_not_parameters():
    from torch_uncertainty.layers.masksembles import Mask1d, Mask2d

    model = _build("masksembles", width=16)
    assert not [n for n, _ in model.named_parameters() if n.endswith("masks")]
    masks = {n: b for n, b in model.named_buffers() if n.endswith("masks")}
    assert len(masks) == 3 and all(b.dtype == torch.float32 for b in masks.values())
    assert not [m for m in model.modules() if isinstance(m, Mask1d | Mask2d)]
    # params_total: every parameter is trained (the masks' 4·(16 + 32 + 32) values are not)
    assert count_parameters(model) == count_parameters(model, trainable_only=True)


def test_masksembles_forward_equals_the_library_without_float64():
    """Same outputs as torch-uncertainty's Mask2d with the same masks; no float64 op."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch_uncertainty.layers.masksembles import Mask2d

    from methods.masksembles import FixedMasks

    torch.manual_seed(0)
    lib = Mask2d(12, num_masks=3, scale=2.0, device=None)
    ours = FixedMasks(lib.masks.detach().clone())
    x = torch.randn(9, 12, 2, 2)
    torch.testing.assert_close(ours(x), lib(x), rtol=0, atol=0)

    class Dtypes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[torch.dtype] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else [out]:
                if isinstance(t, torch.Tensor):
                    self.seen.add(t.dtype)
            return out

    model = _build("masksembles", width=16).eval()
    with Dtypes() as mode:
        model(torch.randn(4, 1, 8, 8))
    floating = {d for d in mode.seen if d.is_floating_point}
    assert floating == {torch.float32}
    with Dtypes() as mode:
        ours(x.bfloat16())
    assert {d for d in mode.seen if d.is_floating_point} == {torch.bfloat16}


# --- MC Dropout: where the dropout is -----------------------------------------------------------


def _weight_layer_input_zeros(core: torch.nn.Module, x: torch.Tensor, dropout_on: bool) -> list:
    """Fraction of exact zeros in the input each Conv2d/Linear of ``core`` receives (BatchNorm
    in eval; every dropout module on or off)."""
    from torch.nn.modules.dropout import _DropoutNd

    core.eval()
    for m in core.modules():
        if isinstance(m, _DropoutNd):
            m.train(dropout_on)
    seen: list[float] = []
    layers = [m for m in core.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]

    def record(module, args):  # registered after the method's pre-hook: sees its output
        seen.append((args[0] == 0).float().mean().item())

    handles = [layer.register_forward_pre_hook(record) for layer in layers]
    torch.manual_seed(0)
    core(x)
    for h in handles:
        h.remove()
    return seen


def test_mc_dropout_drops_the_input_of_every_weight_layer_but_the_stem():
    """Gal & Ghahramani: dropout before every weight layer. On digits_cnn: conv2, conv3 and the
    head see rate·(non-zero fraction) more zeros with dropout on; the stem sees the image."""
    rate = 0.5
    model = _build("mc_dropout", width=16, members=4, dropout_rate=rate)
    core = model.net.core_model
    x = torch.randn(64, 1, 8, 8)
    off = _weight_layer_input_zeros(core, x, dropout_on=False)
    on = _weight_layer_input_zeros(core, x, dropout_on=True)
    assert len(on) == 4 and on[0] == off[0] == 0.0  # the stem: the image, never dropped
    for z_off, z_on in zip(off[1:], on[1:], strict=True):
        assert z_on - z_off == pytest.approx(rate * (1 - z_off), abs=0.05)
    # the old placement (the backbone's: before the head only) stays available
    old = _build("mc_dropout", width=16, members=4, dropout_rate=rate, placement="backbone")
    old_off = _weight_layer_input_zeros(old.net.core_model, x, dropout_on=False)
    old_on = _weight_layer_input_zeros(old.net.core_model, x, dropout_on=True)
    assert old_on[:3] == old_off[:3] and old_on[3] > old_off[3]


def test_mc_dropout_residual_is_ubs_elementwise_dropout_on_the_wrn_branch():
    """placement residual (UB's WRN-28-10 recipe): element-wise Dropout(rate) after the first
    conv of each of the 12 blocks, none before the head, no channel-wise Dropout2d left."""
    from torch.nn.modules.dropout import _DropoutNd

    spec = METHODS.get("mc_dropout")
    ctx = BuildContext("wrn28_10", (3, 32, 32), 10, 4, {"dropout_rate": 0.0})
    with torch.device("meta"):
        model = spec.build(ctx, spec.make_hparams({"dropout_rate": 0.1, "placement": "residual"}))
    live = {n: m for n, m in model.named_modules() if isinstance(m, _DropoutNd) and m.p > 0}
    assert len(live) == 12 and all(type(m) is torch.nn.Dropout for m in live.values())
    assert all(n.endswith(".dropout") and m.p == 0.1 for n, m in live.items())
    assert model.net.core_model.final_dropout.p == 0.0
    digits = BuildContext("digits_cnn", (1, 8, 8), 8, 4, {"width": 16})
    with pytest.raises(ValueError, match=r"placement 'residual'.*needs torch-uncertainty's"):
        spec.build(digits, spec.make_hparams({"placement": "residual"}))


# --- Packed-Ensembles ---------------------------------------------------------------------------


def test_packed_digits_head_has_one_group_per_member():
    """torch-uncertainty's packed heads are PackedLinear(..., last=True) at gamma=1."""
    model = _build("packed_ensemble", width=16, members=4, alpha=2, gamma=2)
    head = model.net.head
    assert head.groups == 4  # M groups, not M·γ
    gammas = model.diagnostics()["gamma_effective"]
    assert gammas["head"] == 1 and gammas["features.0"] is None  # first: one group
    assert gammas["features.3"] == 2 and gammas["features.7"] == 2


def test_packed_text_qkv_of_a_member_sees_all_its_features_and_no_others():
    """The fused qkv projection has M·γ groups; q, k and v of member m each depend on every
    feature of member m (each group its own q, k, v, as PackedMultiheadAttention) and on none
    of another member's."""
    spec = METHODS.get("packed_ensemble")
    m, heads = 2, 2
    kw = {"dim": 16, "depth": 1, "heads": heads, "vocab_size": 50}
    ctx = BuildContext("text_transformer", (6,), 3, m, kw, seed=0)
    torch.manual_seed(0)
    block = spec.build(ctx, spec.make_hparams({"alpha": 2, "gamma": 2})).net.blocks[0]
    # the projection's own dependency: the member LayerNorm before it mixes a member's features
    block.norm1 = torch.nn.Identity()
    width = 32  # α·dim, member m owns features [16m, 16m + 16)
    x = torch.randn(1, 3, width)
    jac = torch.autograd.functional.jacobian(lambda t: block.qkv_heads(t), x)
    # jac: (3, 1, M·H, L, d, 1, L, W) → |∂ out / ∂ feature| summed over everything else
    dep = jac.abs().sum(dim=(1, 3, 4, 5, 6))  # (3, M·H, W)
    for which in range(3):  # q, k, v
        for member in range(m):
            rows = dep[which, member * heads : (member + 1) * heads].sum(0)  # (W,)
            own = rows[member * 16 : (member + 1) * 16]
            others = torch.cat([rows[: member * 16], rows[(member + 1) * 16 :]])
            assert (own > 0).all(), (which, member)
            assert (others == 0).all(), (which, member)


def test_packed_records_the_gamma_each_layer_really_has():
    """torch-uncertainty lowers γ below 64 input channels per group: ResNet-18 at α=2, γ=2,
    M=4 has 14 of its 19 convolutions at γ=1 (and the stem is one dense group)."""
    spec = METHODS.get("packed_ensemble")
    ctx = BuildContext("resnet18", (3, 32, 32), 100, 4)
    with torch.device("meta"):
        model = spec.build(ctx, spec.make_hparams({"alpha": 2, "gamma": 2}))
    diag = model.diagnostics()
    convs = {n: g for n, g in diag["gamma_effective"].items() if not n.endswith("linear")}
    assert len(convs) == 20 and sum(g is None for g in convs.values()) == 1  # + the stem
    assert sum(g == 1 for g in convs.values()) == 14 and sum(g == 2 for g in convs.values()) == 5
    assert diag["gamma_lowered_layers"] == 14
