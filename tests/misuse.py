"""What the misuse tests of every surface share: a tiny finished grid to misuse, a checksum of
every file under a folder (a refused mistake leaves each byte as it was), and the check that a
command printed no traceback.

The rule they hold each surface to: a mistake is refused before any work starts, with one line
(or one ``HarnessError`` whose message names the argument, the value and what to do), exit
status 2 on the command line, and every file on disk byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import shutil
import textwrap
from pathlib import Path

#: Two cells on the built-in digits dataset, one epoch each (seconds on a CPU), with post-hoc
#: calibration and one OOD set, so add-only and outcome files have something to hold.
TINY_SUITE = """
name: tiny
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 4}}]
  seeds: [0]
  methods:
    - single
    - {name: deep_ensemble, M: [2]}
recipe: {epochs: 1, batch_size: 128, lr: 0.05, validation: 200}
evaluation: {cost: false, calibrate: true, ood: [digits_heldout]}
"""


def run_tiny(folder: Path, text: str = TINY_SUITE) -> tuple[Path, Path]:
    """Run ``text`` (a suite) in-process under ``folder``: (suite file, its results folder)."""
    from harness.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    suite = folder / "tiny.yaml"
    suite.write_text(textwrap.dedent(text))
    argv = ["run", str(suite), "--executor", "inprocess", "--results", str(folder / "r"), "-q"]
    assert main(argv) == 0
    return suite, folder / "r" / "tiny"


def copy_results(finished: Path, to: Path) -> Path:
    """A copy of a finished results folder (tests misuse the copy, never the module's run)."""
    shutil.copytree(finished, to)
    return to


def tree_hashes(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` (empty when it is absent)."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def no_traceback(capsys) -> tuple[str, str]:
    """(stdout, stderr) so far, asserting neither holds a traceback."""
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return out, err
