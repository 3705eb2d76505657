"""Every method × backbone × M, parametrized over the registry (timm's test_models.py style):
a new method is tested without new test code."""

from __future__ import annotations

import pytest
import torch

from harness.config.suite import expand_hparams
from harness.registry import METHODS
from methods._base import BuildContext, repeat_members, to_members

# CIFAR-style nets take any input size; 16×16 keeps the CPU time low.
BACKBONE_INPUTS = {
    "digits_cnn": ((1, 8, 8), 8),
    "fmnist_cnn": ((1, 28, 28), 10),
    "resnet18": ((3, 16, 16), 10),
}


def allowed(spec, m: int) -> bool:
    return m >= spec.min_members and (spec.max_members is None or m <= spec.max_members)


CASES = [
    pytest.param(name, backbone, m, id=f"{name}-{backbone}-M{m}")
    for name in METHODS.names()
    for backbone in BACKBONE_INPUTS
    for m in (1, 2, 4)
    if allowed(METHODS.get(name), m)
    and (METHODS.get(name).backbones is None or backbone in METHODS.get(name).backbones)
]


def build(name: str, backbone: str, m: int, **overrides):
    spec = METHODS.get(name)
    hp = expand_hparams(spec, overrides)[0]
    in_shape, k = BACKBONE_INPUTS[backbone]
    torch.manual_seed(0)
    model = spec.build(BuildContext(backbone, in_shape, k, m), spec.hparams(**hp))
    return model, in_shape, k


def step_batch(name: str, m: int, b: int, in_shape, k: int):
    """Inputs and targets of one training step in the layout the method's feeding declares."""
    spec = METHODS.get(name)
    streams = spec.feeding_for(expand_hparams(spec, {})[0]).streams(m)
    lead = (streams, b) if streams > 1 else (b,)
    return torch.randn(*lead, *in_shape), torch.randint(0, k, lead)


@pytest.mark.parametrize(("name", "backbone", "m"), CASES)
def test_method_contract(name: str, backbone: str, m: int) -> None:
    model, in_shape, k = build(name, backbone, m)
    b = 8
    x, y = step_batch(name, m, b, in_shape, k)

    model.train()
    step = model.training_outputs(x, y)
    logits, targets = step.logits, step.targets
    # M rows of members, or one when a single network trains (MC Dropout's one stochastic pass).
    assert logits.dim() == 3 and logits.shape[0] in (1, m) and logits.shape[-1] == k
    assert targets.shape == logits.shape[:2]
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    reg = model.regularizer()
    (loss if reg is None else loss + reg).backward()
    no_grad = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and (p.grad is None or not torch.any(p.grad != 0))
    ]
    assert not no_grad, f"parameters without gradient: {no_grad[:5]}"

    x = x[0] if x.dim() == 5 else x  # evaluation always feeds one batch to every member
    model.eval()
    with torch.no_grad():
        out = model(x)
        again = model(x)
    assert out.shape == (m, b, k)
    assert torch.isfinite(out).all()
    if METHODS.get(name).stochastic_eval:
        assert m == 1 or not torch.allclose(out, again), "declared stochastic eval must vary"
    else:
        torch.testing.assert_close(out, again, msg="eval mode must be deterministic")
    if m > 1:
        spread = (out.softmax(-1) - out.softmax(-1).mean(0)).abs().amax()
        # Above float32 rounding (~1e-7): σN-Ens starts near-identical on purpose (γ spread of
        # ~1% breaks the symmetry, 2e-5 apart at init), but members must not be exact copies.
        assert spread > 1e-6, "members give identical predictions"


def test_to_members_is_member_major():
    flat = torch.arange(12.0).view(6, 2)  # rows m·B + b with M=3, B=2
    out = to_members(flat, 3)
    assert out.shape == (3, 2, 2)
    assert out[1, 0].tolist() == [4.0, 5.0] and out[2, 1].tolist() == [10.0, 11.0]
    with pytest.raises(ValueError, match=r"7 rows cannot be split into 3 members"):
        to_members(torch.zeros(7, 2), 3)
    x = torch.tensor([[1.0], [2.0]])
    assert repeat_members(x, 3).flatten().tolist() == [1, 2, 1, 2, 1, 2]


def test_batch_ensemble_split_gives_each_member_a_slice_in_training():
    model, in_shape, k = build("batch_ensemble", "digits_cnn", 4, batch="split")
    model.train()
    x, y = torch.randn(10, *in_shape), torch.arange(10) % k
    out = model.training_outputs(x, y)
    assert out.logits.shape == (4, 2, k)  # 10 → 8 usable rows, B/M = 2 per member
    assert out.targets.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.reduction == "mean"


def test_batch_ensemble_repeat_tiles_the_batch_in_training():
    model, in_shape, k = build("batch_ensemble", "digits_cnn", 4)
    model.train()
    x, y = torch.randn(6, *in_shape), torch.arange(6) % k
    out = model.training_outputs(x, y)
    assert out.logits.shape == (4, 6, k)
    assert out.targets.tolist() == [list(range(6))] * 4


def test_batch_ensemble_fast_weights_have_no_weight_decay():
    model, _, _ = build("batch_ensemble", "digits_cnn", 4)
    groups = model.param_groups(5e-4)
    fast = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in fast}
    assert names and all(n.endswith(("r_group", "s_group")) for n in names)


REFERENCE_COUNTS = [  # torch-uncertainty 0.13, M=4, K=100, CIFAR style
    ("single", "resnet18", {}, 1, 11_220_132),
    ("packed_ensemble", "resnet18", {"alpha": 2, "gamma": 1}, 4, 11_282_960),
    ("packed_ensemble", "resnet18", {"alpha": 2, "gamma": 2}, 4, 8_268_304),
    ("batch_ensemble", "resnet18", {}, 4, 11_268_332),
    ("deep_ensemble", "resnet18", {}, 4, 44_880_528),
    ("single", "wrn28_10", {}, 1, 36_546_980),
    ("deep_ensemble", "wrn28_10", {}, 4, 146_187_920),
]


@pytest.mark.parametrize(
    ("name", "backbone", "hp", "m", "expected"),
    REFERENCE_COUNTS,
    ids=[f"{r[0]}-{r[1]}-{r[2]}" for r in REFERENCE_COUNTS],
)
def test_parameter_counts_match_reference(name, backbone, hp, m, expected):
    spec = METHODS.get(name)
    params = expand_hparams(spec, hp)[0]
    with torch.device("meta"):  # counts only: no memory, no init time
        model = spec.build(BuildContext(backbone, (3, 32, 32), 100, m), spec.hparams(**params))
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("name", METHODS.names())
def test_same_seed_builds_the_same_model(name: str) -> None:
    """Fair, reproducible cells: the seed alone fixes every initial weight, buffer and mask."""
    states = []
    for _ in range(2):
        model, _, _ = build(name, "digits_cnn", 1 if METHODS.get(name).max_members == 1 else 2)
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_deep_ensemble_members_get_the_gradient_they_would_get_alone():
    """Summed member losses: a mean would divide every member's learning rate by M."""
    from harness.contract.config import Recipe
    from harness.engine.train import ensemble_loss

    model, in_shape, k = build("deep_ensemble", "digits_cnn", 2)
    x, y = torch.randn(8, *in_shape), torch.randint(0, k, (8,))
    model.train()
    ensemble_loss(model, x, y, Recipe())[0].backward()
    member = model.ensemble.core_models[0]
    together = [p.grad.clone() for p in member.parameters()]
    member.zero_grad()
    torch.nn.functional.cross_entropy(member(x), y).backward()
    for a, p in zip(together, member.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_shared_weight_ensembles_average_member_losses():
    from harness.contract.config import Recipe
    from harness.engine.train import ensemble_loss

    model, in_shape, k = build("sigma_ens", "digits_cnn", 4)
    x, y = torch.randn(8, *in_shape), torch.randint(0, k, (8,))
    model.train()
    logits = model.training_outputs(x, y).logits
    per_member = [torch.nn.functional.cross_entropy(logits[m], y) for m in range(4)]
    loss, _, reg = ensemble_loss(model, x, y, Recipe())
    torch.testing.assert_close(loss - reg, torch.stack(per_member).mean(), rtol=1e-5, atol=1e-6)
