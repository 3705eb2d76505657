"""The command line as a user meets it: ls, validate (incl. missing data), shipped suites."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from harness.cli import main
from harness.data._machinery.corruptions import ALL_CORRUPTIONS
from tests import fabricate, fabricate_imagenet, fabricate_text
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


@pytest.mark.slow  # every shipped suite's data check (~13 s); CI runs it
def test_missing_data_fails_validation_with_path_and_fetch_command(tmp_path, capsys):
    out = harness("validate", "suites/cifar100_wrn.yaml", "--data-root", str(tmp_path))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert f"dataset 'cifar100' not found: looked in {tmp_path}/cifar-100-python" in out.stderr
    assert "Fetch it with `harness data download cifar100`" in out.stderr
    # the corruption files this suite's list needs, each named with its path and fetch command
    assert f"{tmp_path}/CIFAR-100-C/gaussian_noise.npy is missing" in out.stderr
    assert "Fetch it with `harness data download cifar100-c`" in out.stderr
    for suite in CIFAR_SUITES:  # the same in-process, for every shipped CIFAR suite
        assert main(["validate", f"{REPO}/suites/{suite}.yaml", "--data-root", str(tmp_path)]) == 2
        assert "Fetch it with `harness data download cifar" in capsys.readouterr().err


def test_shipped_suites_validate_with_their_data_present(tmp_path, capsys, monkeypatch):
    """Every shipped suite passes `harness validate` once its data is on disk (fabricated in
    the real on-disk formats). Named published weights (imagenet_vit's timm ViT-B/16) cannot be
    fabricated in a library's cache here: they count as present (their check has its own test in
    test_weights.py)."""
    import harness.backbones._weights

    monkeypatch.setattr(harness.backbones._weights, "named_problem", lambda value: None)
    fabricate.write_cifar10(tmp_path)
    fabricate.write_cifar100(tmp_path)
    fabricate.write_cifar_c(tmp_path, "CIFAR-10-C", corruptions=ALL_CORRUPTIONS)
    fabricate.write_cifar_c(tmp_path, "CIFAR-100-C", corruptions=ALL_CORRUPTIONS)
    fabricate.write_svhn(tmp_path)
    fabricate.write_dtd(tmp_path)
    from harness.data import fashion_mnist  # fabricated files cannot have the published md5s

    fm = fabricate.write_fashion_mnist(tmp_path / "FashionMNIST" / "raw", n_train=10_010)
    monkeypatch.setattr(fashion_mnist, "CONTENT_MD5", {**fm["train"][2], **fm["test"][2]})
    monkeypatch.setenv(fashion_mnist.DEBIAN_DIR_ENV, "")
    fabricate_text.write_for_suites(tmp_path)
    fabricate_imagenet.write_for_suites(tmp_path)
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


# --- executors, the manifest and the terminal summary --------------------------------------------

TWO_SEEDS = """
name: twoseeds
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0, 1]
  methods:
    - {name: mc_dropout, hparams: {dropout_rate: 0.3}}
recipe: {epochs: 1, batch_size: 128}
evaluation: {cost_steps: 1}
"""


def test_executor_registry_resolves_auto_and_rejects_unknown_names():
    from harness.executors import EXECUTORS, make_executor, resolve_name
    from harness.executors.base import ExecutorOptions

    assert set(EXECUTORS.names()) == {"inprocess", "local", "slurm"}
    assert resolve_name("auto", 1, gpu_count=lambda: 0) == "inprocess"
    assert resolve_name("auto", 5, gpu_count=lambda: 0) == "local"
    assert resolve_name("auto", 5, gpu_count=lambda: 1) == "inprocess"
    with pytest.raises(ValueError, match=r"invalid choice: 'cloud' \(choose from 'auto', 'inpr"):
        resolve_name("cloud", 3)
    local = make_executor("local", ExecutorOptions(workers=8, threads=1), n_cells=3)
    assert local.name == "local" and "in 3 worker processes, 1 thread(s)" in local.describe(3)


@pytest.mark.slow
def test_local_workers_record_label_and_shared_device_and_report_lists_missing(
    tmp_path, write_suite, capsys
):
    from harness.contract import read_record, validate_record

    suite = write_suite(TWO_SEEDS)
    args = ["run", str(suite), "--executor", "local", "--workers", "2", "--threads", "1"]
    assert main([*args, "--results", str(tmp_path / "res"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "running 2 cells in 2 worker processes, 1 thread(s) each" in out
    results = tmp_path / "res" / "twoseeds"
    recs = [read_record(d) for d in sorted(results.iterdir()) if (d / "record.json").exists()]
    assert len(recs) == 2
    for rec in recs:
        validate_record(rec)
        assert rec["status"] == "done", rec["error"]
        assert rec["schema_version"] == 2
        assert rec["label"] == (
            f"digits/digits_cnn/mc_dropout(M=4,dropout_rate=0.3)/seed{rec['config']['seed']}"
        )
        assert rec["hparams_shown"] == {"dropout_rate": 0.3}
        cost = rec["cost"]
        assert cost["shared_device"] is True  # two workers measured on one CPU at once
        assert (cost["device"], cost["precision"]) == ("cpu", "fp32")
        assert cost["train_images_per_s"] > 0
    # A cell that never started (no folder at all) is listed as missing by report and summary.
    gone = recs[0]["cell_id"]
    shutil.rmtree(results / gone)
    assert main(["report", str(results), "-o", str(tmp_path / "page")]) == 0
    html = (tmp_path / "page" / "leaderboard.html").read_text()
    assert gone in html and "mc_dropout(M=4,dropout_rate=0.3)/seed" in html
    from reports.render.terminal import print_summary

    capsys.readouterr()
    assert print_summary(results) == 0
    assert "1 missing" in capsys.readouterr().out


def test_inprocess_single_worker_is_not_a_shared_device(tmp_path, write_suite):
    from harness.contract import iter_records

    suite = write_suite(TWO_SEEDS.replace("seeds: [0, 1]", "seeds: [3]"))
    code = main(["run", str(suite), "--executor", "inprocess", "--results", str(tmp_path), "-q"])
    assert code == 0
    (rec,) = list(iter_records(tmp_path / "twoseeds"))
    assert rec["cost"]["shared_device"] is False and rec["label"].endswith("/seed3")


def test_validate_only_counts_the_selected_cells_and_names_the_grid_they_come_from(capsys):
    """`validate --only` reports the cells it selected, and the grid's size beside them (the
    grid's shape alone read as if it were the selection's)."""
    smoke = str(REPO / "suites" / "smoke.yaml")
    assert main(["validate", smoke, "--skip-data"]) == 0
    whole = capsys.readouterr().out.strip().splitlines()[0]
    n = int(whole.split("'smoke', ")[1].split(" cells")[0])
    assert main(["validate", smoke, "--skip-data", "--only", "method=single"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[0]
    assert f"'smoke', 2 cells (of the grid's {n}: 1 datasets × " in line, line
    assert n == 20 and "(1 datasets" in whole
