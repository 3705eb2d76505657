"""The generated corruption cache under the data root: a damaged file is set aside, named in one
warning line and generated again (the cell's evaluation goes on); concurrent processes
regenerating it do not spoil each other's files; every file follows the umask."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.contract.errors import DamagedFile
from harness.data._machinery import corruptions as cc
from harness.data._machinery.base import DataFileError, ImageSet
from harness.data.digits import load_digits_splits
from harness.storage import safe_files
from tests import fabricate
from tests.conftest import REPO

DATASET = "digits"  # grey 8×8: every transform is quick


def _test(n: int = 12) -> ImageSet:
    test = load_digits_splits()["test"]
    return ImageSet(test.images[:n], test.labels[:n])


def _cache(root: Path, corruption: str) -> Path:
    return root / "generated-c" / DATASET / f"{corruption}.npy"


def _damage_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "damaged corruption cache" in r.getMessage()
    ]


def _set_aside(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f"{name}.damaged-*"))


def _rewrite(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:  # in place, as a bad disk or a stray tool would
        np.save(f, arr)


# What the tester did, and the other ways a cache file can be unusable: (corruption, damage,
# the reason the warning gives for 12 digits: 60 rows of 8×8×1).
DAMAGES = {
    "truncated": (
        "frost",
        lambda p: os.truncate(p, 500),
        "truncated or not a whole .npy file (ValueError: mmap length is greater than file size)",
    ),
    "garbage": (
        "fog",
        lambda p: p.write_bytes(b"garbage!" * 200),
        "not a .npy array file (it starts with b'garbag')",
    ),
    "empty": ("shot_noise", lambda p: p.write_bytes(b""), "empty (0 bytes)"),
    "header_cut": (
        "shot_noise",
        lambda p: os.truncate(p, 100),
        "truncated or not a whole .npy file (ValueError: EOF: reading array header, expected "
        "118 bytes got 90)",
    ),
    "wrong_dtype": (
        "shot_noise",
        lambda p: _rewrite(p, np.load(p).astype(np.float32)),
        "holds float32 (60, 8, 8, 1), not uint8 (60, 8, 8, 1)",
    ),
    "wrong_shape": (
        "shot_noise",
        lambda p: _rewrite(p, np.load(p)[:-5]),
        "holds uint8 (55, 8, 8, 1), not uint8 (60, 8, 8, 1)",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_cache_file_is_set_aside_named_and_generated_again(
    tmp_path, caplog, monkeypatch, damage
):
    corruption, spoil, reason = DAMAGES[damage]
    test, root = _test(), tmp_path / "data"
    first = cc.corrupted_split(DATASET, root, test, corruption, 3)  # the cache, freshly made
    path = _cache(root, corruption)
    fresh = path.read_bytes()
    spoil(path)
    damaged = path.read_bytes()
    assert damaged != fresh

    with caplog.at_level(logging.WARNING, logger="harness"):
        again = cc.corrupted_split(DATASET, root, test, corruption, 3)  # the cell's evaluation

    assert torch.equal(again.images, first.images) and torch.equal(again.labels, first.labels)
    assert path.read_bytes() == fresh  # regenerated bit for bit
    (moved,) = _set_aside(path.parent, path.name)
    assert re.fullmatch(rf"{corruption}\.npy\.damaged-\d{{8}}T\d{{6}}Z", moved.name)
    assert moved.read_bytes() == damaged  # kept as it was, never deleted
    assert _damage_warnings(caplog) == [
        f"{path}: damaged corruption cache ({reason}); moved to {moved.name}; generating it again"
    ]
    assert not list(path.parent.glob(".*.tmp"))

    # The regenerated file is the cache from now on: read, not made again, nothing more named.
    caplog.clear()
    monkeypatch.setattr(cc, "corrupt_images", lambda *a, **k: pytest.fail("regenerated"))
    with caplog.at_level(logging.WARNING, logger="harness"):
        other = cc.corrupted_split(DATASET, root, test, corruption, 5)
    assert other.images.shape == first.images.shape and not _damage_warnings(caplog)
    assert _set_aside(path.parent, path.name) == [moved]


def test_an_unreadable_fingerprint_is_set_aside_named_and_the_cache_made_again(tmp_path, caplog):
    test, root = _test(), tmp_path / "data"
    cc.corrupted_split(DATASET, root, test, "shot_noise", 1)
    folder = root / "generated-c" / DATASET
    fresh = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(fresh) == ["labels.npy", "shot_noise.npy", "source.json"]
    (folder / "source.json").write_bytes(b'{"sha256": "ab')  # cut mid-write by another tool

    with caplog.at_level(logging.WARNING, logger="harness"):
        cc.corrupted_split(DATASET, root, test, "shot_noise", 1)

    (moved,) = _set_aside(folder, "source.json")
    assert moved.read_bytes() == b'{"sha256": "ab'
    (line,) = _damage_warnings(caplog)
    assert line.startswith(f"{folder / 'source.json'}: damaged corruption cache (not a JSON ")
    assert line.endswith(f"; moved to {moved.name}; generating it again")
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p != moved} == fresh


def test_a_file_another_process_set_aside_first_is_not_moved_twice(tmp_path, caplog, monkeypatch):
    """Two processes found the same damaged file: the other one moved it between this one's
    judgement and its rename; this one generates without moving or naming anything."""
    test, root = _test(), tmp_path / "data"
    cc.corrupted_split(DATASET, root, test, "shot_noise", 2)
    path = _cache(root, "shot_noise")
    fresh = path.read_bytes()
    os.truncate(path, 500)
    real = cc.set_aside

    def other_process_first(p, *args, **kwargs):
        real(p, stamp="20000101T000000Z")  # the other process's rename
        return real(p, *args, **kwargs)

    monkeypatch.setattr(cc, "set_aside", other_process_first)
    with caplog.at_level(logging.WARNING, logger="harness"):
        cc.corrupted_split(DATASET, root, test, "shot_noise", 2)
    assert [p.name for p in _set_aside(path.parent, path.name)] == [
        "shot_noise.npy.damaged-20000101T000000Z"
    ]
    assert path.read_bytes() == fresh and not _damage_warnings(caplog)


def test_a_fresh_copy_landing_before_the_rename_is_put_back_and_used(tmp_path, caplog, monkeypatch):
    """The other process moved the damaged file and wrote its fresh copy between this one's
    judgement and its rename: this one moves the fresh copy, sees it is not the file it judged,
    puts it back and reads it (no second .damaged file, nothing generated again)."""
    test, root = _test(), tmp_path / "data"
    cc.corrupted_split(DATASET, root, test, "shot_noise", 2)
    path = _cache(root, "shot_noise")
    fresh = path.read_bytes()
    os.truncate(path, 500)
    real = cc.set_aside

    def fresh_copy_first(p, *args, **kwargs):
        real(p, stamp="20000101T000000Z")
        cc._atomic_write(p, lambda f: f.write(fresh))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(cc, "set_aside", fresh_copy_first)
    monkeypatch.setattr(cc, "corrupt_images", lambda *a, **k: pytest.fail("regenerated"))
    with caplog.at_level(logging.WARNING, logger="harness"):
        out = cc.corrupted_split(DATASET, root, test, "shot_noise", 2)
    assert [p.name for p in _set_aside(path.parent, path.name)] == [
        "shot_noise.npy.damaged-20000101T000000Z"
    ]
    assert path.read_bytes() == fresh and not _damage_warnings(caplog)
    assert out.images.shape == test.images.shape


def test_a_damaged_file_on_a_read_only_data_root_is_named_with_why(tmp_path, monkeypatch):
    test, root = _test(), tmp_path / "data"
    cc.corrupted_split(DATASET, root, test, "shot_noise", 2)
    path = _cache(root, "shot_noise")
    path.write_bytes(b"junk" * 50)

    def read_only(p, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(cc, "set_aside", read_only)
    with pytest.raises(DamagedFile, match=r"could not move it aside") as info:
        cc.corrupted_split(DATASET, root, test, "shot_noise", 2)
    assert str(info.value).startswith(
        f"{path}: not a .npy array file (it starts with b'junkju'); could not move it aside ("
    )
    assert path.read_bytes() == b"junk" * 50


def test_a_damaged_published_file_is_named_with_the_fetch_command(tmp_path):
    fabricate.write_cifar_c(tmp_path, n=4)
    published = tmp_path / "CIFAR-10-C" / "gaussian_noise.npy"
    os.truncate(published, 500)
    with pytest.raises(DataFileError, match=r"download cifar10-c") as info:
        cc.read_cifar_c(tmp_path, "cifar10-c", "gaussian_noise", 1)
    assert str(info.value) == (
        f"{published}: damaged data file (truncated or not a whole .npy file (ValueError: mmap "
        "length is greater than file size)); delete it and fetch it again with `harness data "
        "download cifar10-c`"
    )


@pytest.mark.parametrize(
    ("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)], ids=oct
)
def test_cache_files_follow_the_umask(tmp_path, umask, mode):
    test, root = _test(), tmp_path / "data"
    folder = root / "generated-c" / DATASET

    def modes() -> dict[str, int]:
        return {
            p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if ".damaged-" not in p.name
        }

    expected = {"labels.npy": mode, "shot_noise.npy": mode, "source.json": mode}
    old = os.umask(umask)
    try:
        cc.corrupted_split(DATASET, root, test, "shot_noise", 1)
        assert modes() == expected
        assert folder.stat().st_mode & 0o777 == 0o777 & ~umask
        os.truncate(folder / "shot_noise.npy", 500)
        cc.corrupted_split(DATASET, root, test, "shot_noise", 1)  # a regenerated one too
        assert modes() == expected
    finally:
        os.umask(old)


# A generator both the test and its child processes run: deterministic, and slow enough (with a
# sleep inside every atomic write, after the data and before the rename) that they overlap.
STUB = """
import time, torch
from harness.data._machinery import corruptions as cc
from harness.data._machinery.base import ImageSet
from harness.storage import safe_files

def stub(images, corruption, severity, seed):
    time.sleep(0.1)
    return (images.int() * 7 + seed % 97 + severity).remainder(256).to(torch.uint8)

cc.corrupt_images = stub
safe_files.fault_hook = lambda path, f: time.sleep(0.2)
TEST = ImageSet(torch.arange(40 * 64).reshape(40, 1, 8, 8).remainder(251).to(torch.uint8),
                torch.arange(40) % 10)
"""

CHILD = """
import logging, sys, time
from pathlib import Path
import numpy as np
exec(sys.argv[1])
root, ready, go, out = map(Path, sys.argv[2:6])
logging.basicConfig(level=logging.WARNING, format="%(message)s")
ready.touch()
while not go.exists():
    time.sleep(0.005)
np.save(out, cc.generated_corruption("stub", root, TEST, "fog", 2).images.numpy())
"""


@pytest.mark.slow
def test_processes_regenerating_one_damaged_file_at_once_agree(tmp_path, monkeypatch):
    """Three processes meet the same truncated file at the same moment: one moves it aside and
    names it, each ends with the right rows, and the file left is whole and fresh."""
    # Recorded so that the end of the test restores what STUB replaces in this process
    monkeypatch.setattr(cc, "corrupt_images", cc.corrupt_images)
    monkeypatch.setattr(safe_files, "fault_hook", safe_files.fault_hook)
    namespace: dict = {}
    exec(STUB, namespace)
    root = tmp_path / "data"
    expected = cc.generated_corruption("stub", root, namespace["TEST"], "fog", 2)
    path = root / "generated-c" / "stub" / "fog.npy"
    fresh = path.read_bytes()
    os.truncate(path, 500)

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    go = tmp_path / "go"
    args = [[str(root), str(tmp_path / f"ready{i}"), str(go), str(tmp_path / f"out{i}.npy")]
            for i in range(3)]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, STUB, *args[i]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(3)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], results

    for i in range(3):
        np.testing.assert_array_equal(np.load(tmp_path / f"out{i}.npy"), expected.images.numpy())
    assert path.read_bytes() == fresh
    (moved,) = _set_aside(path.parent, path.name)
    assert moved.stat().st_size == 500
    lines = [x for _, err in results for x in err.splitlines() if "damaged corruption cache" in x]
    assert lines == [
        f"{path}: damaged corruption cache (truncated or not a whole .npy file (ValueError: mmap "
        f"length is greater than file size)); moved to {moved.name}; generating it again"
    ]
    assert not list(path.parent.glob(".*.tmp"))
