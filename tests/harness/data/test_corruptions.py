"""Corruption shift: the published CIFAR-C layout and generated, cached copies of any test split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness.data._machinery import corruption_sets as cs
from harness.data._machinery import corruptions as cc
from harness.data._machinery.base import DataMissingError, ImageSet
from harness.data.digits import load_digits_splits
from harness.metrics.corruption import summarize_corruptions
from tests import fabricate

# What an 8×8 grey image admits (before asking which optional dependencies are installed).
DIGITS_CORRUPTIONS = [
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "zoom_blur",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "pixelate",
    "jpeg_compression",
    "speckle_noise",
]
NOISE = ["gaussian_noise", "shot_noise", "speckle_noise"]


def _fake32(n: int = 4, seed: int = 0) -> ImageSet:
    """Smooth colour images (random noise would hide what blurs and noise do)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 4, 4, generator=g)
    img = torch.nn.functional.interpolate(low, size=(32, 32), mode="bilinear")
    return ImageSet((img * 200 + 20).round().to(torch.uint8), torch.arange(n) % 3)


def _digits(n: int = 12) -> ImageSet:
    test = load_digits_splits()["test"]
    return ImageSet(test.images[:n], test.labels[:n])


def _mean_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


# ---------------------------------------------------------------------------------------------
# Published layout


def test_names_are_the_15_standard_and_4_extra_corruptions():
    assert len(cc.CORRUPTIONS) == 15 and len(cc.EXTRA_CORRUPTIONS) == 4
    assert cc.EXTRA_CORRUPTIONS == ("speckle_noise", "gaussian_blur", "spatter", "saturate")
    assert len(set(cc.ALL_CORRUPTIONS)) == 19


def test_each_severity_returns_its_own_constant_block(tmp_path):
    _, labels = fabricate.write_cifar_c(tmp_path, n=20, constant_blocks=True)
    for s in cc.SEVERITIES:
        out = cc.read_cifar_c(tmp_path, "cifar10-c", "gaussian_noise", s)
        assert out.images.shape == (20, 3, 32, 32)
        assert out.images.unique().tolist() == [40 * s]
        np.testing.assert_array_equal(out.labels.numpy(), labels[(s - 1) * 20 : s * 20])


def test_severity_slicing_matches_exactly_that_severity_and_no_other(tmp_path):
    arrays, _ = fabricate.write_cifar_c(
        tmp_path, folder="CIFAR-100-C", corruptions=("frost", "spatter"), n=20
    )
    for corruption, arr in arrays.items():
        blocks = [arr[(s - 1) * 20 : s * 20].transpose(0, 3, 1, 2) for s in cc.SEVERITIES]
        for s in cc.SEVERITIES:
            got = cc.read_cifar_c(tmp_path, "cifar100-c", corruption, s).images.numpy()
            matches = [t for t in cc.SEVERITIES if np.array_equal(got, blocks[t - 1])]
            assert matches == [s]


def test_reader_memory_maps_the_file(tmp_path, monkeypatch):
    fabricate.write_cifar_c(tmp_path, n=5)
    calls = []
    real_load = np.load

    def spy(path, *args, **kwargs):
        calls.append((str(path).rsplit("/", 1)[-1], kwargs.get("mmap_mode")))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(cc.np, "load", spy)
    cc.read_cifar_c(tmp_path, "cifar10-c", "gaussian_noise", 2)
    assert calls == [("gaussian_noise.npy", "r"), ("labels.npy", "r")]


def test_missing_published_files_name_the_path_and_the_fetch_command(tmp_path):
    with pytest.raises(DataMissingError, match="harness data download cifar10-c") as err:
        cc.read_cifar_c(tmp_path, "cifar10-c", "fog", 1)
    assert str(tmp_path / "CIFAR-10-C" / "fog.npy") in str(err.value)
    fabricate.write_cifar_c(tmp_path, folder="CIFAR-100-C", corruptions=("fog",), n=5)
    with pytest.raises(DataMissingError, match=r"CIFAR-100-C/snow\.npy.*download cifar100-c"):
        cc.read_cifar_c(tmp_path, "cifar100-c", "snow", 3)
    with pytest.raises(DataMissingError, match=r"CIFAR-100-C/gaussian_noise\.npy"):
        cc.require_cifar_c(tmp_path, "cifar100-c")
    cc.require_cifar_c(tmp_path, "cifar100-c", corruptions=("fog",))


@pytest.mark.parametrize("severity", [0, 6, True])
def test_rejects_severities_outside_one_to_five(tmp_path, severity):
    with pytest.raises(ValueError, match=r"severity must be one of 1\.\.5"):
        cc.read_cifar_c(tmp_path, "cifar10-c", "fog", severity)


def test_rejects_unknown_corruptions_and_sets(tmp_path):
    with pytest.raises(ValueError, match=r"unknown corruption 'rain'.*gaussian_noise"):
        cc.read_cifar_c(tmp_path, "cifar10-c", "rain", 1)
    with pytest.raises(ValueError, match="unknown corruption set 'svhn-c'"):
        cc.read_cifar_c(tmp_path, "svhn-c", "fog", 1)


def test_rejects_a_file_that_is_not_five_severities(tmp_path):
    fabricate.write_cifar_c(tmp_path, n=4)
    np.save(tmp_path / "CIFAR-10-C" / "fog.npy", np.zeros((21, 32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="21 rows is not 5 severities"):
        cc.read_cifar_c(tmp_path, "cifar10-c", "fog", 1)


def test_corrupted_split_of_cifar10_reads_the_published_files(tmp_path):
    test = ImageSet(torch.zeros(20, 3, 32, 32, dtype=torch.uint8), torch.arange(20) % 10)
    arrays, _ = fabricate.write_cifar_c(tmp_path, labels=test.labels.numpy(), n=20)
    out = cc.corrupted_split("cifar10", tmp_path, test, "gaussian_noise", 4)
    np.testing.assert_array_equal(
        out.images.numpy(), arrays["gaussian_noise"][60:80].transpose(0, 3, 1, 2)
    )
    assert torch.equal(out.labels, test.labels)
    assert not (tmp_path / cc.GENERATED_DIR).exists()
    other = ImageSet(test.images, (test.labels + 1) % 10)
    with pytest.raises(ValueError, match="labels do not match cifar10's test split"):
        cc.corrupted_split("cifar10", tmp_path, other, "gaussian_noise", 4)
    assert cc.corruptions_for("cifar10") == list(cc.CORRUPTIONS)  # `all`: the 15 benchmark ones


# ---------------------------------------------------------------------------------------------
# Which corruptions apply


def test_applicable_corruptions_by_shape():
    assert cc.applicable_corruptions((1, 8, 8), installed_only=False) == DIGITS_CORRUPTIONS
    colour = cc.applicable_corruptions((3, 32, 32), installed_only=False)
    assert colour == [c for c in cc.ALL_CORRUPTIONS if c != "spatter"]
    grey32 = cc.applicable_corruptions((1, 32, 32), installed_only=False)
    assert grey32 == [c for c in cc.ALL_CORRUPTIONS if c not in ("spatter", "saturate")]
    assert cc.why_not_applicable("defocus_blur", (1, 8, 8)) == (
        "needs images of at least 11×11, got 8×8"
    )
    assert "no-op on grey" in cc.why_not_applicable("saturate", (1, 32, 32))
    assert "published files only" in cc.why_not_applicable("spatter", (3, 32, 32))


def test_installed_only_drops_exactly_the_transforms_missing_a_dependency():
    for shape in [(1, 8, 8), (3, 32, 32)]:
        everything = cc.applicable_corruptions(shape, installed_only=False)
        installed = cc.applicable_corruptions(shape)
        assert installed == [c for c in everything if cc.missing_requirement(c) is None]
    # these need only torch, PIL and scipy, which torch-uncertainty itself requires
    for name in [
        "gaussian_noise",
        "shot_noise",
        "zoom_blur",
        "fog",
        "brightness",
        "contrast",
        "pixelate",
        "jpeg_compression",
        "speckle_noise",
    ]:
        assert cc.missing_requirement(name) is None


def test_a_missing_dependency_raises_with_the_install_command(monkeypatch):
    monkeypatch.setattr(cc, "missing_requirement", lambda name: f"{name} needs kornia: pip x")
    with pytest.raises(ImportError, match="impulse_noise needs kornia"):
        cc.corrupt_images(_fake32().images, "impulse_noise", 1, seed=0)


def test_inapplicable_corruptions_raise_instead_of_crashing():
    digits = _digits(2).images
    with pytest.raises(ValueError, match=r"'motion_blur' does not apply.*at least 16×16"):
        cc.corrupt_images(digits, "motion_blur", 1, seed=0)
    with pytest.raises(ValueError, match=r"'saturate' does not apply.*no-op on grey"):
        cc.corrupt_images(digits, "saturate", 1, seed=0)


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)], ids=["digits-1x8x8", "colour-3x32x32"])
def test_every_applicable_installed_corruption_runs(shape):
    clean = _digits(3).images if shape[0] == 1 else _fake32(3).images
    for name in cc.applicable_corruptions(shape):
        for s in (1, 5):
            out = cc.corrupt_images(clean, name, s, seed=s)
            assert out.shape == clean.shape and out.dtype == torch.uint8, name
        assert not torch.equal(out, clean), name  # severity 5 changes the image


# ---------------------------------------------------------------------------------------------
# Generation and cache


def test_generated_copies_use_the_published_layout(tmp_path):
    test = _fake32(4)
    out = cc.generated_corruption("fake32", tmp_path, test, "gaussian_noise", 3)
    folder = tmp_path / "generated-c" / "fake32"
    arr = np.load(folder / "gaussian_noise.npy")
    assert arr.shape == (20, 32, 32, 3) and arr.dtype == np.uint8
    labels = np.load(folder / "labels.npy")
    np.testing.assert_array_equal(labels, np.tile(test.labels.numpy(), 5))
    assert json.loads((folder / "source.json").read_text())["n"] == 4
    np.testing.assert_array_equal(out.images.numpy(), arr[8:12].transpose(0, 3, 1, 2))
    assert torch.equal(out.labels, test.labels)
    for s in cc.SEVERITIES:  # each block is that severity's transform of the clean images
        expected = cc.corrupt_images(
            test.images, "gaussian_noise", s, cc.corruption_seed("fake32", "gaussian_noise", s)
        )
        np.testing.assert_array_equal(arr[(s - 1) * 4 : s * 4], expected.permute(0, 2, 3, 1))
    assert not list(folder.glob("*.tmp"))


def test_grey_images_keep_one_channel_in_the_cache(tmp_path):
    test = _digits(5)
    out = cc.generated_corruption("digits-test", tmp_path, test, "shot_noise", 5)
    arr = np.load(tmp_path / "generated-c" / "digits-test" / "shot_noise.npy")
    assert arr.shape == (25, 8, 8, 1)
    assert out.images.shape == (5, 1, 8, 8)


def test_cache_hit_does_not_regenerate(tmp_path, monkeypatch):
    test = _fake32(4)
    first = cc.generated_corruption("fake32", tmp_path, test, "contrast", 2)
    path = tmp_path / "generated-c" / "fake32" / "contrast.npy"
    stamp = path.stat().st_mtime_ns

    def boom(*args, **kwargs):
        raise AssertionError("regenerated a cached corruption")

    monkeypatch.setattr(cc, "corrupt_images", boom)
    again = cc.generated_corruption("fake32", tmp_path, test, "contrast", 2)
    other = cc.generated_corruption("fake32", tmp_path, test, "contrast", 5)
    assert torch.equal(first.images, again.images)
    assert not torch.equal(first.images, other.images)
    assert path.stat().st_mtime_ns == stamp


def test_a_changed_test_split_invalidates_the_cache(tmp_path):
    cc.generated_corruption("fake32", tmp_path, _fake32(4, seed=0), "brightness", 1)
    changed = _fake32(4, seed=1)
    out = cc.generated_corruption("fake32", tmp_path, changed, "brightness", 1)
    expected = cc.corrupt_images(
        changed.images, "brightness", 1, cc.corruption_seed("fake32", "brightness", 1)
    )
    assert torch.equal(out.images, expected)


def test_generation_is_deterministic_and_leaves_the_callers_rng_alone(tmp_path):
    test = _fake32(3)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = cc.generated_corruption("fake32", tmp_path / "a", test, "gaussian_noise", 2)
    assert torch.equal(torch.rand(3), expected_next)
    b = cc.generated_corruption("fake32", tmp_path / "b", test, "gaussian_noise", 2)
    assert torch.equal(a.images, b.images)
    assert (tmp_path / "a/generated-c/fake32/gaussian_noise.npy").read_bytes() == (
        tmp_path / "b/generated-c/fake32/gaussian_noise.npy"
    ).read_bytes()


@pytest.mark.parametrize("name", NOISE)
@pytest.mark.parametrize("kind", ["digits", "colour"])
def test_noise_severity_5_departs_further_from_clean_than_severity_1(tmp_path, name, kind):
    test = _digits(40) if kind == "digits" else _fake32(8)
    s1 = cc.generated_corruption(kind, tmp_path, test, name, 1)
    s5 = cc.generated_corruption(kind, tmp_path, test, name, 5)
    d1, d5 = _mean_abs_diff(s1.images, test.images), _mean_abs_diff(s5.images, test.images)
    assert 0 < d1 < d5


def test_rgb_only_transforms_see_three_channels_and_return_grey(monkeypatch):
    digits = _digits(4).images
    native = cc.corrupt_images(digits, "brightness", 3, seed=0)
    monkeypatch.setattr(cc, "_NEEDS_RGB", {"brightness"})
    seen = []
    real = cc.build_transform

    def spy(name, severity, seed):
        t = real(name, severity, seed)
        return lambda x: seen.append(x.shape[-3]) or t(x)

    monkeypatch.setattr(cc, "build_transform", spy)
    via_rgb = cc.corrupt_images(digits, "brightness", 3, seed=0)
    assert seen == [3]
    assert via_rgb.shape == digits.shape
    assert (via_rgb.int() - native.int()).abs().max().item() <= 1  # luma of equal channels


def test_corrupted_split_generates_for_digits(tmp_path):
    test = load_digits_splits()["test"]
    out = cc.corrupted_split("digits", tmp_path, test, "jpeg_compression", 5)
    assert out.images.shape == test.images.shape
    assert (tmp_path / "generated-c" / "digits" / "jpeg_compression.npy").is_file()
    # `all` on digits: its benchmark corruptions that work at 8×8 (speckle_noise is an extra)
    assert cc.corruptions_for("digits") == [c for c in DIGITS_CORRUPTIONS if c in cc.CORRUPTIONS]


# ---------------------------------------------------------------------------------------------
# What `all` means, validation, and the summary's means


def _suite_file(tmp_path, dataset: str, corruptions: str) -> str:
    path = tmp_path / "suite.yaml"
    path.write_text(
        f"name: corr\ngrid:\n  datasets: [{dataset}]\n  backbones: [digits_cnn]\n"
        "  methods: [single]\n"
        f"evaluation:\n  corruptions: {corruptions}\n"
    )
    return str(path)


def test_all_on_cifar100_c_is_exactly_the_15_benchmark_names_whatever_is_installed(monkeypatch):
    monkeypatch.setattr(cs, "missing_requirement", lambda name: f"{name}: nothing installed")
    monkeypatch.setattr(cc, "missing_requirement", lambda name: f"{name}: nothing installed")
    expected = [
        "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
        "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
        "elastic_transform", "pixelate", "jpeg_compression",
    ]  # fmt: skip
    assert cs.resolve_corruptions("cifar100", ["all"]) == expected
    assert cc.corruptions_for("cifar100") == expected
    assert cs.check_corruptions("cifar100", ["all"]) == []  # published files: nothing to build
    # extras only when named, after the benchmark ones, each once
    assert cs.resolve_corruptions("cifar10", ["all", "spatter", "fog"]) == [*expected, "spatter"]
    assert cs.resolve_corruptions("cifar10", ["saturate", "fog"]) == ["saturate", "fog"]


def test_digits_has_its_own_fixed_set_by_image_shape(monkeypatch):
    digits = cs.corruption_set("digits")
    assert digits.source is None and digits.in_shape == (1, 8, 8)
    assert list(digits.benchmark) == [c for c in DIGITS_CORRUPTIONS if c in cs.CORRUPTIONS]
    assert digits.extras == ("speckle_noise",)
    monkeypatch.setattr(cs, "missing_requirement", lambda name: "x")  # installs do not matter
    assert cs.resolve_corruptions("digits", ["all"]) == list(digits.benchmark)


def test_check_names_unknown_and_inapplicable_corruptions_with_the_choices():
    problems = cs.check_corruptions("cifar10", ["all", "rain", "fog", "hail"])
    assert len(problems) == 2
    assert problems[0].startswith("unknown corruption 'rain' for dataset 'cifar10'; choose from ")
    assert "all, gaussian_noise, shot_noise" in problems[0] and problems[0].endswith("saturate")
    assert "unknown corruption 'hail'" in problems[1]
    (glass,) = cs.check_corruptions("digits", ["glass_blur"])
    assert glass.startswith(
        "corruption 'glass_blur' cannot be produced for 'digits': needs images of at least 32×32"
    )
    assert "choose from all, gaussian_noise" in glass
    (spatter,) = cs.check_corruptions("digits", ["spatter"])
    assert "no 'spatter' transform (published files only)" in spatter
    with pytest.raises(ValueError, match=r"unknown corruption 'rain' for dataset 'cifar100'"):
        cs.resolve_corruptions("cifar100", ["rain"])


def test_check_names_a_corruption_whose_generator_is_unavailable_here(monkeypatch):
    def missing(name):
        return f"{name} needs torch-uncertainty's image extras (no cv2)" if name == "fog" else None

    monkeypatch.setattr(cs, "missing_requirement", missing)
    assert cs.check_corruptions("digits", ["all"]) == [
        "corruption 'fog' cannot be generated on this machine for 'digits': fog needs "
        "torch-uncertainty's image extras (no cv2)"
    ]
    assert cs.check_corruptions("digits", ["brightness"]) == []


def test_check_names_missing_published_files_only_for_the_requested_corruptions(tmp_path):
    fabricate.write_cifar_c(tmp_path, folder="CIFAR-100-C", corruptions=cs.CORRUPTIONS, n=2)
    assert cs.check_corruptions("cifar100", ["all"], tmp_path) == []
    (problem,) = cs.check_corruptions("cifar100", ["all", "spatter"], tmp_path)
    assert f"{tmp_path / 'CIFAR-100-C' / 'spatter'}.npy is missing" in problem
    assert "harness data download cifar100-c" in problem


def test_harness_validate_rejects_unknown_and_unavailable_corruptions(tmp_path, monkeypatch):
    from harness.config.includes import SuiteError
    from harness.config.parse import load_suite

    with pytest.raises(SuiteError, match=r"evaluation\.corruptions: unknown corruption 'rain'"):
        load_suite(_suite_file(tmp_path, "digits", "[all, rain]"))
    with pytest.raises(SuiteError, match=r"'motion_blur' cannot be produced for 'digits'"):
        load_suite(_suite_file(tmp_path, "digits", "[motion_blur]"))
    monkeypatch.setattr(
        cs, "missing_requirement", lambda n: "needs opencv" if n == "zoom_blur" else None
    )
    with pytest.raises(SuiteError, match=r"'zoom_blur' cannot be generated on this machine"):
        load_suite(_suite_file(tmp_path, "digits", "[all]"))
    assert load_suite(_suite_file(tmp_path, "digits", "[fog, speckle_noise]")).evaluation


def _cells(names, acc):
    return [
        {"corruption": n, "severity": s, "acc": acc[n] - 0.1 * s, "nll": 1.0 + s, "ece": 0.01 * s}
        for n in names
        for s in (1, 2, 3, 4, 5)
    ]


def test_summary_means_only_benchmark_corruptions_and_reports_extras_apart():
    acc = {n: 0.9 for n in cs.CORRUPTIONS} | {"spatter": 0.2, "saturate": 0.3}
    out = summarize_corruptions(
        _cells([*cs.CORRUPTIONS, "spatter", "saturate"], acc), "cifar10", (1, 2, 3, 4, 5)
    )
    assert out["mean"]["acc"] == pytest.approx(0.9 - 0.3)  # mean over s of 0.9 − 0.1·s
    assert out["mean"]["nll"] == pytest.approx(4.0) and out["mean"]["ece"] == pytest.approx(0.03)
    assert out["per_severity"]["5"]["acc"] == pytest.approx(0.4)
    assert out["ece_slope"] == pytest.approx(0.01)
    assert out["mean_corruptions"] == list(cs.CORRUPTIONS)
    assert out["corruptions_used"] == [*cs.CORRUPTIONS, "spatter", "saturate"]
    assert out["extras"]["corruptions"] == ["spatter", "saturate"]
    assert out["extras"]["mean"]["acc"] == pytest.approx(0.25 - 0.3)
    assert out["corruption_mean_over"] == (
        "all 15 benchmark corruptions of CIFAR-10-C × severities 1, 2, 3, 4, 5; "
        "extras reported apart: spatter, saturate"
    )
    part = summarize_corruptions(_cells(["fog", "snow"], acc), "cifar10", (1, 2, 3, 4, 5))
    assert part["corruption_mean_over"] == (
        "2 of the 15 benchmark corruptions of CIFAR-10-C (fog, snow) × severities 1, 2, 3, 4, 5"
    )
    assert part["extras"] is None
    with pytest.raises(ValueError, match=r"corruptions \(spatter\) is a benchmark"):
        summarize_corruptions(_cells(["spatter"], acc), "cifar10", (1, 2, 3, 4, 5))


def test_harness_validate_command_exits_2_naming_the_corruption(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    assert main(["validate", _suite_file(tmp_path, "digits", "[all, rain]"), "--skip-data"]) == 2
    err = capsys.readouterr().err
    assert "evaluation.corruptions: unknown corruption 'rain' for dataset 'digits'" in err
    assert "choose from all, gaussian_noise" in err
    assert main(["validate", _suite_file(tmp_path, "digits", "[all]"), "--skip-data"]) == 0
    monkeypatch.setattr(cs, "missing_requirement", lambda n: "no cv2" if n == "fog" else None)
    assert main(["validate", _suite_file(tmp_path, "digits", "[fog]"), "--skip-data"]) == 2
    assert "corruption 'fog' cannot be generated on this machine" in capsys.readouterr().err


def test_which_transforms_build_here_is_cached_per_installation(tmp_path, monkeypatch):
    """Building the transforms imports torch-uncertainty (seconds of every ``validate``): the
    answers are computed once, read back while torch-uncertainty, Python and the optional
    modules stay the same, and computed again when one of them changes."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    built = []

    def fake_build(name):
        built.append(name)
        return f"{name}: needs cv2" if name == "elastic_transform" else None

    monkeypatch.setattr(cs, "_try_build", fake_build)
    cs.missing_requirement.cache_clear()
    try:
        assert cs.missing_requirement("elastic_transform") == "elastic_transform: needs cv2"
        assert sorted(built) == sorted(cs._TRANSFORMS)  # every transform, once
        cs.missing_requirement.cache_clear()
        built.clear()
        assert cs.missing_requirement("fog") is None
        assert cs.missing_requirement("elastic_transform") == "elastic_transform: needs cv2"
        assert built == []  # read from the cache
        (file,) = (tmp_path / "corruption-requirements").glob("*.json")
        assert json.loads(file.read_text())["elastic_transform"] == "elastic_transform: needs cv2"
        monkeypatch.setattr(cs, "_OPTIONAL_MODULES", (*cs._OPTIONAL_MODULES, "wand"))
        cs.missing_requirement.cache_clear()
        assert cs.missing_requirement("fog") is None and len(built) == len(cs._TRANSFORMS)
        assert [p.name for p in (tmp_path / "corruption-requirements").glob("*.json")] != [
            file.name
        ]  # the new inputs' answer replaced the old one
    finally:
        cs.missing_requirement.cache_clear()
