"""harness/contract/fastjson.py decodes every text as json.loads does, and fails as it does."""

from __future__ import annotations

import json
import math
import random

import pytest

from harness.contract import fastjson


@pytest.mark.parametrize(
    "text",
    [
        b"18446744073709551617",  # past 64 bits: orjson alone would return a float
        b"-9223372036854775809",
        b'{"salt": 123456789012345678901234567890, "a": [1, 2.5, null, true]}',
        b'{"a": 1, "a": 2}',  # duplicate keys: the last
        b"  [1e308, -0.0, 5e-324, 0.1, 1.7976931348623157e308]  ",
        b'"\\ud800"',  # a lone surrogate
        b'"caf\xc3\xa9 \\u00e9"',
        b"[" * 500 + b"]" * 500,
    ],
)
def test_decodes_as_the_standard_library(text):
    ours, theirs = fastjson.loads(text), json.loads(text.decode("utf-8"))
    assert ours == theirs and type(ours) is type(theirs)
    assert fastjson.loads(text.decode("utf-8")) == theirs
    if isinstance(theirs, int):
        assert fastjson.loads(text) == int(text)  # exactly: not a float near it


def test_nan_and_infinity_as_the_standard_library_reads_them():
    value = fastjson.loads(b'{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e400}')
    assert math.isnan(value["a"]) and value["b"] == value["d"] == math.inf
    assert value["c"] == -math.inf


def test_random_floats_round_trip_exactly():
    rng = random.Random(0)
    values = [rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-300, 300) for _ in range(2000)]
    assert fastjson.loads(json.dumps(values).encode()) == values


@pytest.mark.parametrize(
    "text", [b'{"a": ', b'{"a": 1,}', b"[1] x", b"\xff\xfe{}", b"", b'{"a": tru}']
)
def test_fails_with_the_standard_library_exception_and_message(text):
    try:
        json.loads(text.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as expected:
        with pytest.raises(type(expected)) as raised:
            fastjson.loads(text)
        assert str(raised.value) == str(expected)
    else:  # pragma: no cover - every text above is invalid
        raise AssertionError(f"{text!r} is valid JSON")


@pytest.mark.parametrize(
    ("text", "long"),
    [
        (b"[1, 18446744073709551617]", True),
        (b"18446744073709551617", True),
        (b'{"a":-18446744073709551617}', True),
        (b"[0.00012345678901234567, 1.2345678901234567e-05]", False),  # a float's digits
        (b"[9223372036854775807]", True),  # 19 digits: in 64 bits, but the standard library's
        (b'{"cell": "a1b2", "seed": 123456789012345678}', False),
    ],
)
def test_only_texts_that_may_hold_a_long_integer_skip_orjson(text, long):
    assert fastjson._may_hold_a_long_integer(text) is long
    assert fastjson.loads(text) == json.loads(text)
