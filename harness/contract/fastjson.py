"""JSON decoding for the files a report reads by the thousand: records, the suite manifest, the
record index's text columns.

orjson where it decodes as the standard library does (a quarter of its time: parsing is most of
reading 10,000 records), else the standard library: for what orjson refuses (NaN and Infinity,
lone surrogates, numbers beyond a double) and words differently (every error message), and for
any text with a run of 19 or more digits, which may be an integer past 64 bits — orjson reads
those as floats, silently losing digits, where the standard library keeps the exact integer.
(A float the harness writes has at most 17 significant digits.) So a file decodes to the same
value either way, and a bad one fails with the standard library's message.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # a dependency, but reading must not depend on a parser's speed-up
    _orjson = None

_LONG_DIGITS = re.compile(rb"\d{19}")
_LONG_DIGITS_TEXT = re.compile(r"\d{19}")


def loads(raw: bytes | str) -> Any:
    """The JSON value of ``raw`` (UTF-8 bytes or text): what :func:`json.loads` returns, and its
    exceptions."""
    long_digits = _LONG_DIGITS if isinstance(raw, bytes) else _LONG_DIGITS_TEXT
    if _orjson is not None and not long_digits.search(raw):
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides, and says why
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
