"""Former home of the executors, now in :mod:`harness.executors`; these names are re-exported
so existing imports keep working."""

from __future__ import annotations

from harness.contract import SUITE_FILE, read_manifest
from harness.executors.base import pending, write_manifest
from harness.executors.local import run_inprocess, run_local

__all__ = ["SUITE_FILE", "pending", "read_manifest", "run_inprocess", "run_local", "write_manifest"]
