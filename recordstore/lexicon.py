"""Record validation driven by the lexicon JSON documents shipped in :mod:`lexicons`.

The documents are parsed with ``atproto_lexicon`` (which also checks that they are
well-formed lexicon v1) and each def is compiled once into a small closure. A
closure returns nothing on success and raises :class:`_Fail` on the first bad
value; containers add their key to the failure's path while it unwinds, so the
happy path never builds a path string.

The rules are those of the atproto lexicon and data-model specs: ``knownValues``
are open, ``enum`` is closed, unions are open unless ``closed``, unknown fields
are allowed (but must still be valid data-model values), defaults are never
applied, and there are no floats anywhere.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from types import SimpleNamespace
from typing import Any

import libipld
import regex
from atproto_client.models import string_formats
from atproto_lexicon import models as lex
from atproto_lexicon.parser import lexicon_parse
from atproto_lexicon.refs import find_unresolved_refs

from recordstore import InvalidRecord

__all__ = ["Lexicons", "check_format", "has_lexicon", "validate_data", "validate_record"]

Check = Callable[[Any], None]

# JS clients (and the reference PDS) read numbers as doubles: integers past 2^53
# would silently change, and with them the record's CID.
_MAX_SAFE_INT = 2**53 - 1
# Deep nesting is never legitimate in a chat record, and bounding it keeps the
# recursive walk (and the DAG-CBOR encoder after us) far from Python's stack limit.
_MAX_DEPTH = 64
# The message is quoted into an error reply whose `error` field holds 3000 bytes.
_MAX_MESSAGE = 1000
_MAX_KEY_IN_PATH = 64

_GRAPHEME = regex.compile(r"\X")
# The atproto datetime grammar; the SDK's validator below adds the calendar checks.
_DATETIME = re.compile(
    r"^[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9](\.[0-9]+)?"
    r"(?P<offset>Z|[+-][0-2][0-9]:[0-5][0-9])$"
)
# The SDK only checks string formats when asked through a pydantic validation
# context; this stand-in carries that opt-in so its public validators can be reused.
_SDK_PREFIX = re.compile(r"^Invalid [^:]*: ")
_STRICT = SimpleNamespace(context={string_formats._OPT_IN_KEY: True})


class _Fail(Exception):
    """A validation failure; ``path`` is filled innermost-first while unwinding."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str | int] = []


def _format_path(path: list[str | int]) -> str:
    out = []
    for seg in reversed(path):
        if isinstance(seg, int):
            out.append(f"[{seg}]")
        else:
            name = str(seg)
            if len(name) > _MAX_KEY_IN_PATH:
                name = name[:_MAX_KEY_IN_PATH] + "…"
            out.append(f".{name}" if out else name)
    return "".join(out)


# ---------------------------------------------------------------- data model


def _check_int(v: int) -> None:
    if not -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT:
        raise _Fail("must be an integer between -(2^53-1) and 2^53-1")


def _check_str(v: str) -> None:
    # A lone surrogate (e.g. from JSON "\ud800") is not UTF-8 and cannot be encoded.
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise _Fail("must be valid UTF-8 (it contains a lone surrogate)") from None


def _check_cid(v: Any) -> None:
    if not isinstance(v, str):
        raise _Fail("must be a CID string")
    try:
        libipld.decode_cid(v)
    except Exception:  # libipld raises ValueError or its own errors for junk
        raise _Fail("must be a valid CID") from None


def _check_link(v: Any) -> None:
    if not isinstance(v, dict) or len(v) != 1 or "$link" not in v:
        raise _Fail('must be a CID link {"$link": cid}')
    try:
        _check_cid(v["$link"])
    except _Fail as e:
        e.path.append("$link")
        raise


def _decode_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if not isinstance(v, dict) or len(v) != 1 or not isinstance(v.get("$bytes"), str):
        raise _Fail('must be bytes {"$bytes": base64}')
    s = v["$bytes"]
    try:
        # atproto writes base64 without padding; accept it either way.
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _Fail("must be valid base64 in $bytes") from None


def _check_blob(v: Any) -> None:
    if not isinstance(v, dict) or v.get("$type") != "blob":
        raise _Fail('must be a blob {"$type": "blob", "ref", "mimeType", "size"}')
    for key in ("ref", "mimeType", "size"):
        if key not in v:
            f = _Fail("is required")
            f.path.append(key)
            raise f
    try:
        _check_link(v["ref"])
    except _Fail as e:
        e.path.append("ref")
        raise
    mime, size = v["mimeType"], v["size"]
    if not isinstance(mime, str) or "/" not in mime:
        f = _Fail("must be a MIME type")
        f.path.append("mimeType")
        raise f
    if type(size) is not int or size < 0:
        f = _Fail("must be a non-negative integer")
        f.path.append("size")
        raise f
    for key, item in v.items():
        if key not in ("$type", "ref", "mimeType", "size"):
            _check_data_at(item, key, 1)


def _check_data_at(v: Any, key: str | int, depth: int) -> None:
    try:
        _check_data(v, depth)
    except _Fail as e:
        e.path.append(key)
        raise


def _check_data(v: Any, depth: int = 0) -> None:
    """Any atproto data-model value: what unknown fields and open unions may hold."""
    t = type(v)
    if t is str:
        _check_str(v)
    elif t is int:
        _check_int(v)
    elif t is bool or v is None or t is bytes:
        pass
    elif t is float:
        raise _Fail("must not be a float (the atproto data model has no floats)")
    elif t is dict:
        if depth >= _MAX_DEPTH:
            raise _Fail(f"is nested more than {_MAX_DEPTH} levels deep")
        for k in v:
            if not isinstance(k, str):
                raise _Fail("must have only string keys")
        if "$type" in v:
            typ = v["$type"]
            if not isinstance(typ, str) or not typ:
                f = _Fail("must be a non-empty string")
                f.path.append("$type")
                raise f
            if typ == "blob":
                _check_blob(v)
                return
        # A "$link" or "$bytes" key makes the object a link or bytes: nothing else may
        # stand beside it (the interop suite's data-model rules).
        if "$link" in v:
            _check_link(v)
            return
        if "$bytes" in v:
            _decode_bytes(v)
            return
        for k, item in v.items():
            _check_data_at(item, k, depth + 1)
    elif t is list:
        if depth >= _MAX_DEPTH:
            raise _Fail(f"is nested more than {_MAX_DEPTH} levels deep")
        for i, item in enumerate(v):
            _check_data_at(item, i, depth + 1)
    else:
        raise _Fail(f"must be a JSON value, not {t.__name__}")


_FRAGMENT = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]*$")


def _is_type_name(typ: str) -> bool:
    """``com.example.def`` or ``com.example.doc#def``: what a union's ``$type`` may name."""
    nsid, sep, fragment = typ.partition("#")
    if sep and _FRAGMENT.match(fragment) is None:
        return False
    return _sdk_format(string_formats.validate_nsid)(nsid) is None


# ---------------------------------------------------------------- primitives


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null" if v is None else type(v).__name__


def _expect(v: Any, what: str) -> _Fail:
    if isinstance(v, float):
        return _Fail(f"must be {what} (the atproto data model has no floats)")
    return _Fail(f"must be {what}, not {_type_name(v)}")


def _sdk_format(fn: Callable[[str, Any], str]) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            fn(v, _STRICT)
        except ValueError as e:
            # "Invalid datetime: must include timezone" -> "must include timezone"
            return _SDK_PREFIX.sub("", str(e))
        return None

    return check


def _datetime(v: str) -> str | None:
    m = _DATETIME.match(v)
    if not m:
        return "expected a form like 2026-01-01T00:00:00.000Z"
    if v.startswith("0000"):
        # Year 0000 is valid (the interop fixtures), which Python's datetime cannot hold:
        # check the calendar on year 2000, which has the same leap rule, and refuse an
        # offset that puts the instant before 0000-01-01T00:00Z.
        err = _sdk_datetime("2000" + v[4:])
        if err is None and m["offset"][0] == "+" and v[5:10] == "01-01":
            minutes = int(v[11:13]) * 60 + int(v[14:16])
            if minutes < int(m["offset"][1:3]) * 60 + int(m["offset"][4:6]):
                return "is before year 0000 in UTC"
        return err
    return _sdk_datetime(v)


def _cid_format(v: str) -> str | None:
    try:
        _check_cid(v)
    except _Fail as e:
        return e.message
    return None


def _at_identifier(v: str) -> str | None:
    if v.startswith("did:"):
        return _sdk_format(string_formats.validate_did)(v)
    return _sdk_format(string_formats.validate_handle)(v)


_sdk_datetime = _sdk_format(string_formats.validate_datetime)

_FORMATS: dict[str, Callable[[str], str | None]] = {
    "datetime": _datetime,
    "uri": _sdk_format(string_formats.validate_uri),
    "at-uri": _sdk_format(string_formats.validate_at_uri),
    "did": _sdk_format(string_formats.validate_did),
    "handle": _sdk_format(string_formats.validate_handle),
    "at-identifier": _at_identifier,
    "nsid": _sdk_format(string_formats.validate_nsid),
    "cid": _cid_format,
    "tid": _sdk_format(string_formats.validate_tid),
    "record-key": _sdk_format(string_formats.validate_record_key),
    "language": _sdk_format(string_formats.validate_language),
}


def _graphemes(v: str) -> int:
    return len(_GRAPHEME.findall(v))


def _compile_string(d: lex.LexString) -> Check:
    max_len, min_len = d.max_length, d.min_length
    max_g, min_g = d.max_graphemes, d.min_graphemes
    enum = frozenset(d.enum) if d.enum is not None else None
    enum_text = ", ".join(d.enum or ())
    const = d.const
    if d.format is not None and d.format not in _FORMATS:
        raise ValueError(f"unsupported string format {d.format!r}")
    fmt = _FORMATS.get(d.format) if d.format else None
    fmt_name = d.format

    def check(v: Any) -> None:
        if type(v) is not str:
            raise _expect(v, "a string")
        _check_str(v)
        if const is not None and v != const:
            raise _Fail(f"must be {json.dumps(const)}")
        if enum is not None and v not in enum:
            raise _Fail(f"must be one of {enum_text}")
        n = len(v)
        # maxLength counts UTF-8 bytes; a code point is at most 4 bytes, so
        # short strings skip the encode.
        if max_len is not None and n * 4 > max_len:
            if len(v.encode("utf-8")) > max_len:
                raise _Fail(f"must not be longer than {max_len} bytes (UTF-8)")
        if min_len is not None and n < min_len:
            if len(v.encode("utf-8")) < min_len:
                raise _Fail(f"must not be shorter than {min_len} bytes (UTF-8)")
        # A grapheme holds at least one code point: only count when it can matter.
        if max_g is not None and n > max_g and _graphemes(v) > max_g:
            raise _Fail(f"must not be longer than {max_g} graphemes")
        if min_g is not None and (n < min_g or _graphemes(v) < min_g):
            raise _Fail(f"must not be shorter than {min_g} graphemes")
        if fmt is not None:
            err = fmt(v)
            if err is not None:
                raise _Fail(f"must be a valid {fmt_name}: {err}")

    return check


def _compile_integer(d: lex.LexInteger) -> Check:
    lo, hi, const = d.minimum, d.maximum, d.const
    enum = frozenset(d.enum) if d.enum is not None else None
    enum_text = ", ".join(map(str, d.enum or ()))

    def check(v: Any) -> None:
        if type(v) is not int:
            raise _expect(v, "an integer")
        _check_int(v)
        if const is not None and v != const:
            raise _Fail(f"must be {const}")
        if enum is not None and v not in enum:
            raise _Fail(f"must be one of {enum_text}")
        if lo is not None and v < lo:
            raise _Fail(f"must be >= {lo}")
        if hi is not None and v > hi:
            raise _Fail(f"must be <= {hi}")

    return check


def _compile_boolean(d: lex.LexBoolean) -> Check:
    const = d.const

    def check(v: Any) -> None:
        if type(v) is not bool:
            raise _expect(v, "a boolean")
        if const is not None and v is not const:
            raise _Fail(f"must be {json.dumps(const)}")

    return check


def _compile_bytes(d: lex.LexBytes) -> Check:
    max_len, min_len = d.max_length, d.min_length

    def check(v: Any) -> None:
        n = len(_decode_bytes(v))
        if max_len is not None and n > max_len:
            raise _Fail(f"must not be longer than {max_len} bytes")
        if min_len is not None and n < min_len:
            raise _Fail(f"must not be shorter than {min_len} bytes")

    return check


def _accepts(patterns: list[str]) -> Callable[[str], bool]:
    exact = {p for p in patterns if not p.endswith("/*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("/*") and p != "*/*")
    if "*/*" in patterns:
        return lambda mime: True
    return lambda mime: mime in exact or (bool(prefixes) and mime.startswith(prefixes))


def _is_legacy_blob(v: Any) -> bool:
    """The pre-2023 blob form ``{"cid": ..., "mimeType": ...}``, still found in old repos."""
    return type(v) is dict and len(v) == 2 and "cid" in v and "mimeType" in v


def _check_legacy_blob(v: dict[str, Any]) -> None:
    try:
        _check_cid(v["cid"])
    except _Fail as e:
        e.path.append("cid")
        raise
    if not isinstance(v["mimeType"], str) or "/" not in v["mimeType"]:
        f = _Fail("must be a MIME type")
        f.path.append("mimeType")
        raise f


def _compile_blob(d: lex.LexBlob) -> Check:
    accept = _accepts(d.accept) if d.accept else None
    accept_text = ", ".join(d.accept or [])
    max_size = d.max_size

    def check(v: Any) -> None:
        if _is_legacy_blob(v):
            # Read as a PDS reads it; writes refuse it (recordstore.write.blob_refs).
            _check_legacy_blob(v)
            if accept is not None and not accept(v["mimeType"]):
                f = _Fail(f"must be one of {accept_text}")
                f.path.append("mimeType")
                raise f
            return
        _check_blob(v)
        if accept is not None and not accept(v["mimeType"]):
            f = _Fail(f"must be one of {accept_text}")
            f.path.append("mimeType")
            raise f
        if max_size is not None and v["size"] > max_size:
            raise _Fail(f"must not be larger than {max_size} bytes")

    return check


def _check_cid_link(v: Any) -> None:
    _check_link(v)


def _check_unknown(v: Any) -> None:
    if type(v) is not dict:
        raise _expect(v, "an object")
    _check_data(v)


# ---------------------------------------------------------------- the compiler


class _Compiler:
    """Turns parsed lexicon docs into checks; refs resolve through ``self.defs``."""

    def __init__(self, docs: list[lex.LexiconDoc]) -> None:
        self.docs = {doc.id: doc for doc in docs}
        self.defs: dict[str, Check] = {}

    @staticmethod
    def full_ref(doc_id: str, ref: str) -> str:
        nsid, _, name = ref.partition("#")
        return f"{nsid or doc_id}#{name or 'main'}"

    def ref(self, doc_id: str, ref: str) -> Check:
        target = self.full_ref(doc_id, ref)
        if target not in self.defs:
            # A cell first, so that a def referring to itself compiles.
            cell: list[Check] = []
            self.defs[target] = lambda v: cell[0](v)
            nsid, _, name = target.partition("#")
            cell.append(self.node(nsid, self.docs[nsid].defs[name]))
            self.defs[target] = cell[0]
        return self.defs[target]

    def node(self, doc_id: str, d: Any) -> Check:
        if isinstance(d, lex.LexString):
            return _compile_string(d)
        if isinstance(d, lex.LexInteger):
            return _compile_integer(d)
        if isinstance(d, lex.LexBoolean):
            return _compile_boolean(d)
        if isinstance(d, lex.LexBytes):
            return _compile_bytes(d)
        if isinstance(d, lex.LexBlob):
            return _compile_blob(d)
        if isinstance(d, lex.LexCidLink):
            return _check_cid_link
        if isinstance(d, lex.LexUnknown):
            return _check_unknown
        if isinstance(d, lex.LexObject):
            return self.object(doc_id, d)
        if isinstance(d, lex.LexArray):
            return self.array(doc_id, d)
        if isinstance(d, lex.LexRef):
            return self.lazy_ref(doc_id, d.ref)
        if isinstance(d, lex.LexRefUnion):
            return self.union(doc_id, d)
        if isinstance(d, lex.LexRecord):
            return self.object(doc_id, d.record)
        raise ValueError(f"{doc_id}: cannot validate values of a {d.type!r} def")

    def lazy_ref(self, doc_id: str, ref: str) -> Check:
        resolved: list[Check] = []

        def check(v: Any) -> None:
            if not resolved:
                resolved.append(self.ref(doc_id, ref))
            resolved[0](v)

        return check

    def object(self, doc_id: str, d: lex.LexObject) -> Check:
        props = {name: self.node(doc_id, p) for name, p in d.properties.items()}
        required = tuple(d.required or ())
        nullable = frozenset(d.nullable or ())

        def check(v: Any) -> None:
            if type(v) is not dict:
                raise _expect(v, "an object")
            for name in required:
                if name not in v:
                    f = _Fail("is required")
                    f.path.append(name)
                    raise f
            for key, item in v.items():
                c = props.get(key)
                try:
                    if c is not None:
                        if item is None and key in nullable:
                            continue
                        c(item)
                    elif key == "$type":
                        if type(item) is not str or not item:
                            raise _Fail("must be a non-empty string")
                    else:
                        if type(key) is not str:
                            raise _Fail("must have only string keys")
                        _check_data(item, 1)
                except _Fail as e:
                    e.path.append(key)
                    raise

        return check

    def array(self, doc_id: str, d: lex.LexArray) -> Check:
        item_check = self.node(doc_id, d.items)
        max_len, min_len = d.max_length, d.min_length

        def check(v: Any) -> None:
            if type(v) is not list:
                raise _expect(v, "an array")
            if max_len is not None and len(v) > max_len:
                raise _Fail(f"must not have more than {max_len} items")
            if min_len is not None and len(v) < min_len:
                raise _Fail(f"must not have fewer than {min_len} items")
            for i, item in enumerate(v):
                try:
                    item_check(item)
                except _Fail as e:
                    e.path.append(i)
                    raise

        return check

    def union(self, doc_id: str, d: lex.LexRefUnion) -> Check:
        targets: dict[str, Check] = {}
        names = []
        for ref in d.refs:
            full = self.full_ref(doc_id, ref)
            c = self.lazy_ref(doc_id, ref)
            targets[full] = c
            # A `$type` names a main def by its bare NSID.
            if full.endswith("#main"):
                full = full[: -len("#main")]
                targets[full] = c
            names.append(full)
        closed = bool(d.closed)
        expected = ", ".join(names)

        def check(v: Any) -> None:
            if type(v) is not dict:
                raise _expect(v, "an object")
            typ = v.get("$type")
            if typ is None:
                raise _Fail(f"must have a $type (one of {expected})")
            if type(typ) is not str or not typ:
                f = _Fail("must be a non-empty string")
                f.path.append("$type")
                raise f
            c = targets.get(typ)
            if c is not None:
                c(v)
            elif closed:
                f = _Fail(f"must be one of {expected}")
                f.path.append("$type")
                raise f
            else:
                # Open union: an unknown variant is kept as long as it is valid data
                # and its $type names a lexicon def (an NSID, at most one #fragment).
                if not _is_type_name(typ):
                    f = _Fail("must be an NSID, optionally with one #fragment")
                    f.path.append("$type")
                    raise f
                _check_data(v)

        return check


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
    compiler = _Compiler(docs)
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


def check_format(name: str, value: str) -> str | None:
    """Why ``value`` is not a valid string of lexicon format ``name`` (None: it is)."""
    check = _FORMATS.get(name)
    if check is None:
        raise ValueError(f"unknown string format {name!r}")
    if not isinstance(value, str):
        return "must be a string"
    return check(value)


def validate_data(value: Any) -> None:
    """Check that ``value`` is an atproto data-model object; raise InvalidRecord.

    The data-model rules only (no lexicon): no floats, ``$link``/``$bytes``/blob shapes,
    a ``$type`` that is a non-empty string, bounded depth.
    """
    try:
        if type(value) is not dict:
            raise _expect(value, "an object")
        _check_data(value)
    except _Fail as e:
        path = _format_path(e.path) or "value"
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
            raise _expect(value, "an object")
        typ = value.get("$type", collection)
        if typ != collection:
            f = _Fail(f"must be {collection}")
            f.path.append("$type")
            raise f
        check = schema.get(collection)
        if check is None:
            _check_data(value)
        else:
            check(value)
    except _Fail as e:
        path = _format_path(e.path) or "record"
        message = f"{path} {e.message}"
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 1] + "…"
        raise InvalidRecord(message) from None
    except RecursionError:
        raise InvalidRecord("record is nested too deeply") from None
