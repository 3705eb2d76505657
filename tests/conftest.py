"""Shared fixtures. Tests run offline on the CPU; torch uses few threads to share the machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Without CUDA, Triton's interpreter runs the σNorm kernels (methods/_triton) on CPU tensors in
# tests/methods/test_sigma_triton.py. Read when a kernel is decorated, so set before any test
# module imports them; the product's CPU path never calls them either way.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_suite(tmp_path):
    """Write a suite YAML file into tmp_path and return its path."""

    def write(text: str, name: str = "suite.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="module")
def slurm_env():
    """The environment of the local single-node Slurm cluster (``tests/slurm_cluster.py``), for a
    module's tests: skips with a reason when no cluster answers (fails under
    ``HARNESS_REQUIRE_SLURM=1``, as CI sets)."""
    from tests.slurm_cluster import slurm_environment

    with slurm_environment() as env:
        yield env


@pytest.fixture(autouse=True)
def _no_leaked_environment():
    """Restore os.environ after every test: code under test may set variables for the processes
    it spawns (e.g. ``--plugin`` writes $HARNESS_PLUGINS), and a leak would change every later
    test that starts a subprocess."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def tiny_finished(tmp_path_factory) -> tuple[Path, Path]:
    """(suite file, results folder) of ``tests.misuse.TINY_SUITE``, trained once per session
    for every misuse module (each misuses copies of it, never the folder itself)."""
    from tests.misuse import run_tiny

    return run_tiny(tmp_path_factory.mktemp("tiny_finished"))
