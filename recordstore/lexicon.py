"""Record validation driven by the lexicon JSON documents shipped in :mod:`lexicons`.

The documents are parsed with ``atproto_lexicon`` (which also checks that they are
well-formed lexicon v1) and each def is compiled once into a small closure
(:mod:`recordstore.lexicon_checks`, on the data-model rules of
:mod:`recordstore.lexicon_data` and the string formats of
:mod:`recordstore.lexicon_formats`). A closure returns nothing on success and raises
on the first bad value; containers add their key to the failure's path while it
unwinds, so the happy path never builds a path string.

The rules are those of the atproto lexicon and data-model specs: ``knownValues``
are open, ``enum`` is closed, unions are open unless ``closed``, unknown fields
are allowed (but must still be valid data-model values), defaults are never
applied, and there are no floats anywhere.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from atproto_lexicon import models as lex
from atproto_lexicon.parser import lexicon_parse
from atproto_lexicon.refs import find_unresolved_refs

from recordstore.errors import InvalidRecord
from recordstore.lexicon_checks import Compiler
from recordstore.lexicon_data import Check, Fail, check_data, expect, format_path
from recordstore.lexicon_formats import check_format

__all__ = ["Lexicons", "check_format", "has_lexicon", "validate_data", "validate_record"]

# The message is quoted into an error reply whose `error` field holds 3000 bytes.
_MAX_MESSAGE = 1000


def _iter_json(node: Traversable) -> list[Traversable]:
    found = []
    for child in node.iterdir():
        if child.is_dir():
            found.extend(_iter_json(child))
        elif child.name.endswith(".json"):
            found.append(child)
    return found


def _compile(raw_docs: list[dict[str, Any]]) -> dict[str, Check]:
    """Record collection NSID -> check, for these lexicon documents (JSON form)."""
    docs = [lexicon_parse(raw) for raw in raw_docs]
    missing = find_unresolved_refs(docs)
    if missing:
        raise ValueError(f"lexicons refer to undefined defs: {sorted(missing)}")
    compiler = Compiler(docs)
    records = {}
    for doc in docs:
        if isinstance(doc.defs.get("main"), lex.LexRecord):
            records[doc.id] = compiler.ref(doc.id, "#main")
    # Compile every def now (tokens excepted), so a broken document fails at load.
    for doc in docs:
        for name, d in doc.defs.items():
            if not isinstance(d, lex.LexToken):
                compiler.ref(doc.id, f"#{name}")
    return records


@functools.cache
def _schema() -> dict[str, Check]:
    """The shipped documents, compiled once per process."""
    paths = sorted(_iter_json(resources.files("lexicons")), key=lambda p: p.name)
    return _compile([json.loads(p.read_text(encoding="utf-8")) for p in paths])


class Lexicons:
    """A validator for other lexicon documents than the shipped ones (JSON form)."""

    def __init__(self, raw_docs: list[dict[str, Any]]) -> None:
        self._schema = _compile(raw_docs)

    def validate(self, collection: str, value: Any) -> None:
        """As :func:`validate_record`, against these documents."""
        _validate(self._schema, collection, value)


def validate_data(value: Any) -> None:
    """Check that ``value`` is an atproto data-model object; raise InvalidRecord.

    The data-model rules only (no lexicon): no floats, ``$link``/``$bytes``/blob shapes,
    a ``$type`` that is a non-empty string, bounded depth.
    """
    try:
        if type(value) is not dict:
            raise expect(value, "an object")
        check_data(value)
    except Fail as e:
        path = format_path(e.path) or "value"
        raise InvalidRecord(f"{path} {e.message}"[:_MAX_MESSAGE]) from None
    except RecursionError:
        raise InvalidRecord("value is nested too deeply") from None


def has_lexicon(collection: str) -> bool:
    """Whether ``collection`` is a record type turnd ships a lexicon for."""
    return collection in _schema()


def validate_record(collection: str, value: dict[str, Any]) -> None:
    """Check ``value`` against the lexicon of ``collection``; raise InvalidRecord.

    A collection without a lexicon only gets the data-model checks. ``value`` is
    never changed: defaults are not filled in and unknown fields stay.
    """
    _validate(_schema(), collection, value)


def _validate(schema: dict[str, Check], collection: str, value: Any) -> None:
    try:
        if type(value) is not dict:
            raise expect(value, "an object")
        typ = value.get("$type", collection)
        if typ != collection:
            raise Fail(f"must be {collection}", at="$type")
        check = schema.get(collection)
        if check is None:
            check_data(value)
        else:
            check(value)
    except Fail as e:
        path = format_path(e.path) or "record"
        message = f"{path} {e.message}"
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 1] + "…"
        raise InvalidRecord(message) from None
    except RecursionError:
        raise InvalidRecord("record is nested too deeply") from None
