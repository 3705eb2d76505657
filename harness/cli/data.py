"""``harness data download NAME…``: fetch datasets, corruption sets and named weights."""

from __future__ import annotations

import sys


def cmd_data(args) -> int:
    """Fetch each name in turn; 0 when every one is ready, 2 at the first that cannot be
    fetched (its one error line, and with several names one line naming those not fetched)."""
    from harness.backbones._weights import download_named, is_named
    from harness.data._machinery.base import default_data_root
    from harness.data._machinery.download import DownloadError, download

    root = default_data_root(args.data_root)
    for i, name in enumerate(args.names):
        try:  # one line and exit 2, never a traceback (offline, bad checksum, unknown name)
            # named weights go to their library's cache, datasets to the data root
            where = download_named(name) if is_named(name) else download(name, root)
        except (DownloadError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            if len(args.names) > 1:  # which of those asked for are not there: this and the rest
                print(f"not fetched: {' '.join(args.names[i:])} (ready: "
                      f"{' '.join(args.names[:i]) or 'none'})", file=sys.stderr)  # fmt: skip
            return 2
        print(f"{name}: ready in {where}")
    return 0
