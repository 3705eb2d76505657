"""JSON decoding for the files a report reads by the thousand: records, the suite manifest, the
record index's text columns.

orjson where it can (a quarter of the standard library's time: parsing is most of reading 10,000
records), else the standard library, which also accepts what orjson does not (NaN and Infinity,
integers past 64 bits, lone surrogates) and words every error as it always has — so a file decodes
to the same value either way, and a bad one fails with the standard library's message.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # a dependency, but reading must not depend on a parser's speed-up
    _orjson = None


def loads(raw: bytes | str) -> Any:
    """The JSON value of ``raw`` (UTF-8 bytes or text); the standard library's exceptions."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides, and says why
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
