"""``harness report RESULTS [KEY=VALUE…]``: leaderboard page, CSV and Markdown."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.session.checks import load_suite_arg

if TYPE_CHECKING:
    import pandas as pd


def cmd_report(args) -> int:
    """Write the report; 0, or 1 (after one line naming them) when records there could not be
    read and were left out. Cells without a record (pending, never started) are listed as
    missing on the page: the report of what exists is complete."""
    from harness.config.validator import require_results
    from reports.render.leaderboard import write_report
    from reports.render.terminal import expected_of

    if args.results_dir is None:
        print(
            "harness report: error: give the results folder to report on, e.g. "
            "harness report results/smoke (see harness report --help)",
            file=sys.stderr,
        )
        return 2

    # The manifest's cells, never-started = missing; with overrides, the cells of the recorded
    # suite file with those overrides applied.
    expected = expected_of(args.results_dir)
    if args.overrides:
        from harness.contract import read_manifest

        expected = load_suite_arg(
            read_manifest(Path(args.results_dir))["source"], args.overrides
        ).cells()
    results = require_results(Path(args.results_dir))
    # The bootstrap before anything is written: a damaged outcomes.npz, or cells of one
    # comparison scored on different test sets, stop the command with every file as it was.
    images = image_table_of(results, args) if args.images else None
    left_out: list[str] = []
    out = write_report(
        results,
        Path(args.output) if args.output else None,
        expected=expected,
        left_out=left_out,
        **report_kwargs(args),
    )
    print(f"wrote {out}")
    if images is not None:
        from reports.render.images import IMAGES_CSV, format_images

        images.to_csv(out.parent / IMAGES_CSV, index=False)
        print(format_images(images))
        print(f"wrote {out.parent / IMAGES_CSV}")
    if left_out:  # a report without some of the records there: not a clean exit
        print(f"error: {len(left_out)} record(s) could not be read and are left out of the "
              f"report: {' '.join(left_out)}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def image_table_of(results: Path, args: argparse.Namespace) -> pd.DataFrame:
    """``harness report --images``' table (:func:`reports.render.images.image_table`) of
    ``results``, its ``--reference`` checked first as the report checks it.

    Raises:
        UsageError: a ``--reference`` without done cells (the line names the methods with some),
            or none given and neither default reference ran.
        DamagedOutcomes: a compared cell's ``outcomes.npz`` is damaged or holds another number
            of images than its record's.
        UsageError: two cells of one comparison hold different numbers of images.
    """
    from harness.contract.errors import UsageError
    from reports.records.index import load_results
    from reports.render.images import image_table
    from reports.stats.bootstrap import image_marks
    from reports.stats.paired import default_reference, missing_reference

    cells = load_results(results).cells
    if args.reference:
        problem = missing_reference(cells, args.reference)
        if problem:
            raise UsageError(f"--{problem}")
    elif default_reference(cells) is None:
        raise UsageError(
            "--images: no reference to compare with: neither deep_ensemble nor single has done "
            "cells here; name one with --reference METHOD"
        )
    table = image_table(results, args.reference, test=args.test, holm=args.holm)
    # The image marks adjusted as --holm says (image_table infers it from the t-marks).
    table["boot_p_adjusted"], table["boot_significant"] = image_marks(table, args.holm)
    return table


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
