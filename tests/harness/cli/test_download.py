"""``harness data download`` against a local HTTP server (127.0.0.1, http.server in a thread)
serving archives fabricated in the published formats: success with the md5 checked, a checksum
mismatch, an unreachable server, reuse of a complete archive, unsafe archive members; both SVHN
layouts and the corruption sets in ``harness ls``. No test touches the internet."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import shutil
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.data._machinery import download as dl
from harness.data._machinery.corruption_sets import check_corruptions
from harness.registry import DATASETS
from tests import fabricate


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output to the harness's own
        pass


@pytest.fixture
def server(tmp_path):
    """(folder served, base URL) of an HTTP server on 127.0.0.1 for this test only."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(_Quiet, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # A client that stops reading (torchvision's downloader after an error) makes the serving
    # thread print a traceback to stderr, which the tests read as the harness's output.
    httpd.handle_error = lambda request, client_address: None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _cifar10_c_tar(tmp_path: Path, served: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """CIFAR-10-C.tar as published: a top folder CIFAR-10-C/ of <corruption>.npy + labels.npy."""
    staging = tmp_path / "staging"
    arrays, labels = fabricate.write_cifar_c(staging, corruptions=("gaussian_noise", "fog"), n=4)
    archive = served / "CIFAR-10-C.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(staging / "CIFAR-10-C", arcname="CIFAR-10-C")
    return archive, {**arrays, "labels": labels}


def _serve_as(monkeypatch, name: str, base_url: str, md5: str) -> None:
    """Point one archive's download at the local server with the given md5 (published URL and
    md5 stay in the code; only this test's copy is replaced)."""
    monkeypatch.setitem(dl.ARCHIVES, name, dl.Archive(dl.ARCHIVES[name].url, md5))
    monkeypatch.setenv(dl.MIRROR_ENV, base_url)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: connecting to it is refused


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_published_urls_and_md5s_stay_in_the_code():
    assert dl.ARCHIVES["cifar10-c"].url == "https://zenodo.org/record/2535967/files/CIFAR-10-C.tar"
    assert dl.ARCHIVES["cifar100-c"].md5 == "11f0ed0f1191edbf9fa23466ae6021d3"
    assert dl.ARCHIVES["tinyimagenet"].filename == "tiny-imagenet-200.zip"
    assert {"cifar10-c", "cifar100-c", "tinyimagenet"} <= set(dl.downloadable())


def test_download_checks_the_md5_extracts_and_shows_progress(tmp_path, server, monkeypatch, capsys):
    served, base = server
    archive, arrays = _cifar10_c_tar(tmp_path, served)
    _serve_as(monkeypatch, "cifar10-c", base, _md5(archive))
    root = tmp_path / "data"

    assert main(["data", "download", "cifar10-c", "--data-root", str(root)]) == 0
    out = capsys.readouterr()
    assert f"downloading {base}/CIFAR-10-C.tar" in out.out
    assert f"cifar10-c: ready in {root}" in out.out
    # torchvision's tqdm bar: the byte count reached the archive's size.
    assert "100%" in out.err
    for name, array in arrays.items():
        np.testing.assert_array_equal(np.load(root / "CIFAR-10-C" / f"{name}.npy"), array)
    assert sorted(p.name for p in root.iterdir()) == ["CIFAR-10-C"]  # archive and .part gone
    assert check_corruptions("cifar10", ["gaussian_noise", "fog"], root) == []


def test_checksum_mismatch_names_file_and_md5s_and_keeps_the_file_apart(
    tmp_path, server, monkeypatch, capsys
):
    served, base = server
    archive, _ = _cifar10_c_tar(tmp_path, served)
    expected = "0" * 32
    _serve_as(monkeypatch, "cifar10-c", base, expected)
    root = tmp_path / "data"

    assert main(["data", "download", "cifar10-c", "--data-root", str(root)]) == 2
    lines = _err_lines(capsys)
    error = [line for line in lines if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in "\n".join(lines)
    assert f"checksum mismatch for CIFAR-10-C.tar from {base}/CIFAR-10-C.tar" in error[0]
    assert f"expected md5 {expected}, got {_md5(archive)}" in error[0]
    bad = root / "CIFAR-10-C.tar.corrupt"
    assert str(bad) in error[0]
    assert bad.read_bytes() == archive.read_bytes()  # kept apart, intact, for inspection
    assert sorted(p.name for p in root.iterdir()) == [bad.name]  # nothing extracted


def test_unreachable_server_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    port = _closed_port()
    _serve_as(monkeypatch, "cifar100-c", f"http://127.0.0.1:{port}", "0" * 32)
    root = tmp_path / "data"

    assert main(["data", "download", "cifar100-c", "--data-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(
        f"error: could not download cifar100-c (http://127.0.0.1:{port}/CIFAR-100-C.tar) "
        f"into {root}: "
    )
    assert "refused" in err.lower()
    assert "no internet access: run `harness data download cifar100-c --data-root DIR`" in err
    assert list(root.iterdir()) == []  # no partial file left under any name


def test_a_complete_archive_on_disk_is_reused_without_network(tmp_path, monkeypatch, capsys):
    served = tmp_path / "served"
    served.mkdir()
    archive, arrays = _cifar10_c_tar(tmp_path, served)
    root = tmp_path / "data"
    root.mkdir()
    shutil.copy(archive, root / archive.name)  # e.g. extraction was interrupted last time
    _serve_as(monkeypatch, "cifar10-c", f"http://127.0.0.1:{_closed_port()}", _md5(archive))

    assert main(["data", "download", "cifar10-c", "--data-root", str(root)]) == 0
    assert "downloading" not in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(root / "CIFAR-10-C" / "fog.npy"), arrays["fog"])


def test_a_stale_partial_transfer_is_fetched_again(tmp_path, server, monkeypatch):
    served, base = server
    archive, arrays = _cifar10_c_tar(tmp_path, served)
    _serve_as(monkeypatch, "cifar10-c", base, _md5(archive))
    root = tmp_path / "data"
    root.mkdir()
    (root / "CIFAR-10-C.tar.part").write_bytes(archive.read_bytes()[:100])  # interrupted run

    dl.download("cifar10-c", root)
    np.testing.assert_array_equal(
        np.load(root / "CIFAR-10-C" / "labels.npy"), arrays["labels"].astype(np.uint8)
    )
    assert not (root / "CIFAR-10-C.tar.part").exists()


def test_tinyimagenet_zip_is_fetched_and_recognised(tmp_path, server, monkeypatch):
    served, base = server
    staging = tmp_path / "staging"
    fabricate.write_tinyimagenet(staging)
    archive = served / "tiny-imagenet-200.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted((staging / "tiny-imagenet-200").rglob("*")):
            z.write(path, path.relative_to(staging).as_posix())
    _serve_as(monkeypatch, "tinyimagenet", base, _md5(archive))
    root = tmp_path / "data"

    dl.download("tinyimagenet", root)
    spec = DATASETS.get("tinyimagenet")
    assert spec.is_available(root)
    assert torch.equal(spec.load(root)["test"].images, spec.load(staging)["test"].images)


def test_an_archive_member_outside_the_root_is_refused(tmp_path, server, monkeypatch):
    served, base = server
    archive = served / "CIFAR-10-C.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../escaped.npy")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    _serve_as(monkeypatch, "cifar10-c", base, _md5(archive))
    root = tmp_path / "data"

    with pytest.raises(dl.DownloadError, match=r"could not extract .*CIFAR-10-C\.tar"):
        dl.download("cifar10-c", root)
    assert not (tmp_path / "escaped.npy").exists()


def test_unknown_name_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["data", "download", "cifar11", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: nothing to download for 'cifar11'; choose from ")


def test_unwritable_data_root_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(dl.DownloadError, match=r"cannot write the data root .*--data-root DIR"):
        dl.download("cifar10-c", blocker / "data")


@pytest.mark.parametrize("nested", [True, False], ids=["svhn-subfolder", "torchvision-root"])
def test_both_svhn_layouts_are_read(tmp_path, nested):
    images, digits = fabricate.write_svhn(tmp_path / "written")
    root = tmp_path / "data"
    target = root / "svhn" if nested else root  # torchvision's SVHN(root) writes root/
    target.mkdir(parents=True)
    shutil.move(tmp_path / "written" / "svhn" / "test_32x32.mat", target / "test_32x32.mat")

    spec = DATASETS.get("svhn")
    assert spec.is_available(root)
    assert spec.location(root) == target / "test_32x32.mat"
    test = spec.load(root)["test"]
    assert torch.equal(test.images, torch.from_numpy(images))
    assert torch.equal(test.labels, torch.from_numpy(digits))


def test_missing_svhn_names_the_download_layout(tmp_path):
    spec = DATASETS.get("svhn")
    assert not spec.is_available(tmp_path)
    assert spec.location(tmp_path) == tmp_path / "svhn" / "test_32x32.mat"


def test_ls_lists_the_corruption_sets(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    listing = out.split("corruption sets:\n", 1)[1].splitlines()
    names = {line.split()[0] for line in listing if line.startswith("  ")}
    assert {"cifar10-c", "cifar100-c", "digits"} <= names
    c100 = next(line for line in listing if line.split()[0] == "cifar100-c")
    assert "15 benchmark + 4 extra corruptions × 5 severities" in c100
    assert "CIFAR-100-C/ for cifar100" in c100
    assert "`harness data download cifar100-c`" in c100


def test_torchvision_md5_failure_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import torchvision.datasets.cifar as tv_cifar

    def corrupted(*args, **kwargs):  # what download_url raises after a failed md5 check
        raise RuntimeError("File not found or corrupted.")

    monkeypatch.setattr(tv_cifar, "download_and_extract_archive", corrupted)
    assert main(["data", "download", "cifar100", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"error: could not download cifar100 (torchvision CIFAR100) into {tmp_path}: File not "
        "found or corrupted. (the file failed torchvision's md5 check"
    )


def test_several_names_stop_at_the_first_failure_and_name_those_not_fetched(
    tmp_path, capsys, monkeypatch
):
    """Issue 48: a command that finishes partly says so. ``download a b c`` where b fails: a is
    ready, b's error line, then one line naming b and c (not fetched), exit 2."""
    fetched = []

    def fake(name, root):
        if name == "mnist":
            raise dl.DownloadError("could not download mnist (offline)")
        fetched.append(name)
        return root

    monkeypatch.setattr(dl, "download", fake)
    argv = ["data", "download", "cifar10", "mnist", "svhn", "--data-root", str(tmp_path)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert fetched == ["cifar10"]
    assert out == f"cifar10: ready in {tmp_path}\n"
    assert err.splitlines() == [
        "error: could not download mnist (offline)",
        "not fetched: mnist svhn (ready: cifar10)",
    ]


def test_a_dataset_prepared_by_hand_does_not_stop_the_names_after_it(tmp_path, capsys):
    """`download imagenet openood_ninco cifar10`: both preparation texts print (the README says
    so), cifar10 still downloads (faked here), the last line names the two not fetched, exit 2."""
    fetched = []

    def fake(name, root):
        if name in ("imagenet", "openood_ninco"):
            print(f"commands to prepare {name}")
            raise dl.PrepareByHand(f"{name} cannot be downloaded here: prepare it")
        fetched.append(name)
        return root

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dl, "download", fake)
        argv = ["data", "download", "imagenet", "openood_ninco", "cifar10"]
        assert main([*argv, "--data-root", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert fetched == ["cifar10"]
    assert out.splitlines() == [
        "commands to prepare imagenet",
        "commands to prepare openood_ninco",
        f"cifar10: ready in {tmp_path}",
    ]
    assert err.splitlines()[-1] == "not fetched: imagenet openood_ninco (ready: cifar10)"
