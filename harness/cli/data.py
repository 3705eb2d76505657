"""``harness data download NAME…``: fetch datasets, corruption sets and named weights."""

from __future__ import annotations

import sys


def cmd_data(args) -> int:
    """Fetch each name in turn; 0 when every one is ready, else 2 with one error line per name
    that failed and, with several names, one line naming those not fetched. A dataset prepared
    by hand (its commands printed) does not stop the others; any other failure (offline, a bad
    checksum, an unknown name) stops at that name, as the rest would fail the same way."""
    from harness.backbones._weights import download_named, is_named
    from harness.data._machinery.base import default_data_root
    from harness.data._machinery.download import DownloadError, PrepareByHand, download

    root = default_data_root(args.data_root)
    ready: list[str] = []
    missing: list[str] = []
    for i, name in enumerate(args.names):
        try:  # one line and exit 2, never a traceback (offline, bad checksum, unknown name)
            # named weights go to their library's cache, datasets to the data root
            where = download_named(name) if is_named(name) else download(name, root)
        except (DownloadError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            if isinstance(exc, PrepareByHand):
                missing.append(name)
                continue
            missing += args.names[i:]  # this one and the rest
            break
        ready.append(name)
        print(f"{name}: ready in {where}")
    if missing and len(args.names) > 1:
        print(f"not fetched: {' '.join(missing)} (ready: {' '.join(ready) or 'none'})",
              file=sys.stderr)  # fmt: skip
    return 2 if missing else 0
