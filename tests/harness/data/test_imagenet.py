"""ImageNet (both layouts), ImageNet-C, OpenOOD's ImageNet OOD sets, their loader and backbones,
and a tiny ImageNet suite end to end through ``harness run`` — on fabricated trees of real JPEGs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from harness.cli import main
from harness.data._machinery.base import DataMissingError, LoaderOptions
from harness.data._machinery.file_loader import FileSplit, ImageTransform
from harness.data._machinery.loader import make_loader
from harness.registry import BACKBONES, DATASETS
from tests import fabricate_imagenet as fab
from tests.conftest import REPO
from tests.harness.cli.test_download import server  # noqa: F401  (the local HTTP server fixture)

CPU = torch.device("cpu")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def options(**kw) -> LoaderOptions:
    base = dict(batch_size=4, device=CPU, mean=MEAN, std=STD, workers=0)
    return LoaderOptions(**{**base, **kw})


def batches(split, **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    epoch = kw.pop("epoch", 0)
    loader = make_loader(split, options(**kw))
    loader.set_epoch(epoch)
    return list(loader)


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: these models are tiny, and on a loaded 2-core machine two OpenMP
    threads run many times slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def folder_tree(tmp_path) -> Path:
    fab.write_imagenet(tmp_path)
    return tmp_path


# --- the two layouts ------------------------------------------------------------------------


def test_both_layouts_list_the_same_sorted_files_and_labels(tmp_path):
    from harness.data.imagenet import layout

    plain, tv = tmp_path / "plain", tmp_path / "tv"
    fab.write_imagenet(plain)
    fab.write_imagenet(tv, layout="torchvision")
    assert layout(plain) == "folder" and layout(tv) == "torchvision"
    spec = DATASETS.get("imagenet")
    assert spec.in_shape == (3, 224, 224) and spec.num_classes == 1000
    for root in (plain, tv):
        splits = spec.load(root)
        train, test = splits["train"], splits["test"]
        assert len(train) == 12 and len(test) == 6
        # class index = sorted wnid order; files sorted within a class
        assert train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
        assert [f.decode() for f in train.files[:4]] == [
            f"n01440764/n01440764_{i}.JPEG" for i in (10, 20, 30, 40)
        ]
        assert test.labels.tolist() == [0, 0, 1, 1, 2, 2]
        assert test.files[0].decode() == "n01440764/ILSVRC2012_val_00000005.JPEG"
        assert test.path(0).is_file()


def test_file_lists_are_cached_on_disk_and_rebuilt_when_a_class_folder_changes(folder_tree):
    from harness.data.imagenet import file_list

    _, files, _ = file_list(folder_tree, "train")
    cache = folder_tree / "imagenet" / ".harness-files-train.npz"
    assert cache.is_file() and len(files) == 12
    extra = folder_tree / "imagenet" / "train" / "n01443537" / "n01443537_99.JPEG"
    fab._jpeg(extra, np.random.default_rng(0), 40, 40)
    os.utime(extra.parent, ns=(1, 1))  # a distinct folder mtime, whatever the clock resolution
    _, files, labels = file_list(folder_tree, "train")
    assert len(files) == 13 and b"n01443537/n01443537_99.JPEG" in files.tolist()
    assert labels.tolist().count(1) == 5


def test_missing_imagenet_names_both_layouts_and_the_preparation_command(tmp_path):
    spec = DATASETS.get("imagenet")
    assert not spec.is_available(tmp_path)
    with pytest.raises(DataMissingError, match=r"torchvision's ImageNet layout .*meta\.bin.*plain"):
        spec.load(tmp_path)
    with pytest.raises(DataMissingError, match=r"d\.ImageNet\('.*/imagenet', split='val'\)"):
        spec.require(tmp_path)
    # the raw val archive extracted flat (no class folders) is not a layout either
    (tmp_path / "imagenet" / "train" / "n01440764").mkdir(parents=True)
    (tmp_path / "imagenet" / "val").mkdir()
    (tmp_path / "imagenet" / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"")
    with pytest.raises(DataMissingError, match=r"harness data download imagenet` prints"):
        spec.load(tmp_path)


def test_download_prints_the_preparation_commands_and_exits_2(tmp_path, capsys):
    assert main(["data", "download", "imagenet", "--data-root", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "https://image-net.org/download-images.php" in captured.out
    assert f"ImageNet('{tmp_path}/imagenet', split='train')" in captured.out
    assert "error: imagenet cannot be downloaded here" in captured.err
    assert main(["data", "download", "openood_ninco", "--data-root", str(tmp_path)]) == 2
    assert "--save_dir " + str(tmp_path / "openood") in capsys.readouterr().out
    fab.write_imagenet(tmp_path)
    assert main(["data", "download", "imagenet", "--data-root", str(tmp_path)]) == 0
    assert f"imagenet: ready in {tmp_path}" in capsys.readouterr().out


# --- the loader -----------------------------------------------------------------------------


def test_evaluation_transform_is_resize_256_centre_crop_224_normalised(folder_tree):
    import torchvision.transforms.functional as TF

    test = DATASETS.get("imagenet").load(folder_tree)["test"]
    (x, y), *rest = batches(test, batch_size=4)
    assert x.shape == (4, 3, 224, 224) and x.dtype == torch.float32 and len(rest) == 1
    assert y.tolist() == [0, 0, 1, 1]
    with Image.open(test.path(1)) as im:
        ref = TF.center_crop(TF.resize(im.convert("RGB"), 256, antialias=True), [224, 224])
    ref = TF.normalize(TF.to_tensor(ref), MEAN, STD)
    assert torch.allclose(x[1], ref, atol=1e-5)


@pytest.mark.slow  # decodes a fabricated ImageNet tree several times (~10 s); CI runs it
def test_augmentation_is_a_function_of_seed_epoch_and_stream_only(folder_tree):
    train = DATASETS.get("imagenet").load(folder_tree)["train"]
    kw = dict(augment="imagenet", train=True, shuffle=True, seed=3)
    a = batches(train, epoch=1, **kw)
    again = batches(train, epoch=1, workers=2, **kw)  # worker processes: the same images
    assert len(a) == 3 and all(x.shape == (4, 3, 224, 224) for x, _ in a)
    for (x1, y1), (x2, y2) in zip(a, again, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    other = batches(train, epoch=2, **kw)
    assert not torch.equal(torch.cat([x for x, _ in a]), torch.cat([x for x, _ in other]))
    # every image once per epoch, in a shuffled order
    assert sorted(torch.cat([y for _, y in a]).tolist()) == [0] * 4 + [1] * 4 + [2] * 4
    assert torch.cat([y for _, y in a]).tolist() != sorted(torch.cat([y for _, y in a]).tolist())
    # crops differ from the evaluation transform and between the two flips of the coin
    plain = batches(train, shuffle=True, seed=3, epoch=1)
    assert not torch.equal(a[0][0], plain[0][0]) and torch.equal(a[0][1], plain[0][1])


def test_shards_are_contiguous_blocks_of_the_global_batch(folder_tree):
    train = DATASETS.get("imagenet").load(folder_tree)["train"]
    kw = dict(augment="imagenet", train=True, shuffle=True, seed=5, batch_size=5)
    whole = batches(train, **kw)
    r0, r1 = batches(train, shard=(0, 2), **kw), batches(train, shard=(1, 2), **kw)
    assert [len(y) for _, y in whole] == [5, 5, 2]
    assert [len(y) for _, y in r0] == [3, 3, 1] and [len(y) for _, y in r1] == [2, 2, 1]
    for (x, y), (x0, y0), (x1, y1) in zip(whole, r0, r1, strict=True):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
    dropped = batches(train, drop_last=True, **kw)
    assert len(dropped) == 2 and len(make_loader(train, options(drop_last=True, **kw))) == 2


def test_streams_stack_independent_orders_and_stream_0_is_the_shared_one(folder_tree):
    train = DATASETS.get("imagenet").load(folder_tree)["train"]
    kw = dict(augment="imagenet", train=True, shuffle=True, seed=1)
    one = batches(train, **kw)
    two = batches(train, streams=2, **kw)
    x, y = two[0]
    assert x.shape == (2, 4, 3, 224, 224) and y.shape == (2, 4)
    assert torch.equal(x[0], one[0][0]) and torch.equal(y[0], one[0][1])
    assert not torch.equal(torch.cat([b[1][1] for b in two]), torch.cat([b[1] for b in one]))


def test_subset_keeps_paths_and_labels(folder_tree):
    test = DATASETS.get("imagenet").load(folder_tree)["test"]
    sub = test.subset(torch.tensor([1, 4]))
    assert isinstance(sub, FileSplit) and sub.labels.tolist() == [0, 2]
    assert [f.decode() for f in sub.files] == [test.files[1].decode(), test.files[4].decode()]
    with pytest.raises(ValueError, match=r"augment 'autoaugment' is not available"):
        make_loader(sub, options(augment="autoaugment", train=True))


# --- ImageNet-C -----------------------------------------------------------------------------


def test_imagenet_c_mirrors_val_and_is_read_without_a_resize(folder_tree):
    from harness.data._machinery.corruption_sets import check_corruptions
    from harness.data._machinery.corruptions import corrupted_split

    fab.write_imagenet_c(folder_tree, ("fog", "spatter"), severities=(2,))
    test = DATASETS.get("imagenet").load(folder_tree)["test"]
    fog = corrupted_split("imagenet", folder_tree, test, "fog", 2)
    assert fog.root == folder_tree / "imagenet-c" / "fog" / "2"
    assert torch.equal(fog.labels, test.labels) and (fog.files == test.files).all()
    (x, _), _ = batches(fog, batch_size=4, mean=(0.0,) * 3, std=(1.0,) * 3)
    with Image.open(fog.path(2)) as im:
        stored = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).float()
    assert torch.allclose(x[2] * 255, stored, atol=1e-3)  # pixel for pixel: no resize
    with pytest.raises(DataMissingError, match=r"ImageNet-C fog severity 3 not found"):
        corrupted_split("imagenet", folder_tree, test, "fog", 3)
    os.remove(fog.path(5))
    with pytest.raises(DataMissingError, match=r"lacks 1 of the 6 validation images"):
        corrupted_split("imagenet", folder_tree, test, "fog", 2)
    problems = check_corruptions("imagenet", ["fog", "snow"], folder_tree)
    assert len(problems) == 1 and "imagenet-c/snow is missing" in problems[0]
    assert check_corruptions("imagenet", ["spatter"], folder_tree) == []


def test_download_imagenet_c_fetches_checks_and_extracts_the_five_archives(
    tmp_path,
    server,  # noqa: F811  (the fixture imported above)
    monkeypatch,
    capsys,
):
    import hashlib
    import tarfile

    from harness.data import imagenet
    from harness.data._machinery import download as dl

    published = imagenet.imagenet_c_sources()  # torch-uncertainty's URLs and md5s
    assert [u.rsplit("/", 1)[1] for u, _ in published] == [
        f"{g}.tar" for g in ("blur", "digital", "extra", "noise", "weather")
    ]
    assert published[0] == (
        "https://zenodo.org/record/2235448/files/blur.tar",
        "2d8e81fdd8e07fef67b9334fa635e45c",
    )
    served, base = server
    staging = tmp_path / "staging"
    fab.write_imagenet(staging, val_per_class=1)
    groups = {"blur": "fog", "digital": "pixelate", "extra": "spatter", "noise": "shot_noise"}
    groups["weather"] = "snow"
    served_archives = []
    for group, corruption in groups.items():
        fab.write_imagenet_c(staging, (corruption,), severities=(1, 5), size=16)
        with tarfile.open(served / f"{group}.tar", "w") as tar:  # <corruption>/ at the top
            tar.add(staging / "imagenet-c" / corruption, arcname=corruption)
        md5 = hashlib.md5((served / f"{group}.tar").read_bytes()).hexdigest()
        served_archives.append((f"https://zenodo.org/x/{group}.tar", md5))
    monkeypatch.setattr(imagenet, "imagenet_c_sources", lambda: served_archives)
    monkeypatch.setenv(dl.MIRROR_ENV, base)
    root = tmp_path / "data"
    assert main(["data", "download", "imagenet-c", "--data-root", str(root)]) == 0
    assert f"imagenet-c: ready in {root}" in capsys.readouterr().out
    assert sorted(p.name for p in (root / "imagenet-c").iterdir()) == sorted(groups.values())
    assert len(list((root / "imagenet-c" / "snow" / "5").glob("*/*.JPEG"))) == 3


# --- OpenOOD v1.5's ImageNet OOD sets -------------------------------------------------------


def test_openood_sets_read_their_imglists_in_order(tmp_path):
    lists = fab.write_openood(tmp_path, per_set=3)
    for name in fab.OPENOOD:
        spec = DATASETS.get(name)
        assert spec.num_classes is None and spec.is_available(tmp_path)
        test = spec.load(tmp_path)["test"]
        assert [f.decode() for f in test.files] == lists[name]
        assert test.labels.tolist() == [-1, -1, -1]
        (x, y), *_ = batches(test, batch_size=3)
        assert x.shape == (3, 3, 224, 224) and y.tolist() == [-1, -1, -1]
    assert DATASETS.get("openood_textures").load(tmp_path)["test"].root == (
        tmp_path / "openood" / "images_classic"
    )
    spec = DATASETS.get("openood_ninco")
    with pytest.raises(DataMissingError, match=r"test_ninco\.txt"):
        spec.require(tmp_path / "elsewhere")


# --- backbones ------------------------------------------------------------------------------


def test_resnet50_imagenet_and_its_packed_variant_have_the_imagenet_stem():
    from harness.registry import METHODS
    from methods._base import BuildContext

    net = BACKBONES.get("resnet50_imagenet").build((3, 224, 224), 1000)
    assert sum(p.numel() for p in net.parameters()) == 25_557_032  # torchvision's ResNet-50
    ctx = BuildContext("resnet50_imagenet", (3, 224, 224), 10, 2)
    spec = METHODS.get("packed_ensemble")
    packed = spec.build(ctx, spec.hparams(alpha=2, gamma=1))
    convs = [m for m in packed.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs[0].kernel_size == (7, 7) and convs[0].stride == (2, 2)
    packed.eval()
    with torch.no_grad():
        assert packed(torch.randn(1, 3, 64, 64)).shape == (2, 1, 10)


def test_vit_b16_is_timms_vit_base_patch16_224():
    net = BACKBONES.get("vit_b16").build((3, 224, 224), 1000)
    assert sum(p.numel() for p in net.parameters()) == 86_567_656
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in net.modules()) == 25


# --- suites ---------------------------------------------------------------------------------


def test_shipped_imagenet_suites_validate(capsys):
    from harness.config.includes import SuiteError
    from harness.config.parse import load_suite

    path = REPO / "suites" / "imagenet_resnet50.yaml"
    assert main(["validate", str(path), "--skip-data"]) == 0
    assert "6 cells" in capsys.readouterr().out
    vit = load_suite(REPO / "suites" / "imagenet_vit.yaml")
    assert {c.method for c in vit.cells()} == {"sigma_ens", "film_ensemble"}
    # the only problem a machine without timm's weights in its cache can have
    try:
        load_suite(REPO / "suites" / "imagenet_vit.yaml", check_files=True)
    except SuiteError as exc:
        for problem in exc.problems:
            assert "timm:vit_base_patch16_224 is not in the Hugging Face cache" in problem


def test_resnet50_suite_validates_with_its_data_present_and_lists_what_is_missing(tmp_path, capsys):
    path = str(REPO / "suites" / "imagenet_resnet50.yaml")
    assert main(["validate", path, "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "dataset 'imagenet' not found" in err and "openood_ssb_hard" in err
    assert f"{tmp_path}/imagenet-c/fog is missing" in err
    fab.write_for_suites(tmp_path)
    assert main(["validate", path, "--data-root", str(tmp_path)]) == 0
    assert "imagenet_resnet50.yaml: OK" in capsys.readouterr().out


TINY_SUITE = """
name: tiny_imagenet
grid:
  datasets: [imagenet]
  backbones:
    - name: resnet50_imagenet
      kwargs: {width_multiplier: 0.0625, input_size: 32}
  M: [2]
  seeds: [0]
  methods:
    - single
    - name: sigma_ens
      hparams: {tau: 0.5, lam: 0.05}
recipe:
  epochs: 1
  batch_size: 4
  lr: 0.01
  weight_decay: 0.0001
  schedule: constant
  eval_batch_size: 8
evaluation:
  corruptions: [all]
  severities: [1]
  ood: [openood_ninco, openood_textures]
  cost: false
"""


def test_tiny_imagenet_suite_end_to_end_through_the_cli(tmp_path, write_suite):
    from harness.data._machinery.corruption_sets import CORRUPTIONS

    data = tmp_path / "data"
    fab.write_imagenet(data, layout="torchvision")
    fab.write_imagenet_c(data, CORRUPTIONS, severities=(1,))
    fab.write_openood(data)
    suite = write_suite(TINY_SUITE)
    res = tmp_path / "res"
    args = ["run", str(suite), "--data-root", str(data), "--results", str(res)]
    assert main([*args, "--executor", "inprocess", "--threads", "1", "-q"]) == 0
    records = [json.loads(p.read_text()) for p in sorted(res.glob("*/*/record.json"))]
    assert sorted(r["config"]["method"] for r in records) == ["sigma_ens", "single"]
    for rec in records:
        assert rec["status"] == "done", rec.get("error")
        m = rec["metrics"]
        assert 0.0 <= m["clean"]["acc"] <= 1.0 and np.isfinite(m["clean"]["nll"])
        corr = m["corruption"]
        assert len(corr["cells"]) == 15 and corr["mean_corruptions"] == list(CORRUPTIONS)
        assert "imagenet-c" in corr["corruption_mean_over"]
        assert 0.0 <= corr["mean"]["acc"] <= 1.0
        members = 2 if rec["config"]["method"] == "sigma_ens" else 1
        assert len(m["clean"]["members"]["acc"]) == members
        assert set(m["ood"]) == {"openood_ninco", "openood_textures"}
        for scores in m["ood"].values():
            assert set(scores) >= {"msp", "entropy"}
            for s in scores.values():
                assert 0.0 <= s["auroc"] <= 1.0 and 0.0 <= s["fpr95"] <= 1.0
                assert 0.0 < s["aupr_in"] <= 1.0  # 6 in-distribution vs 3 OOD images


def test_image_transform_keeps_pre_cropped_images_and_resizes_others(tmp_path):
    fab._jpeg(tmp_path / "a.jpg", np.random.default_rng(0), 224, 224)
    fab._jpeg(tmp_path / "b.jpg", np.random.default_rng(1), 300, 400)
    t = ImageTransform(size=224, resize=224, pre_cropped=True)
    a, b = t(str(tmp_path / "a.jpg"), None), t(str(tmp_path / "b.jpg"), None)
    assert a.shape == b.shape == (3, 224, 224) and a.dtype == torch.uint8
    with Image.open(tmp_path / "a.jpg") as im:
        assert torch.equal(a, torch.from_numpy(np.array(im)).permute(2, 0, 1))
    seeded = [t(str(tmp_path / "b.jpg"), 7), t(str(tmp_path / "b.jpg"), 7)]
    assert torch.equal(*seeded) and not torch.equal(seeded[0], t(str(tmp_path / "b.jpg"), 8))
