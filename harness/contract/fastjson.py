"""JSON decoding for the files a report reads by the thousand: records, the suite manifest, the
record index's text columns.

orjson where it decodes as the standard library does (a quarter of its time: parsing is most of
reading 10,000 records), else the standard library: for what orjson refuses (NaN and Infinity,
lone surrogates, numbers beyond a double) and words differently (every error message), and for
any text that may hold an integer of 19 digits or more, which may be past 64 bits — orjson reads
those as floats, silently losing digits, where the standard library keeps the exact integer.
So a file decodes to the same value either way, and a bad one fails with the standard library's
message.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # a dependency, but reading must not depend on a parser's speed-up
    _orjson = None

# Each byte's shape: a digit "0", a point ".", anything else " ". An integer of 19 digits or more
# is " " then 19 "0"s; a float's digits after its point are not (Python writes a float's integer
# part in at most 17 digits). bytes.translate and `in` run at C speed: ~10 µs for a 10 kB record,
# where a regular expression over the same bytes took ten times that.
_SHAPE = bytes(48 if 48 <= c <= 57 else 46 if c == 46 else 32 for c in range(256))
_LONG_INT = b" " + b"0" * 19


def _may_hold_a_long_integer(raw: bytes) -> bool:
    return _LONG_INT in b" " + raw.translate(_SHAPE)


def loads(raw: bytes | str) -> Any:
    """The JSON value of ``raw`` (UTF-8 bytes or text): what :func:`json.loads` returns, and its
    exceptions."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _orjson is not None and not _may_hold_a_long_integer(data):
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides, and says why
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)


def dumps(value: Any) -> bytes:
    """UTF-8 JSON of ``value`` — for the report's caches, whose values are text, integers and
    containers of them: orjson where installed (a tenth of :func:`json.dumps`' time for the 10 MB
    of cached rows of 10,000 records; it would write a float NaN as null, which these caches do
    not hold), else the standard library."""
    if _orjson is not None:
        return _orjson.dumps(value)
    return json.dumps(value).encode("utf-8")
