"""The atproto interop test-suite's fixtures, run through recordstore's own functions.

The fixtures are vendored as data in ``tests/interop/`` (see its README for the source
commit). Each line or case is one test, so a regression names the input;
``python -m tests.test_interop`` prints the pass counts per family.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import libipld
import pytest

from recordstore import InvalidKey, InvalidRecord
from recordstore.cid import encode_record, ipld_to_json, record_cid
from recordstore.keys import is_tid, validate_collection, validate_did, validate_key
from recordstore.lexicon import Lexicons, check_format, validate_data
from recordstore.write import integral_numbers

HERE = Path(__file__).resolve().parent / "interop"


def _lines(name: str) -> list[str]:
    # As the suite's own readers do: comment and empty lines skipped, nothing trimmed.
    text = (HERE / "syntax" / name).read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line and not line.startswith("#")]


def _raises_key(fn: Callable[[str], object]) -> Callable[[str], bool]:
    def ok(value: str) -> bool:
        try:
            fn(value)
        except InvalidKey:
            return False
        return True

    return ok


def _format(name: str) -> Callable[[str], bool]:
    return lambda value: check_format(name, value) is None


# family -> (file stem, the recordstore function that says "valid")
SYNTAX: dict[str, tuple[str, Callable[[str], bool]]] = {
    "tid": ("tid", is_tid),
    "record-key": ("recordkey", _raises_key(validate_key)),
    "did": ("did", _raises_key(validate_did)),
    "nsid": ("nsid", _raises_key(validate_collection)),
    "at-uri": ("aturi", _format("at-uri")),
    "handle": ("handle", _format("handle")),
    "datetime": ("datetime", _format("datetime")),
}


def syntax_cases() -> Iterator[tuple[str, str, bool]]:
    for family, (stem, _) in SYNTAX.items():
        for line in _lines(f"{stem}_syntax_valid.txt"):
            yield family, line, True
        for line in _lines(f"{stem}_syntax_invalid.txt"):
            yield family, line, False
    for line in _lines("datetime_parse_invalid.txt"):
        yield "datetime", line, False


def _json(path: str) -> Any:
    return json.loads((HERE / path).read_text(encoding="utf-8"))


def _accepted(check: Callable[[Any], object], value: Any) -> bool:
    """Whether ``check`` takes the vector's JSON (its numbers as atproto's integers)."""
    try:
        check(integral_numbers(value))
    except InvalidRecord:
        return False
    return True


def _valid_and_invalid(stem: str, name: str, value: str) -> Iterator[tuple[str, Any, bool]]:
    """``(name, value, valid)`` of each case in ``<stem>-valid.json``, then ``<stem>-invalid.json``."""
    for suffix, valid in (("valid", True), ("invalid", False)):
        for case in _json(f"{stem}-{suffix}.json"):
            yield case[name], case[value], valid


def _data_valid(value: Any) -> bool:
    return _accepted(validate_data, value)


def data_model_cases() -> Iterator[tuple[str, Any, bool]]:
    return _valid_and_invalid("data-model/data-model", "note", "json")


def _fixture_ok(case: dict[str, Any]) -> bool:
    cbor = base64.b64decode(case["cbor_base64"] + "=" * (-len(case["cbor_base64"]) % 4))
    return (
        record_cid(case["json"]) == case["cid"]
        and encode_record(case["json"]) == cbor
        and ipld_to_json(libipld.decode_dag_cbor(cbor)) == case["json"]
    )


_CATALOG = Lexicons([_json("lexicon/catalog/record.json")])


def _record_valid(data: Any) -> bool:
    return _accepted(lambda value: _CATALOG.validate("example.lexicon.record", value), data)


def record_data_cases() -> Iterator[tuple[str, Any, bool]]:
    return _valid_and_invalid("lexicon/record-data", "name", "data")


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize(
    ("family", "value", "valid"),
    list(syntax_cases()),
    ids=lambda v: v if isinstance(v, str) else str(v),
)
def test_syntax(family: str, value: str, valid: bool) -> None:
    assert SYNTAX[family][1](value) is valid


@pytest.mark.parametrize(("note", "value", "valid"), list(data_model_cases()))
def test_data_model(note: str, value: Any, valid: bool) -> None:
    assert _data_valid(value) is valid, note


@pytest.mark.parametrize(
    "case", _json("data-model/data-model-fixtures.json"), ids=lambda c: c["cid"][-8:]
)
def test_data_model_fixtures(case: dict[str, Any]) -> None:
    assert _fixture_ok(case)


@pytest.mark.parametrize(("name", "data", "valid"), list(record_data_cases()))
def test_lexicon_record_data(name: str, data: Any, valid: bool) -> None:
    assert _record_valid(data) is valid, name


def counts() -> dict[str, tuple[int, int]]:
    """family -> (passed, total)."""
    out: dict[str, list[int]] = {}

    def add(family: str, ok: bool) -> None:
        entry = out.setdefault(family, [0, 0])
        entry[0] += ok
        entry[1] += 1

    for family, value, valid in syntax_cases():
        add(f"syntax/{family}", SYNTAX[family][1](value) is valid)
    for _, value, valid in data_model_cases():
        add("data-model valid/invalid", _data_valid(value) is valid)
    for case in _json("data-model/data-model-fixtures.json"):
        add("data-model fixtures", _fixture_ok(case))
    for _, data, valid in record_data_cases():
        add("lexicon record-data", _record_valid(data) is valid)
    return {k: (v[0], v[1]) for k, v in out.items()}


if __name__ == "__main__":
    total = [0, 0]
    for family, (passed, n) in counts().items():
        total[0] += passed
        total[1] += n
        print(f"{family:28} {passed:4}/{n}")
    print(f"{'all':28} {total[0]:4}/{total[1]}")
