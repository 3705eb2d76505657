"""A record's ``environment.git_commit``: '+dirty' only when the code that computes results differs
from the commit, not when a grid rewrote tracked results files in the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.engine import environment


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    repo = tmp_path / "checkout"
    (repo / "methods").mkdir(parents=True)
    (repo / "docs" / "results" / "s").mkdir(parents=True)
    (repo / "methods" / "m.py").write_text("X = 1\n")
    (repo / "docs" / "results" / "s" / "suite.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(environment, "REPO", repo)
    environment.git_commit.cache_clear()
    yield repo
    environment.git_commit.cache_clear()


def test_rewritten_results_in_the_checkout_do_not_make_the_commit_dirty(checkout):
    sha = _git(checkout, "rev-parse", "HEAD")
    (checkout / "docs" / "results" / "s" / "suite.json").write_text('{"cells": []}\n')
    (checkout / "docs" / "results" / "s" / "new").mkdir()
    assert environment.git_commit() == sha


def test_changed_code_makes_the_commit_dirty(checkout):
    sha = _git(checkout, "rev-parse", "HEAD")
    (checkout / "methods" / "m.py").write_text("X = 2\n")
    assert environment.git_commit() == sha + "+dirty"
