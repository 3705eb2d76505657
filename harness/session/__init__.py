"""The run layer below both faces: check, run and plan a suite, and say what happened.

``harness run`` / ``harness validate`` (:mod:`harness.cli`) and :func:`harness.api.run` /
:func:`harness.api.validate` call the same two functions here, each with typed options and each
returning a typed result; nothing here prints (progress bars when the options ask for them): the
command line renders the result (the start lines, the executor's messages, the summary table),
the Python face hands it back.

- :func:`run_suite` (:mod:`harness.session.run`) with :class:`RunOptions` → :class:`RunResult`:
  the cells done, skipped (done before, leased by another process) and failed (with the
  record's reason), the executor's messages, the results folder, the exit status both faces
  report; with ``dry_run``, the plan (:class:`PlannedCell`: run or skip, and why) instead.
- :func:`validate_suite` (:mod:`harness.session.validate`) with :class:`ValidateOptions` →
  :class:`Validation`: the suite's name, its cells, the methods ``methods: [all]`` left out.
- :mod:`harness.session.checks`: the suite loading and the checks before anything runs that
  ``run``, ``validate``, ``report`` and :func:`harness.api.evaluate` share.

A suite is parsed and validated once per call. Problems found before anything runs raise
:class:`harness.config.includes.SuiteError` with one line each.
"""

from __future__ import annotations

from harness.session.options import RunOptions, ValidateOptions
from harness.session.result import (
    CellFailure,
    PlannedCell,
    RunResult,
    RunStart,
    SkippedCell,
    Validation,
)
from harness.session.run import run_suite
from harness.session.validate import validate_suite

__all__ = [
    "CellFailure",
    "PlannedCell",
    "RunOptions",
    "RunResult",
    "RunStart",
    "SkippedCell",
    "ValidateOptions",
    "Validation",
    "run_suite",
    "validate_suite",
]
