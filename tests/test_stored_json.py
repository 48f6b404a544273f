"""Stored record text reads back as ``json.loads`` reads it (recordstore/stored_json.py)."""

from __future__ import annotations

import json

import jiter
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recordstore.stored_json import compact, parse, record_text

# The AT Protocol data model: no floats; integers of any size, text, bytes as objects.
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(_VALUES)
def test_what_the_store_writes_reads_back_the_same(value: object) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert parse(text) == json.loads(text)


def test_a_lone_surrogate_escape_reads_as_json_reads_it() -> None:
    text = '{"text": "\\ud800 alone"}'
    assert parse(text) == json.loads(text) == {"text": "\ud800 alone"}


@pytest.mark.parametrize("bad", ["{", "", '{"a": 1,}', "{'a': 1}"])
def test_text_that_is_not_json_is_refused_as_json_refuses_it(bad: str) -> None:
    with pytest.raises(ValueError):
        json.loads(bad)
    with pytest.raises(ValueError):
        parse(bad)


def test_only_keys_are_kept_in_jiter_s_cache() -> None:
    # Values (texts, CIDs, times) in jiter's process-wide cache would stay alive there.
    jiter.cache_clear()
    for n in range(50):
        parse(json.dumps({"text": f"a text seen once, number {n}", "createdAt": f"t{n}"}))
    assert jiter.cache_usage() == 2  # "text" and "createdAt"


@given(_VALUES | st.text())
def test_compact_and_record_text_write_what_json_dumps_writes(value: object) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert compact(value) == expected
    assert record_text(value) == expected
    assert parse(record_text(value)) == value


def test_record_text_refuses_what_atproto_data_cannot_hold() -> None:
    assert compact({"x": float("nan")}) == '{"x":NaN}'  # the SSE payloads' encoder is lenient
    with pytest.raises(ValueError):
        record_text({"x": float("nan")})
    with pytest.raises(ValueError):
        record_text([float("inf")])
