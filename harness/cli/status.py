"""``harness status RESULTS`` and ``harness cancel RESULTS``: a suite's cells and its Slurm jobs."""

from __future__ import annotations

from pathlib import Path


def cmd_status(args) -> int:
    from harness.config.validator import require_results
    from harness.executors.status import print_status

    return print_status(require_results(Path(args.results_dir), records=False))


def cmd_cancel(args) -> int:
    from harness.executors.slurm.executor import cancel_suite

    return cancel_suite(Path(args.results_dir))
