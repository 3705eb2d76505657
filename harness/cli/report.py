"""``harness report RESULTS [KEY=VALUE…]``: leaderboard page, CSV and Markdown."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.cli.validate import load_suite_arg


def cmd_report(args) -> int:
    from harness.config.validator import require_results
    from reports.render.leaderboard import write_report
    from reports.render.terminal import expected_of

    # The manifest's cells, never-started = missing; with overrides, the cells of the recorded
    # suite file with those overrides applied.
    expected = expected_of(args.results_dir)
    if args.overrides:
        from harness.contract import read_manifest

        expected = load_suite_arg(
            read_manifest(Path(args.results_dir))["source"], args.overrides
        ).cells()
    out = write_report(
        require_results(Path(args.results_dir)),
        Path(args.output) if args.output else None,
        expected=expected,
        **report_kwargs(args),
    )
    print(f"wrote {out}")
    return 0


def report_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``write_report`` keyword arguments from parsed ``harness report`` options."""
    from reports.render.page import ReportOptions

    baseline = None if str(args.mce_baseline).lower() == "none" else args.mce_baseline
    options = ReportOptions(
        interval=args.interval or "std",
        latex_interval=args.interval or "ci",
        test=args.test,
        holm=args.holm,
        mce_baseline=baseline,
    )
    return {
        "reference": args.reference,
        "options": options,
        "formats": ("csv", "md", *(args.formats or ())),
        "published": Path(args.published) if args.published else None,
        "figures": not getattr(args, "no_figures", False),
        "index": not getattr(args, "no_index", False),
    }
