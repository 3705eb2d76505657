import pytest

from harness.registries import BACKBONES, DATASETS, METHODS
from harness.registry import DuplicateNameError, Registry, UnknownNameError


def test_duplicate_name_raises():
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)
    with pytest.raises(DuplicateNameError, match=r"widget 'a' is already registered"):
        reg.register("a", 2)
    assert reg.get("a") == 1


def test_unknown_name_lists_choices_and_closest_match():
    reg: Registry[int] = Registry("widget")
    for i, name in enumerate(["deep_ensemble", "batch_ensemble", "single"]):
        reg.register(name, i)
    with pytest.raises(
        UnknownNameError,
        match=r"unknown widget 'deep_ensembel'\. Did you mean "
        r"'deep_ensemble'\? Valid choices: batch_ensemble, deep_ensemble, single",
    ):
        reg.get("deep_ensembel")
    with pytest.raises(UnknownNameError, match=r"unknown widget 'zzz'\. Valid choices") as info:
        reg.get("zzz")
    assert info.value.suggestion is None
    assert info.value.choices == ["batch_ensemble", "deep_ensemble", "single"]


def test_decorator_registration_returns_the_object():
    reg: Registry[type] = Registry("thing")

    @reg.register("k")
    class K:
        pass

    assert reg.get("k") is K
    assert "k" in reg and len(reg) == 1


def test_builtin_registries_are_populated():
    assert {
        "single",
        "deep_ensemble",
        "sigma_ens",
        "film_ensemble",
        "batch_ensemble",
        "packed_ensemble",
        "mc_dropout",
        "mimo",
        "masksembles",
    } <= set(METHODS.names())
    assert {"digits_cnn", "resnet18", "resnet50", "wrn28_10", "vit_small_32"} <= set(
        BACKBONES.names()
    )
    assert {"digits", "digits_heldout", "sklearn_photos", "cifar10", "cifar100", "svhn"} <= set(
        DATASETS.names()
    )
