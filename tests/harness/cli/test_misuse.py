"""Misuse, as a new user tries it: every flag, filter and file the harness reads gives one clear
line (what is wrong, the valid range or the file) and exit status 2, before anything runs;
never a Python traceback unless ``--debug`` / ``HARNESS_DEBUG=1`` asks for one.

Damaged results folders (records, checkpoints, weights of finished cells) are in
``test_misuse_results.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from tests import fabricate

SUITE = """
name: misuse
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0, 1]
  methods:
    - single
    - {name: sigma_ens, M: [2]}
recipe: {epochs: 1, batch_size: 128, lr: 0.05}
evaluation: {cost: false}
"""


@pytest.fixture
def suite(tmp_path) -> Path:
    path = tmp_path / "misuse.yaml"
    path.write_text(textwrap.dedent(SUITE))
    return path


def one_clear_line(capsys, *needles: str) -> str:
    """stderr, asserted to be one line without a traceback that names every needle."""
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def exit_code(argv: list[str]) -> int:
    """``main``'s status, also when argparse exits (a bad flag value)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


# --- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--workers", "0"], ["argument --workers: must be >= 1, got 0"]),
        (["--workers", "-2"], ["argument --workers: must be >= 1, got -2"]),
        (["--workers", "many"], ["--workers: expected a whole number >= 1, got 'many'"]),
        (["--threads", "-3"], ["argument --threads: must be >= 1, got -3"]),
        (["--cells-per-gpu", "0"], ["argument --cells-per-gpu: must be >= 1, got 0"]),
        (["--gpus", ","], ["argument --gpus: ',' names no GPU"]),
        (["--gpus", "0,,1"], ["'0,,1' has an empty id between commas"]),
        (["--gpus", "cuda:0"], ["'cuda:0': not a GPU id"]),
        (["--executor", "inprocess", "--workers", "3"], ["--workers: only for --executor auto"]),
        (["--executor", "inprocess", "--gpus", "0"], ["--gpus: only for --executor auto"]),
        (["--executor", "local", "--profile", "p.yaml"], ["--profile: only for --executor slurm"]),
        (["--executor", "local", "--wait"], ["--wait: only for --executor slurm"]),
        (["--executor", "slurm", "--slurm", "=gpu"], ["--slurm =gpu: expected KEY=VALUE"]),
        (["--executor", "slurm", "--slurm", "partition"], ["--slurm partition: expected KEY"]),
    ],
)
def test_bad_run_flags_exit_2_before_anything_runs(suite, tmp_path, capsys, flags, needles):
    results = tmp_path / "results"
    assert exit_code(["run", str(suite), "--results", str(results), "-q", *flags]) == 2
    one_clear_line(capsys, *needles)
    assert not results.exists()  # nothing started, no folder made


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["bench", "--M", "0"], "harness bench: error: argument --M: must be >= 1, got 0"),
        (["bench", "--batch", "-8"], "argument --batch: must be >= 1, got -8"),
        (["bench", "--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
        (["bench", "--steps", "1.5"], "argument --steps: expected a whole number >= 1, got '1.5'"),
        (["run"], "harness run: error: the following arguments are required: suite"),
        (["frobnicate"], "harness: error: argument command: invalid choice: 'frobnicate'"),
    ],
)
def test_other_bad_arguments_are_one_line(capsys, argv, needle):
    assert exit_code(argv) == 2
    one_clear_line(capsys, needle)


@pytest.mark.parametrize(
    ("only", "needles"),
    [
        # the typo is named with the grid's closest value, not dropped while `single` runs
        ("method=single,method=sigma_enss", ["method=sigma_enss", "did you mean sigma_ens?"]),
        (
            "method=sigma_ens,seed=7",
            ["no cell of the suite has seed 7", "values in this grid: 0, 1"],
        ),
        ("dataset=cifar10", ["no cell of the suite has dataset 'cifar10'", "digits"]),
        ("M=3", ["no cell of the suite has M 3", "values in this grid: 1, 2"]),
        (",", ["--only ',': empty filter"]),
        ("", ["--only '': empty filter"]),
        ("metod=single", ["--only metod: unknown key"]),
        ("method", ["--only method: expected KEY=VALUE"]),
    ],
)
def test_bad_only_filters_exit_2(suite, tmp_path, capsys, only, needles):
    for command in ("run", "validate"):
        argv = [command, str(suite), "--only", only, "--skip-data"]
        if command == "run":
            argv = [command, str(suite), "--only", only, "--results", str(tmp_path / "r")]
        assert exit_code(argv) == 2, command
        one_clear_line(capsys, *needles)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("grid.backbones[0].kwargs.widht=4", ["digits_cnn", "unknown options ['widht']", "width"]),
        ("grid.backbones=[{name: resnet18, kwargs: {depth: 3}}]", ["resnet18", "'depth'"]),
        ("grid.backbones[0].kwargs.width=wide", ["grid.backbones[0].kwargs", "digits_cnn"]),
    ],
)
def test_an_unknown_backbone_option_fails_validation(suite, capsys, override, needles):
    assert main(["validate", str(suite), "--skip-data", override]) == 2
    one_clear_line(capsys, f"override {override}: ", "refuses it", *needles)
    assert main(["validate", str(suite), "--skip-data", "grid.backbones[0].kwargs.width=8"]) == 0


# --- bounded YAML, names -------------------------------------------------------------------------

BOMB = "name: bomb\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (BOMB, ["aliases expand to 4.9e+08 nodes, more than 100000: refused"]),
        (f"include: {Path('/dev/zero')}\n", ["/dev/zero: included file is not a regular file"]),
        ("include: sub\n", ["sub: included file is a directory"]),
        ("include: missing.yaml\n", ["missing.yaml: suite file not found (included from"]),
        ("name: [unclosed\n", ["invalid YAML: line 2, column 1: expected ',' or ']'"]),
        ("grid: {a: 1}\n  b: 2\n", ["invalid YAML: line 2, column"]),
        ("# big\n" + "x" * (2**20 + 10) + "\n", ["suite file is larger than 1024 KiB"]),
        ("name: caf\xe9\n", ["is not UTF-8 text"]),
        ("[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
        (
            "name: a\x00b\n",
            ["invalid YAML: character 7: U+0000 is not allowed (special characters"],
        ),
    ],
)
def test_yaml_files_are_bounded(tmp_path, capsys, text, needles):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "s.yaml"
    path.write_bytes(text.encode("latin-1") if "\xe9" in text else text.encode())
    assert main(["validate", str(path), "--skip-data"]) == 2
    one_clear_line(capsys, *needles)


def test_names_longer_than_the_file_system_allows_fail_validation(suite, capsys):
    assert main(["validate", str(suite), "--skip-data", f"name={'n' * 300}"]) == 2
    one_clear_line(capsys, ": 300 bytes, more than the 255 a file name may have")
    assert main(["validate", str(suite), "--skip-data", f"name={'n' * 255}"]) == 0
    assert main(["validate", str(suite), "--skip-data", "name=a/../../b"]) == 2
    one_clear_line(capsys, "override name=a/../../b: must be letters, digits")


# --- files the harness reads ---------------------------------------------------------------------


def write_weights(tmp_path: Path) -> dict[str, Path]:
    import torch

    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(64)}, good)
    files = {"empty": b"", "text": b"hello, not weights\n", "truncated": good.read_bytes()[:200]}
    out = {}
    for name, data in files.items():
        out[name] = tmp_path / f"{name}.pt"
        out[name].write_bytes(data)
    return out


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("empty", "is empty (0 bytes)"),
        ("text", "is not a PyTorch weights file (torch.save); it starts with 'hello, n'"),
        ("truncated", "is a truncated or damaged zip archive (200 bytes"),
    ],
)
def test_damaged_pretrained_weights_are_named(suite, tmp_path, capsys, kind, problem):
    from harness.contract.errors import DamagedFile
    from harness.storage.checkpoint import load_weights

    path = write_weights(tmp_path)[kind]
    override = f"grid.methods[1].hparams.pretrained={path}"
    for command in ("validate", "run"):
        argv = [command, str(suite), override, "--data-root", str(tmp_path)]
        assert main([*argv, *(["--results", str(tmp_path / "r")] if command == "run" else [])]) == 2
        # The override set the path: it is named, as for any problem of a value it set.
        one_clear_line(capsys, f"override {override}: {path} {problem}")
    assert not (tmp_path / "r").exists()
    with pytest.raises(DamagedFile, match=f"^{re.escape(f'{path}: {problem}')}"):
        load_weights(path)  # the same line when a run reaches the file


def test_a_truncated_cifar_batch_is_named_and_exits_2(tmp_path, capsys):
    from harness.data._machinery.base import DataFileError
    from harness.data.torchvision_sets import load_cifar

    fabricate.write_cifar10(tmp_path, train_per_class=2, test_per_class=1)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:500])
    with pytest.raises(DataFileError, match=rf"^{batch}: damaged data file \(UnpicklingError"):
        load_cifar("cifar10", tmp_path)
    suite = tmp_path / "c.yaml"
    suite.write_text(
        SUITE.replace("digits]", "cifar10]")
        .replace("seeds: [0, 1]", "seeds: [0]")
        .replace("- {name: sigma_ens, M: [2]}", "")
    )
    argv = ["run", str(suite), "--data-root", str(tmp_path), "--results", str(tmp_path / "r")]
    assert main([*argv, "-q", "--executor", "inprocess"]) == 2  # a data error: as missing data
    out = capsys.readouterr().out
    assert f"DataFileError: {batch}: damaged data file" in out
    assert "harness data download cifar10" in out


def test_slurm_profiles_with_errors_are_named(suite, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("partition: gpu\n  qos: [x\n")
    argv = ["run", str(suite), "--executor", "slurm", "--results", str(tmp_path / "r")]
    assert main([*argv, "--profile", str(bad)]) == 2
    one_clear_line(capsys, f"{bad}: invalid YAML: line 2")
    (tmp_path / "dir.yaml").mkdir()
    assert main([*argv, "--profile", str(tmp_path / "dir.yaml")]) == 2
    one_clear_line(capsys, "dir.yaml: profile is a directory")
    assert main([*argv, "--profile", "nosuchprofile"]) == 2
    one_clear_line(capsys, "nosuchprofile: profile not found (shipped profiles:")
    assert not (tmp_path / "r").exists()


def test_a_plugin_that_raises_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "raising_plugin.py").write_text("import math\n\nVALUE = 1 / 0\n")
    (tmp_path / "importing_plugin.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["ls", "--plugin", "raising_plugin"]) == 2
    one_clear_line(
        capsys,
        "plugin module 'raising_plugin' raised ZeroDivisionError at ",
        "raising_plugin.py:3 while importing: division by zero",
    )
    assert main(["ls", "--plugin", "importing_plugin"]) == 2
    one_clear_line(capsys, "raised ModuleNotFoundError", "'no_such_module_anywhere'")
    assert main(["ls", "--plugin", "not_a_plugin_module"]) == 2
    one_clear_line(capsys, "plugin module 'not_a_plugin_module' cannot be imported")


# --- the last resort: one line, the traceback only on request ------------------------------------


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    import harness.cli.ls

    def broken(args):
        raise ZeroDivisionError("a bug somewhere")

    monkeypatch.setattr(harness.cli.ls, "cmd_ls", broken)
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    assert main(["ls"]) == 1
    one_clear_line(
        capsys, "error: ZeroDivisionError: a bug somewhere", "--debug or HARNESS_DEBUG=1"
    )
    with pytest.raises(ZeroDivisionError, match="a bug somewhere"):
        main(["--debug", "ls"])
    monkeypatch.setenv("HARNESS_DEBUG", "1")
    with pytest.raises(ZeroDivisionError, match="a bug somewhere"):
        main(["ls"])
    monkeypatch.setattr(
        harness.cli.ls, "cmd_ls", lambda args: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert main(["ls"]) == 130  # Ctrl-C keeps its own status and message


@pytest.mark.slow  # starts two interpreters
def test_no_traceback_across_the_process_boundary(suite, tmp_path):
    """The same lines from the installed command (logging, argparse and stderr as a user sees
    them): a bad flag and a bad include."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    for argv, needle in [
        (["run", str(suite), "--threads", "-3"], "argument --threads: must be >= 1, got -3"),
        (["validate", str(bomb), "--skip-data"], "refused (a YAML alias bomb?)"),
    ]:
        out = subprocess.run([sys.executable, "-m", "harness.cli", *argv], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stdout + out.stderr
        assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("executor", [[], ["--executor", "local"]])
def test_gpus_that_are_not_there_are_refused_whatever_the_number_of_cells(
    suite, tmp_path, capsys, monkeypatch, executor
):
    """`--gpus 0` with one pending cell: `auto` picked in-process and ignored the GPUs named;
    now `auto` with --gpus is the local executor, and a GPU that is not visible is refused
    before the results folder is written."""
    monkeypatch.setattr("harness.engine.environment.visible_gpus", lambda: [])
    results = tmp_path / "r"
    argv = ["run", str(suite), "--only", "method=single,seed=0", "--gpus", "0", *executor]
    assert main([*argv, "--results", str(results)]) == 2
    assert capsys.readouterr().err == "error: --gpus 0: no such GPU; visible GPUs: none\n"
    assert not results.exists()


def test_auto_with_gpus_places_cells_as_the_local_executor_does():
    from harness.executors.base import ExecutorOptions
    from harness.session.options import RunOptions
    from harness.session.run import _executor_name

    assert _executor_name(RunOptions(executor_options=ExecutorOptions(gpus=("0",)))) == "local"
    assert _executor_name(RunOptions()) == "auto"
    assert _executor_name(RunOptions(executor="inprocess")) == "inprocess"
