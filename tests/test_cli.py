"""The command line as a user meets it: ls, validate (incl. missing data), shipped suites."""

from __future__ import annotations

import subprocess
import sys

from harness.cli import main
from harness.data.corruptions import ALL_CORRUPTIONS
from tests import fabricate
from tests.conftest import REPO

CIFAR_SUITES = [
    "cifar10_resnet18",
    "cifar100_wrn",
    "tau_sweep",
    "m_scaling",
    "finetune",
    "vit_cifar",
]


def harness(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        **kw,
    )


def test_ls_lists_registries():
    out = harness("ls")
    assert out.returncode == 0, out.stderr
    for name in ("sigma_ens", "packed_ensemble", "digits_cnn", "wrn28_10", "digits", "svhn"):
        assert name in out.stdout


def test_missing_data_fails_validation_with_path_and_fetch_command(tmp_path, capsys):
    out = harness("validate", "suites/cifar100_wrn.yaml", "--data-root", str(tmp_path))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert f"dataset 'cifar100' not found: looked in {tmp_path}/cifar-100-python" in out.stderr
    assert "Fetch it with `harness data download cifar100`" in out.stderr
    assert f"cifar100-c not found: looked for {tmp_path}/CIFAR-100-C" in out.stderr
    for suite in CIFAR_SUITES:  # the same in-process, for every shipped CIFAR suite
        assert main(["validate", f"{REPO}/suites/{suite}.yaml", "--data-root", str(tmp_path)]) == 2
        assert "Fetch it with `harness data download cifar" in capsys.readouterr().err


def test_shipped_suites_validate_with_their_data_present(tmp_path, capsys):
    """Every shipped suite passes `harness validate` once its data is on disk (fabricated in
    the real on-disk formats)."""
    fabricate.write_cifar10(tmp_path)
    fabricate.write_cifar100(tmp_path)
    fabricate.write_cifar_c(tmp_path, "CIFAR-10-C", corruptions=ALL_CORRUPTIONS)
    fabricate.write_cifar_c(tmp_path, "CIFAR-100-C", corruptions=ALL_CORRUPTIONS)
    fabricate.write_svhn(tmp_path)
    fabricate.write_dtd(tmp_path)
    for path in sorted((REPO / "suites").glob("*.yaml")):
        assert main(["validate", str(path), "--data-root", str(tmp_path)]) == 0, path
        assert ": OK — suite" in capsys.readouterr().out


def test_invalid_suite_exits_2_with_messages_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "grid: {datasets: [digits], backbones: [digits_cnn], methods: [sigma_ens],"
        " M: [0]}\nrecipe: {lr: -1}\n"
    )
    out = harness("validate", str(bad))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "bad.yaml: grid.methods[0].M: M must be >= 1, got 0" in out.stderr
    assert "bad.yaml: recipe.lr: must be > 0, got -1.0" in out.stderr
