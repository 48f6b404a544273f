"""Lexicon defs compiled into checks: one small closure per def, compiled once.

A closure returns nothing on success and raises :class:`~recordstore.lexicon_data.Fail`
on the first bad value; containers add their key to the failure's path while it unwinds.
The rules are those of the atproto lexicon spec: ``knownValues`` are open, ``enum`` is
closed, unions are open unless ``closed``, unknown fields are allowed (but must still be
valid data-model values), defaults are never applied.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

from atproto_lexicon import models as lex

from recordstore.lexicon_data import (
    Check,
    Fail,
    check_blob,
    check_cid,
    check_data,
    check_int,
    check_link,
    check_str,
    decode_bytes,
    expect,
)
from recordstore.lexicon_formats import FORMATS, is_type_name

__all__ = ["Compiler"]


@cache
def _grapheme() -> Any:
    # The regex package (for \X) is imported the first time a string's length is near
    # a grapheme limit: most processes never count one, and its import is ~0.1 s of CPU.
    import regex

    return regex.compile(r"\X")


def _graphemes(v: str) -> int:
    return len(_grapheme().findall(v))


def _fixed(const: Any, enum: list[Any] | None, const_text: str) -> Check | None:
    """The check of a def's ``const`` and ``enum`` (None when it has neither)."""
    if const is None and enum is None:
        return None
    allowed = frozenset(enum) if enum is not None else None
    enum_text = ", ".join(map(str, enum or ()))

    def check(v: Any) -> None:
        if const is not None and v != const:
            raise Fail(f"must be {const_text}")
        if allowed is not None and v not in allowed:
            raise Fail(f"must be one of {enum_text}")

    return check


def _compile_string(d: lex.LexString) -> Check:
    max_len, min_len = d.max_length, d.min_length
    max_g, min_g = d.max_graphemes, d.min_graphemes
    fixed = _fixed(d.const, d.enum, json.dumps(d.const))
    if d.format is not None and d.format not in FORMATS:
        raise ValueError(f"unsupported string format {d.format!r}")
    fmt = FORMATS.get(d.format) if d.format else None
    fmt_name = d.format

    def check(v: Any) -> None:
        if type(v) is not str:
            raise expect(v, "a string")
        check_str(v)
        n = len(v)
        if fixed is not None:
            fixed(v)
        # maxLength counts UTF-8 bytes; a code point is at most 4 bytes, so
        # short strings skip the encode.
        if max_len is not None and n * 4 > max_len:
            if len(v.encode("utf-8")) > max_len:
                raise Fail(f"must not be longer than {max_len} bytes (UTF-8)")
        if min_len is not None and n < min_len:
            if len(v.encode("utf-8")) < min_len:
                raise Fail(f"must not be shorter than {min_len} bytes (UTF-8)")
        # A grapheme holds at least one code point: only count when it can matter.
        if max_g is not None and n > max_g and _graphemes(v) > max_g:
            raise Fail(f"must not be longer than {max_g} graphemes")
        if min_g is not None and (n < min_g or _graphemes(v) < min_g):
            raise Fail(f"must not be shorter than {min_g} graphemes")
        if fmt is not None:
            err = fmt(v)
            if err is not None:
                raise Fail(f"must be a valid {fmt_name}: {err}")

    return check


def _compile_integer(d: lex.LexInteger) -> Check:
    lo, hi = d.minimum, d.maximum
    fixed = _fixed(d.const, d.enum, str(d.const))

    def check(v: Any) -> None:
        if type(v) is not int:
            raise expect(v, "an integer")
        check_int(v)
        if fixed is not None:
            fixed(v)
        if lo is not None and v < lo:
            raise Fail(f"must be >= {lo}")
        if hi is not None and v > hi:
            raise Fail(f"must be <= {hi}")

    return check


def _compile_boolean(d: lex.LexBoolean) -> Check:
    const = d.const

    def check(v: Any) -> None:
        if type(v) is not bool:
            raise expect(v, "a boolean")
        if const is not None and v is not const:
            raise Fail(f"must be {json.dumps(const)}")

    return check


def _compile_bytes(d: lex.LexBytes) -> Check:
    max_len, min_len = d.max_length, d.min_length

    def check(v: Any) -> None:
        n = len(decode_bytes(v))
        if max_len is not None and n > max_len:
            raise Fail(f"must not be longer than {max_len} bytes")
        if min_len is not None and n < min_len:
            raise Fail(f"must not be shorter than {min_len} bytes")

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
        check_cid(v["cid"])
    except Fail as e:
        e.path.append("cid")
        raise
    if not isinstance(v["mimeType"], str) or "/" not in v["mimeType"]:
        raise Fail("must be a MIME type", at="mimeType")


def _compile_blob(d: lex.LexBlob) -> Check:
    accept = _accepts(d.accept) if d.accept else None
    accept_text = ", ".join(d.accept or [])
    max_size = d.max_size

    def check(v: Any) -> None:
        # A legacy blob is read as a PDS reads it (writes refuse it: recordstore.write.blob_refs);
        # it has no size.
        legacy = _is_legacy_blob(v)
        if legacy:
            _check_legacy_blob(v)
        else:
            check_blob(v)
        if accept is not None and not accept(v["mimeType"]):
            raise Fail(f"must be one of {accept_text}", at="mimeType")
        if not legacy and max_size is not None and v["size"] > max_size:
            raise Fail(f"must not be larger than {max_size} bytes")

    return check


def _check_cid_link(v: Any) -> None:
    check_link(v)


def _check_unknown(v: Any) -> None:
    if type(v) is not dict:
        raise expect(v, "an object")
    check_data(v)


# ---------------------------------------------------------------- the compiler


class Compiler:
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
                raise expect(v, "an object")
            for name in required:
                if name not in v:
                    raise Fail("is required", at=name)
            for key, item in v.items():
                c = props.get(key)
                try:
                    if c is not None:
                        if item is None and key in nullable:
                            continue
                        c(item)
                    elif key == "$type":
                        if type(item) is not str or not item:
                            raise Fail("must be a non-empty string")
                    else:
                        if type(key) is not str:
                            raise Fail("must have only string keys")
                        check_data(item, 1)
                except Fail as e:
                    e.path.append(key)
                    raise

        return check

    def array(self, doc_id: str, d: lex.LexArray) -> Check:
        item_check = self.node(doc_id, d.items)
        max_len, min_len = d.max_length, d.min_length

        def check(v: Any) -> None:
            if type(v) is not list:
                raise expect(v, "an array")
            if max_len is not None and len(v) > max_len:
                raise Fail(f"must not have more than {max_len} items")
            if min_len is not None and len(v) < min_len:
                raise Fail(f"must not have fewer than {min_len} items")
            for i, item in enumerate(v):
                try:
                    item_check(item)
                except Fail as e:
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
                raise expect(v, "an object")
            typ = v.get("$type")
            if typ is None:
                raise Fail(f"must have a $type (one of {expected})")
            if type(typ) is not str or not typ:
                raise Fail("must be a non-empty string", at="$type")
            c = targets.get(typ)
            if c is not None:
                c(v)
            elif closed:
                raise Fail(f"must be one of {expected}", at="$type")
            else:
                # Open union: an unknown variant is kept as long as it is valid data
                # and its $type names a lexicon def (an NSID, at most one #fragment).
                if not is_type_name(typ):
                    raise Fail("must be an NSID, optionally with one #fragment", at="$type")
                check_data(v)

        return check

