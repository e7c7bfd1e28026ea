"""Bounded JSON: the nesting counted as a parser would recurse, refused before parsing, named."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from histoserve import jsonsafe


@pytest.mark.parametrize(
    ("text", "deepest"),
    [
        ("", 0),
        ("3", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "]]]"]', 1),  # brackets inside strings do not count
        ('["\\"[[[", {"k\\\\": "]"}]', 2),  # nor after escaped quotes and backslashes
        ("[[[", 3),  # unclosed: what a parser would recurse before it fails
        ('"[[[', 3),  # an unterminated string's brackets count (never below a parser's)
    ],
)
def test_depth_is_counted_without_parsing(text: str, deepest: int) -> None:
    assert jsonsafe.depth(text) == deepest
    assert jsonsafe.depth(text.encode()) == deepest


def _nested(depth: int) -> st.SearchStrategy:
    leaves = st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n', max_size=6)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=depth,
    )


def _true_depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_true_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_true_depth, value.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_nested(40))
def test_depth_equals_the_values_nesting(value: object) -> None:
    text = json.dumps(value)
    assert jsonsafe.depth(text) == _true_depth(value)
    assert jsonsafe.loads(text, "x") == value


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_json_is_refused_before_parsing_naming_its_source(opener: str) -> None:
    deep = opener * 100_000  # json.loads: RecursionError, far past the interpreter's limit
    assert sys.getrecursionlimit() < 100_000
    with pytest.raises(jsonsafe.JsonError, match=r"^run\.json is JSON nested 100000 deep"):
        jsonsafe.loads(deep, "run.json")
    assert jsonsafe.loads(opener * 64 + "1" + ("]" if opener == "[" else "}") * 64, "x")


def test_size_text_and_json_errors_name_the_source() -> None:
    with pytest.raises(jsonsafe.JsonError, match=r"^f is 11 bytes of JSON, more than the 10"):
        jsonsafe.loads(b"[1,2,3,4,5]", "f", max_bytes=10)
    with pytest.raises(jsonsafe.JsonError, match=r"^f is not UTF-8 text \(byte 2\)"):
        jsonsafe.loads(b'["\xff"]', "f")
    with pytest.raises(jsonsafe.JsonError, match=r"^f is not JSON \(Expecting value at line 1"):
        jsonsafe.loads("[,]", "f")
    assert jsonsafe.loads(b'\xef\xbb\xbf{"a": 1}', "f") == {"a": 1}  # a BOM is fine
    assert jsonsafe.loads(memoryview(b"[1]"), "f") == [1]
    assert issubclass(jsonsafe.JsonError, ValueError)  # callers' `except ValueError` holds
