"""A live MLflow tracking server for the tracker tests (plain module, not a test file).

``.ci/run`` starts one (``mlflow server --backend-store-uri sqlite:///…`` on 127.0.0.1) and
exports its address as ``HARNESS_MLFLOW_URI`` with ``HARNESS_REQUIRE_TRACKERS=1``; elsewhere
:func:`mlflow_server` starts one on a free port for the test session and stops it afterwards.
Without the ``mlflow`` package's server (``mlflow-skinny`` has none) the tests skip with a
one-line reason, except under ``HARNESS_REQUIRE_TRACKERS=1``, where they fail; the same holds for
the tracker packages themselves (:func:`tracker_package`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

URI_ENV = "HARNESS_MLFLOW_URI"
REQUIRE_ENV = "HARNESS_REQUIRE_TRACKERS"


def answers(uri: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``uri`` answers ``/health``."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as reply:
            return reply.status == 200
    except OSError:
        return False


def _unavailable(reason: str) -> None:
    import pytest

    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"MLflow server required ({REQUIRE_ENV}=1) but unavailable: {reason}")
    pytest.skip(f"MLflow server not available: {reason}")


def tracker_package(name: str):
    """``import name`` for a tracker test: skips with a reason when the package is missing,
    fails instead under ``HARNESS_REQUIRE_TRACKERS=1`` (CI installs every tracker)."""
    import importlib

    import pytest

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_ENV}=1 but {name} cannot be imported: {exc}")
        pytest.skip(f"{name} is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_command() -> list[str] | None:
    """``mlflow server`` of this interpreter's environment, when the full package is there."""
    try:
        import flask  # noqa: F401  (the server's dependencies: absent with mlflow-skinny)
        import mlflow.server  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        return None
    exe = Path(sys.executable).with_name("mlflow")
    found = str(exe) if exe.exists() else shutil.which("mlflow")
    return [found] if found else None


@contextlib.contextmanager
def mlflow_server(folder: Path, timeout_s: float = 90.0) -> Iterator[str]:
    """The URI of a live tracking server with a SQLite backend on 127.0.0.1: ``$HARNESS_MLFLOW_URI``
    when it answers (CI's), else one started here in ``folder`` and stopped on exit."""
    given = os.environ.get(URI_ENV)
    if given:
        if not answers(given, timeout=5):
            _unavailable(f"{URI_ENV}={given} does not answer /health")
        yield given
        return
    cmd = _server_command()
    if cmd is None:
        _unavailable("the mlflow package's server is not installed (pip install mlflow)")
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    log = (folder / "server.log").open("w")
    args = [
        *cmd, "server",
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination", str(folder / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its workers stop with it
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not answers(uri):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "server.log").read_text(errors="replace")[-2000:]
                _unavailable(f"mlflow server did not start on {uri}:\n{tail}")
            time.sleep(0.5)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
