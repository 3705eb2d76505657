"""``pretrained:`` by name: timm and torchvision weights loaded from files each test places in the
library's own cache layout (a temporary Hugging Face Hub cache and ``$TORCH_HOME``), with the
network off. The models are built with random init, saved in the exact file and format the
library expects, loaded back by name and compared tensor by tensor."""

from __future__ import annotations

import textwrap
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file

from harness.backbones import _weights as W
from harness.cli import main
from harness.config.parse import load_suite
from harness.engine.build import build_model
from harness.engine.runner import pretrained_state
from harness.registry import DATASETS
from harness.storage.checkpoint import TRUST_ENV, UnsafeWeightsError

TV_NAME = "ResNet18_Weights.IMAGENET1K_V1"
TV_FILE = "resnet18-f37072fd.pth"  # the basename of that enum's published URL
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def caches(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(Hub cache, torch hub checkpoints folder), empty, for this test only; network off."""
    hub = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these once, at import: point its constants at this test's cache.
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # torch.hub.get_dir() reads it
    monkeypatch.delenv(TRUST_ENV, raising=False)
    return hub, tmp_path / "torch" / "hub" / "checkpoints"


def _random_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def place_on_hub(hub: Path, repo: str, filename: str, state: dict[str, torch.Tensor]) -> Path:
    """Write ``state`` where ``hf_hub_download`` leaves a file: models--<org>--<name>/refs/main
    holding the commit, snapshots/<commit>/<filename> (safetensors or torch.save)."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    path = folder / "snapshots" / COMMIT / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    if filename.endswith(".safetensors"):
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def assert_same(loaded: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    assert sorted(loaded) == sorted(saved)
    for key, tensor in saved.items():
        assert torch.equal(loaded[key], tensor), key


@pytest.mark.parametrize("filename", ["model.safetensors", "pytorch_model.bin"])
def test_timm_weights_load_by_name_from_the_hub_cache(caches, filename):
    hub, _ = caches
    torch.manual_seed(0)
    saved = _random_state(timm.create_model("resnet10t", pretrained=False))
    place_on_hub(hub, "timm/resnet10t.c3_in1k", filename, saved)

    assert W.named_problem("timm:resnet10t.c3_in1k") is None
    assert_same(W.load_named("timm:resnet10t.c3_in1k"), saved)


@pytest.mark.slow  # builds a timm ViT twice (~7 s): CI runs it, the default run stays fast
def test_timm_vit_goes_through_timms_own_key_mapping(caches):
    """A ViT checkpoint passes timm's filter_fn, exactly as after a real download."""
    hub, _ = caches
    name = "vit_tiny_patch16_224.augreg_in21k"
    torch.manual_seed(1)
    saved = _random_state(timm.create_model(name, pretrained=False))
    place_on_hub(hub, f"timm/{name}", "model.safetensors", saved)
    assert_same(W.load_named(f"timm:{name}"), saved)


def test_torchvision_weights_load_by_name_from_torch_home(caches):
    _, checkpoints = caches
    torch.manual_seed(2)
    saved = _random_state(torchvision.models.resnet18(weights=None))
    checkpoints.mkdir(parents=True)
    torch.save(saved, checkpoints / TV_FILE)

    assert W.torchvision_cached_file(TV_NAME) == checkpoints / TV_FILE
    assert W.named_problem(f"torchvision:{TV_NAME}") is None
    assert_same(W.load_named(f"torchvision:{TV_NAME}"), saved)


def test_missing_weights_name_the_cache_and_the_fetch_command(caches):
    hub, checkpoints = caches
    with pytest.raises(W.WeightsError) as err:
        W.load_named("timm:resnet10t.c3_in1k")
    msg = str(err.value)
    assert "\n" not in msg
    assert f"looked for {hub}/models--timm--resnet10t.c3_in1k/snapshots/<refs/main>/" in msg
    assert "model.safetensors or pytorch_model.bin" in msg
    assert "`harness data download timm:resnet10t.c3_in1k`" in msg

    with pytest.raises(W.WeightsError) as err:
        W.load_named(f"torchvision:{TV_NAME}")
    msg = str(err.value)
    assert "\n" not in msg
    assert f"looked for {checkpoints / TV_FILE} ($TORCH_HOME)" in msg
    assert f"`harness data download torchvision:{TV_NAME}`" in msg


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("timm:", r"pretrained: 'timm:' names no weights \(e\.g\. timm:vit_small"),
        ("torchvision:", r"names no weights \(e\.g\. torchvision:ResNet18_Weights"),
        ("timm:no_such_net", r"timm:no_such_net: timm .* has no such pretrained weights"),
        ("torchvision:Nope_Weights.X", r"torchvision:Nope_Weights\.X: no such torchvision"),
    ],
)
def test_bad_names_are_one_line_errors(caches, value, match):
    with pytest.raises(W.WeightsError, match=match):
        W.load_named(value)


def test_syntax():
    assert W.parse_pretrained("timm:vit_small_patch16_224.augreg_in21k") == (
        "timm",
        "vit_small_patch16_224.augreg_in21k",
    )
    assert W.parse_pretrained(f"torchvision:{TV_NAME}") == ("torchvision", TV_NAME)
    assert W.parse_pretrained("runs/a:b/final.pt") == ("path", "runs/a:b/final.pt")
    assert W.is_named("timm:x") and not W.is_named("final.pt") and not W.is_named(None)


def test_a_pickle_on_the_hub_that_needs_full_unpickling_is_refused(caches, tmp_path):
    hub, _ = caches
    marker = tmp_path / "ran"
    from tests.harness.engine.test_security import write_payload

    path = place_on_hub(hub, "timm/resnet10t.c3_in1k", "pytorch_model.bin", {})
    write_payload(path, marker)
    with pytest.raises(UnsafeWeightsError, match=r"refused to load .*pytorch_model\.bin"):
        W.load_named("timm:resnet10t.c3_in1k")
    assert not marker.exists()


def test_fit_to_backbone_keeps_the_seeded_head_and_leaves_the_rng(caches):
    _, checkpoints = caches
    torch.manual_seed(3)
    saved = _random_state(torchvision.models.resnet18(weights=None))  # 1000 classes
    checkpoints.mkdir(parents=True)
    torch.save(saved, checkpoints / TV_FILE)

    def build():
        return torchvision.models.resnet18(weights=None, num_classes=10)

    before = torch.random.get_rng_state()
    fitted = W.fit_to_backbone(W.load_named(f"torchvision:{TV_NAME}"), build, 7, TV_NAME)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(7)
    fresh = build().state_dict()
    assert sorted(fitted) == sorted(fresh)
    for key in fresh:
        expected = fresh[key] if key.startswith("fc.") else saved[key]
        assert torch.equal(fitted[key], expected), key
    assert fitted["fc.weight"].shape == (10, 512)

    with pytest.raises(W.WeightsError, match=r"does not fit the backbone: .* missing"):
        W.fit_to_backbone(saved, lambda: timm.create_model("resnet10t"), 0, "x")


SUITE = """
name: named
grid:
  datasets: [digits]
  backbones: [tv_resnet18]
  seeds: [0]
  M: [2]
  methods: [{name: sigma_ens, hparams: {pretrained: "torchvision:%s"}}]
recipe: {epochs: 1, batch_size: 256, lr: 0.01}
evaluation: {cost: false}
"""


def test_validate_checks_the_name_and_the_cache(caches, write_suite, capsys):
    _, checkpoints = caches
    path = write_suite(textwrap.dedent(SUITE % TV_NAME))
    # --skip-data skips every file check, the weights' included (they are data too).
    assert main(["validate", str(path), "--skip-data"]) == 0
    capsys.readouterr()
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"{path}: grid.methods[0].hparams.pretrained: torchvision:{TV_NAME} is not in the torch "
        f"hub cache: looked for {checkpoints / TV_FILE}"
    )
    checkpoints.mkdir(parents=True)
    torch.save(_random_state(torchvision.models.resnet18(weights=None)), checkpoints / TV_FILE)
    assert main(["validate", str(path)]) == 0


def test_a_cell_converts_named_weights(caches, write_suite, tmp_path):
    """The runner's pretrained state for a digits cell on tv_resnet18: the published tensors
    where shapes fit; the 1-channel stem and the 8-class head from the backbone's seeded init."""
    _, checkpoints = caches
    torch.manual_seed(4)
    saved = _random_state(torchvision.models.resnet18(weights=None))
    checkpoints.mkdir(parents=True)
    torch.save(saved, checkpoints / TV_FILE)
    cell = load_suite(write_suite(textwrap.dedent(SUITE % TV_NAME))).cells()[0]
    spec = DATASETS.get("digits")

    pre = pretrained_state(cell, tmp_path / cell.cell_id, spec, False)
    kept = {"conv1.weight", "fc.weight", "fc.bias"}  # 1 input channel, K classes
    for key, tensor in saved.items():
        if key not in kept:
            assert torch.equal(pre[key], tensor), key
    assert pre["conv1.weight"].shape[1] == 1 and pre["fc.weight"].shape[0] == spec.num_classes
    again = pretrained_state(cell, tmp_path / cell.cell_id, spec, False)
    assert torch.equal(pre["fc.weight"], again["fc.weight"])  # seeded: the same every run

    # The conversion method takes it (a strict load into its backbone) and predicts with it.
    model, _ = build_model(cell, spec, pre)
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(3, *spec.in_shape))
    assert out.shape == (2, 3, spec.num_classes)


# ---------------------------------------------------------------------------------------------
# harness data download timm:NAME / torchvision:NAME (the libraries' own downloaders)


def test_download_of_cached_weights_names_the_file(caches, capsys):
    hub, checkpoints = caches
    torch.manual_seed(5)
    place_on_hub(
        hub,
        "timm/resnet10t.c3_in1k",
        "model.safetensors",
        _random_state(timm.create_model("resnet10t")),
    )
    checkpoints.mkdir(parents=True)
    torch.save(_random_state(torchvision.models.resnet18(weights=None)), checkpoints / TV_FILE)

    names = ["timm:resnet10t.c3_in1k", f"torchvision:{TV_NAME}"]
    assert main(["data", "download", *names]) == 0
    out = capsys.readouterr().out.splitlines()
    snapshot = hub / "models--timm--resnet10t.c3_in1k" / "snapshots" / COMMIT
    assert out == [
        f"timm:resnet10t.c3_in1k: ready in {snapshot / 'model.safetensors'}",
        f"torchvision:{TV_NAME}: ready in {checkpoints / TV_FILE}",
    ]


def test_download_of_weights_offline_is_one_line_and_exit_2(caches, monkeypatch, capsys):
    import urllib.error

    assert main(["data", "download", "timm:resnet10t.c3_in1k"]) == 2  # the hub is offline
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: could not download timm:resnet10t.c3_in1k into the library's")
    assert "$HF_HOME/hub for timm" in err

    def unreachable(url, dst, *args, **kwargs):
        raise urllib.error.URLError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(torch.hub, "download_url_to_file", unreachable)
    assert main(["data", "download", f"torchvision:{TV_NAME}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"could not download torchvision:{TV_NAME} " in err
    assert "Network is unreachable" in err

    assert main(["data", "download", "torchvision:Nope_Weights.X"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: pretrained: torchvision:Nope_Weights.X: no such torchvision weights"
    )
