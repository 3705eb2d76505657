"""``harness report``'s options: declared here, next to what they control (no heavy imports).

``add_report_arguments(parser)`` adds them to the ``report`` sub-command; ``report_kwargs(args)``
turns the parsed values into :func:`reports.render.leaderboard.write_report` keyword arguments.
"""

from __future__ import annotations

import argparse
from typing import Any

FORMATS = ("html", "csv", "md", "latex")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--reference --format --interval --test --holm --mce-baseline --no-figures
    --no-index --published``."""
    parser.add_argument(
        "--reference",
        help="reference for the paired differences: a method, or method:key=value,... "
        "(default: deep_ensemble, else single)",
    )
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=FORMATS,
        help="also write this format (repeatable; leaderboard.html, the CSVs and leaderboard.md "
        "are always written): latex writes leaderboard.tex, one booktabs table per dataset",
    )
    parser.add_argument(
        "--interval",
        choices=("std", "ci"),
        help="the ± part of every cell: std over seeds, or the 95%% t-interval of the mean "
        "(default: std on the page, CSV and Markdown; ci in LaTeX)",
    )
    parser.add_argument(
        "--test",
        choices=("signflip", "t"),
        default="signflip",
        help="the paired test behind the ▲/▼ marks and the bold cells: the exact sign-flip "
        "permutation test (no normality needed, but symmetric per-seed differences; marks from "
        "6 seeds) or the paired t-test "
        "(default: signflip)",
    )
    parser.add_argument(
        "--holm",
        action="store_true",
        help="Holm-adjust the paired p-values across the whole paired table",
    )
    parser.add_argument(
        "--mce-baseline",
        default="single",
        help="method the mCE column is relative to (default: single); 'none' drops mCE",
    )
    parser.add_argument(
        "--no-figures",
        action="store_true",
        help="draw no figures (the tables, statistics and CSVs are written as always)",
    )
    parser.add_argument(
        "--no-index",
        action="store_true",
        help="read every record, neither using nor writing the record index (.report-index.npz "
        "beside the results, which keeps the flattened records so that the next report reads "
        "only those that changed)",
    )
    parser.add_argument(
        "--published",
        help="CSV of published values (dataset,backbone,method,M,hparams,metric,value,source) "
        "to show next to the measured ones (default: <suite>.published.csv beside the suite)",
    )


def report_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``write_report`` keyword arguments from parsed ``harness report`` options."""
    from pathlib import Path

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
