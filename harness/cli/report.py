"""``harness report RESULTS [KEY=VALUE…]``: leaderboard page, CSV and Markdown."""

from __future__ import annotations

from pathlib import Path

from harness.cli.validate import load_suite_arg


def cmd_report(args) -> int:
    from harness.config.validator import require_results
    from reports.render.cli import report_kwargs
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
