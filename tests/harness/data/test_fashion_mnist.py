"""Fashion-MNIST: the IDX reader on files fabricated in the published format (plain and gzipped,
torchvision's layout and Debian's folder), its md5 and format errors, the missing-data message
and `harness validate`'s exit status, the real Debian files when installed, and the 28×28 CNN
built by every method."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.config.suite import expand_hparams
from harness.data import fashion_mnist as fm
from harness.data._machinery.base import DataFileError, DataMissingError
from harness.registry import DATASETS, METHODS
from methods._base import BuildContext
from tests import fabricate

REAL = fm.DEBIAN_DIR
HAS_REAL = all((REAL / f"{name}.gz").is_file() for name in fm.FILES)
needs_real = pytest.mark.skipif(
    not HAS_REAL,
    reason=f"Debian's {fm.APT_PACKAGE} is not installed ({REAL}); "
    f"`apt-get install {fm.APT_PACKAGE}` (.ci/run installs it)",
)


@pytest.fixture
def no_debian(monkeypatch):
    """Hide the Debian location: only the data root counts."""
    monkeypatch.setenv(fm.DEBIAN_DIR_ENV, "")


def _accept(monkeypatch, written: dict) -> None:
    """Make the fabricated files' content md5s the expected ones (the real ones cannot match)."""
    md5s = {**written["train"][2], **written["test"][2]}
    monkeypatch.setattr(fm, "CONTENT_MD5", md5s)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
def test_torchvision_layout_reads_back_pixel_for_pixel(tmp_path, monkeypatch, no_debian, gz):
    written = fabricate.write_fashion_mnist(tmp_path / "FashionMNIST" / "raw", gz=gz)
    _accept(monkeypatch, written)
    out = DATASETS.get("fashion_mnist").load(tmp_path)
    for split in ("train", "test"):
        images, labels, _ = written[split]
        assert out[split].images.shape == (len(labels), 1, 28, 28)
        assert out[split].images.dtype == torch.uint8
        np.testing.assert_array_equal(out[split].images.numpy(), images)
        np.testing.assert_array_equal(out[split].labels.numpy(), labels)


def test_debian_folder_is_found_through_the_variable(tmp_path, monkeypatch):
    deb = tmp_path / "deb"
    written = fabricate.write_fashion_mnist(deb, gz=True)
    _accept(monkeypatch, written)
    monkeypatch.setenv(fm.DEBIAN_DIR_ENV, str(deb))
    spec = DATASETS.get("fashion_mnist")
    spec.require(tmp_path / "empty-root")
    assert spec.location(tmp_path / "empty-root") == deb
    out = spec.load(tmp_path / "empty-root")
    np.testing.assert_array_equal(out["test"].labels.numpy(), written["test"][1])


def test_a_file_that_is_not_the_published_one_fails_its_content_md5(
    tmp_path, monkeypatch, no_debian
):
    raw = tmp_path / "FashionMNIST" / "raw"
    written = fabricate.write_fashion_mnist(raw, gz=True)
    _accept(monkeypatch, written)
    expected = dict(fm.CONTENT_MD5)
    expected["t10k-labels-idx1-ubyte"] = "0" * 32  # as if the published file were another
    monkeypatch.setattr(fm, "CONTENT_MD5", expected)
    with pytest.raises(DataFileError, match=r"t10k-labels-idx1-ubyte\.gz: damaged data file "
                       r"\(content md5 [0-9a-f]{32}, expected 0{32}") as err:  # fmt: skip
        DATASETS.get("fashion_mnist").require(tmp_path)
    assert "apt-get install --reinstall dataset-fashion-mnist" in str(err.value)
    assert "harness data download fashion_mnist" in str(err.value)


def _idx_bytes(magic: bytes, dims: tuple[int, ...], body: bytes) -> bytes:
    return magic + struct.pack(f">{len(dims)}i", *dims) + body


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x1f\x8b\x08\x00junk", r"not an IDX file \(the first two bytes must be zero\)"),
        (_idx_bytes(b"\x00\x00\x0d\x03", (2, 28, 28), bytes(8 * 2 * 784)), r"IDX type 0x0d"),
        (_idx_bytes(b"\x00\x00\x08\x01", (2,), bytes(2)), r"with 1 dimensions, expected .* 3"),
        (_idx_bytes(b"\x00\x00\x08\x03", (2, 28, 28), bytes(784)), r"header \(2, 28, 28\)"),
        (b"\x00\x00\x08\x03\x00\x00", r"IDX header truncated \(6 bytes\)"),
    ],
    ids=["gzip-bytes-unzipped", "float-type", "labels-as-images", "short-data", "short-head"],
)
def test_idx_format_errors_name_the_file(tmp_path, monkeypatch, no_debian, content, message):
    raw = tmp_path / "FashionMNIST" / "raw"
    fabricate.write_fashion_mnist(raw)
    bad = raw / "train-images-idx3-ubyte"
    bad.write_bytes(content)
    monkeypatch.setattr(fm, "_checked", lambda path, name, fetch: fm.read_content(path, fetch))
    with pytest.raises(DataFileError, match=message) as err:
        DATASETS.get("fashion_mnist").load(tmp_path)
    assert Path(err.value.path) == bad


def test_a_truncated_gzip_file_is_damaged(tmp_path, monkeypatch, no_debian):
    raw = tmp_path / "FashionMNIST" / "raw"
    written = fabricate.write_fashion_mnist(raw, gz=True)
    _accept(monkeypatch, written)
    path = raw / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte\.gz: damaged data file "
                       r"\(EOFError"):  # fmt: skip
        DATASETS.get("fashion_mnist").load(tmp_path)


def test_missing_data_names_the_package_and_the_download(tmp_path, no_debian):
    with pytest.raises(DataMissingError) as err:
        DATASETS.get("fashion_mnist_10k").require(tmp_path)
    text = str(err.value)
    assert text.startswith("dataset 'fashion_mnist_10k' not found: looked for ")
    assert str(tmp_path / "FashionMNIST" / "raw") in text
    assert "`apt-get install dataset-fashion-mnist`" in text
    assert "`harness data download fashion_mnist`" in text


def test_validate_exits_2_naming_both_ways(tmp_path, no_debian, write_suite, capsys):
    suite = write_suite(
        "name: fm\ngrid:\n  datasets: [fashion_mnist]\n  backbones: [fmnist_cnn]\n"
        "  methods: [single]\n  M: [1]\n  seeds: [0]\n"
    )
    assert main(["validate", str(suite), "--data-root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "apt-get install dataset-fashion-mnist" in err
    assert "harness data download fashion_mnist" in err


def test_download_uses_torchvision_into_the_read_layout(tmp_path, monkeypatch, no_debian):
    """``harness data download fashion_mnist`` → torchvision's FashionMNIST with its download
    flag on (stubbed here: no network), for both splits under the data root, which is the
    folder the loader reads first."""
    from torchvision import datasets

    calls = []

    def fake_init(self, root, train=True, download=False, **kw):
        calls.append((Path(root), train, download))
        fabricate.write_fashion_mnist(Path(root) / "FashionMNIST" / "raw", gz=True)

    monkeypatch.setattr(datasets.FashionMNIST, "__init__", fake_init)
    assert main(["data", "download", "fashion_mnist", "--data-root", str(tmp_path)]) == 0
    assert calls == [(tmp_path, True, True), (tmp_path, False, True)]
    assert fm.locate(tmp_path)[fm.TRAIN_IMAGES].parent == tmp_path / "FashionMNIST" / "raw"


@needs_real
def test_real_debian_files_pass_their_content_md5():
    for name in fm.FILES:
        with gzip.open(REAL / f"{name}.gz", "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == fm.CONTENT_MD5[name]


@needs_real
def test_real_files_load_with_published_sizes_and_statistics(tmp_path, monkeypatch):
    monkeypatch.delenv(fm.DEBIAN_DIR_ENV, raising=False)
    spec = DATASETS.get("fashion_mnist")
    spec.require(tmp_path)  # an empty data root: the Debian copy is used
    full = spec.load(tmp_path)
    assert full["train"].images.shape == (60_000, 1, 28, 28)
    assert full["test"].images.shape == (10_000, 1, 28, 28)
    assert full["train"].labels.bincount().tolist() == [6000] * 10
    assert full["test"].labels.bincount().tolist() == [1000] * 10
    x = full["train"].images.float() / 255
    assert (x.mean().item(), x.std().item()) == pytest.approx((spec.mean[0], spec.std[0]), abs=5e-5)
    sub_spec = DATASETS.get("fashion_mnist_10k")
    sub = sub_spec.load(tmp_path)
    assert sub["train"].labels.bincount().tolist() == [1000] * 10
    assert sub["test"] is full["test"]
    xs = sub["train"].images.float() / 255
    assert (xs.mean().item(), xs.std().item()) == pytest.approx(
        (sub_spec.mean[0], sub_spec.std[0]), abs=5e-5
    )
    # Fixed subset: the same indices every call, and they are rows of the full training set.
    idx = fm.subset_indices(full["train"].labels)
    assert torch.equal(idx, fm.subset_indices(full["train"].labels))
    assert torch.equal(sub["train"].images, full["train"].images[idx])


# --------------------------------------------------------------------------------------------
# The 28×28 CNN under every method


def test_fmnist_cnn_shapes_and_parameter_count():
    from harness.registry import BACKBONES

    net = BACKBONES.get("fmnist_cnn").build((1, 28, 28), 10)
    assert sum(p.numel() for p in net.parameters()) == 14_458
    feats = net.features[:4](torch.zeros(2, 1, 28, 28))
    assert feats.shape == (2, 16, 14, 14)
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    wide = BACKBONES.get("fmnist_cnn").build((1, 28, 28), 10, width=32)
    assert wide.head.in_features == 64


@pytest.mark.parametrize("name", [n for n in METHODS.names() if n != "sigma_convert"])
def test_every_method_builds_the_28x28_cnn(name):
    """The ``cnn``-family builders give each method its variant of *this* network: both
    max-pools are there (the digits CNN has one), and eval gives (M, B, K)."""
    spec = METHODS.get(name)
    m = 1 if METHODS.get(name).max_members == 1 else 4
    hp = spec.hparams(**expand_hparams(spec, {})[0])
    torch.manual_seed(0)
    model = spec.build(BuildContext("fmnist_cnn", (1, 28, 28), 10, m), hp)
    pools = [mod for mod in model.modules() if isinstance(mod, torch.nn.MaxPool2d)]
    assert len(pools) in (2, 2 * m)  # one network, or M members (deep ensemble)
    model.eval()
    with torch.no_grad():
        assert model(torch.zeros(3, 1, 28, 28)).shape == (m, 3, 10)


# --------------------------------------------------------------------------------------------
# Corruptions


def test_all_corruptions_are_cifar_cs_transforms_that_fit_28x28_grey():
    from harness.data._machinery.corruption_sets import CORRUPTIONS, resolve_corruptions

    expected = [c for c in CORRUPTIONS if c not in ("glass_blur", "elastic_transform")]
    for name in ("fashion_mnist", "fashion_mnist_10k"):
        assert resolve_corruptions(name, ["all"]) == expected


def test_the_subset_shares_the_full_sets_generated_copies(tmp_path, monkeypatch, no_debian):
    from harness.data._machinery.corruptions import corrupted_split

    written = fabricate.write_fashion_mnist(tmp_path / "FashionMNIST" / "raw", n_test=6)
    _accept(monkeypatch, written)
    test = DATASETS.get("fashion_mnist").load(tmp_path)["test"]
    a = corrupted_split("fashion_mnist_10k", tmp_path, test, "brightness", 3)
    assert sorted(p.name for p in (tmp_path / "generated-c").iterdir()) == ["fashion_mnist"]
    b = corrupted_split("fashion_mnist", tmp_path, test, "brightness", 3)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, test.images)


# --------------------------------------------------------------------------------------------
# The published benchmark networks and ResNet-18 at 28×28


@pytest.mark.parametrize(
    ("name", "params"), [("tf_tutorial_cnn", 3_274_634), ("keras_conv_bn_cnn", 1_694_186)]
)
def test_benchmark_networks_have_the_published_parameter_counts(name, params):
    from harness.registry import BACKBONES

    net = BACKBONES.get(name).build((1, 28, 28), 10)
    assert sum(p.numel() for p in net.parameters()) == params  # convnet.py / the notebook
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    biases = [m.bias for m in net.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    assert all(torch.count_nonzero(b) == 0 for b in biases)  # Keras/TF initialisation
    with pytest.raises(ValueError, match=r"is for 28×28 inputs, got \(1, 32, 32\)"):
        BACKBONES.get(name).build((1, 32, 32), 10)


@pytest.mark.parametrize("name", ["single", "deep_ensemble", "mc_dropout"])
def test_plain_benchmark_networks_build_under_the_methods_that_take_any_network(name):
    spec = METHODS.get(name)
    m = 1 if METHODS.get(name).max_members == 1 else 2
    hp = spec.hparams(**expand_hparams(spec, {})[0])
    model = spec.build(BuildContext("tf_tutorial_cnn", (1, 28, 28), 10, m), hp)
    model.eval()
    with torch.no_grad():
        assert model(torch.zeros(3, 1, 28, 28)).shape == (m, 3, 10)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_builds_resnet18_for_28x28_grey(name):
    spec = METHODS.get(name)
    m = 1 if METHODS.get(name).max_members == 1 else 2
    hp = spec.hparams(**expand_hparams(spec, {})[0])
    torch.manual_seed(0)
    model = spec.build(BuildContext("resnet18", (1, 28, 28), 10, m), hp)
    model.eval()
    with torch.no_grad():
        assert model(torch.zeros(2, 1, 28, 28)).shape == (m, 2, 10)


# --------------------------------------------------------------------------------------------
# The suites


SUITES = Path(__file__).resolve().parents[3] / "suites"


@pytest.mark.slow
@needs_real
@pytest.mark.parametrize("suite", ["fashion_mnist.yaml", "reproduce/fashion_mnist_readme.yaml"])
def test_suites_validate_with_the_debian_files_and_no_download(tmp_path, monkeypatch, suite):
    monkeypatch.delenv(fm.DEBIAN_DIR_ENV, raising=False)
    assert main(["validate", str(SUITES / suite), "--data-root", str(tmp_path)]) == 0


@pytest.mark.slow
def test_suite_without_the_data_names_the_package_and_the_download(tmp_path, no_debian, capsys):
    code = main(["validate", str(SUITES / "fashion_mnist.yaml"), "--data-root", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "dataset 'fashion_mnist_10k' not found" in err
    assert "`apt-get install dataset-fashion-mnist`" in err
    assert "`harness data download fashion_mnist`" in err


def test_published_values_of_the_reproduction_parse_and_cite_the_readme():
    from reports.render.published import read_published

    rows = read_published(SUITES / "reproduce" / "fashion_mnist_readme.published.csv")
    assert dict(zip(rows["backbone"], rows["value"])) == {
        "tf_tutorial_cnn": 0.916,
        "keras_conv_bn_cnn": 0.934,
    }
    readme = (
        "https://github.com/zalandoresearch/fashion-mnist/blob/"
        "b2617bb6d3ffa2e429640350f613e3291e10b141/README.md#benchmark row "
    )
    # The page shows the source beside the difference: it names the row and the known cause.
    assert all(s.startswith(readme) and " — " in s for s in rows["source"])
