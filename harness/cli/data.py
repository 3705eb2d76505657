"""``harness data download NAME…``: fetch datasets, corruption sets and named weights."""

from __future__ import annotations

import sys


def cmd_data(args) -> int:
    from harness.data.base import default_data_root
    from harness.data.download import DownloadError, download

    root = default_data_root(args.data_root)
    for name in args.names:
        try:  # one line and exit 2, never a traceback (offline, bad checksum, unknown name)
            where = download(name, root)  # the data root, or the weights' cached file
        except (DownloadError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: ready in {where}")
    return 0
