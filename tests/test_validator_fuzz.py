"""Property tests: the validator answers anything with a verdict, never a crash."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recordstore import CONVERSATION_REF, INFO, PREFERENCES, InvalidRecord
from recordstore.lexicon import validate_record
from tests.support.strategies import DEFS, MESSAGE, valid_messages

COLLECTIONS = [MESSAGE, INFO, PREFERENCES, CONVERSATION_REF, "com.example.other"]

# Keys the validator treats specially, mixed with field names of our lexicons so
# that random values land on real fields too.
keys = st.sampled_from(
    [
        "$type", "$link", "$bytes", "ref", "mimeType", "size", "role", "content", "parts",
        "text", "generation", "attempt", "tools", "createdAt", "image", "usage", "title",
        "nonce", "effort", "parent", "model", "provider", "id",
    ]
) | st.text(max_size=8)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec=None, categories=None), max_size=20)  # lone surrogates too
    | st.binary(max_size=8)
    | st.sampled_from([MESSAGE, f"{DEFS}#textPart", f"{DEFS}#imagePart", "blob", "2026-01-01T00:00:00Z"])
)

json_ish = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(keys, inner, max_size=5)
    | st.tuples(inner)
    | st.dictionaries(st.integers(), inner, max_size=2),
    max_leaves=30,
)


def verdict(collection: str, value: Any) -> bool:
    try:
        validate_record(collection, value)
    except InvalidRecord as e:
        assert str(e), "an error names what is wrong"
        assert len(str(e)) <= 1000
        return False
    return True


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COLLECTIONS), json_ish)
def test_random_values_get_a_verdict(collection: str, value: Any) -> None:
    verdict(collection, value)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COLLECTIONS), st.dictionaries(keys, json_ish, max_size=8))
def test_random_objects_get_a_verdict(collection: str, value: dict[str, Any]) -> None:
    before = copy.deepcopy(value)
    verdict(collection, value)
    assert repr(value) == repr(before)  # repr: NaN != NaN


@settings(max_examples=300)
@given(valid_messages())
def test_valid_messages_validate(value: dict[str, Any]) -> None:
    before = copy.deepcopy(value)
    validate_record(MESSAGE, value)
    assert value == before


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(valid_messages(), st.data())
def test_mutated_messages_get_a_verdict(value: dict[str, Any], data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(_paths(value)[1:]))
    replacement = data.draw(json_ish)
    target = value
    for seg in path[:-1]:
        target = target[seg]
    target[path[-1]] = replacement
    verdict(MESSAGE, value)


@settings(max_examples=200)
@given(valid_messages(), st.sampled_from(["content", "createdAt", "role"]))
def test_dropping_a_required_field_is_refused(value: dict[str, Any], field: str) -> None:
    del value[field]
    try:
        validate_record(MESSAGE, value)
    except InvalidRecord as e:
        assert str(e) == f"{field} is required"
    else:
        raise AssertionError("accepted a message without " + field)


@settings(max_examples=200)
@given(valid_messages(), st.floats(allow_nan=False))
def test_a_float_anywhere_is_refused(value: dict[str, Any], number: float) -> None:
    value["extension"] = {"nested": [number]}
    try:
        validate_record(MESSAGE, value)
    except InvalidRecord as e:
        assert "float" in str(e)
    else:
        raise AssertionError("accepted a float")
