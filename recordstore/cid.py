"""CIDs of records and blobs, computed as a PDS computes them (thin, over libipld).

A record travels as JSON, where a link is ``{"$link": "<cid>"}`` and bytes are
``{"$bytes": "<base64>"}``. Its CID is that of the IPLD data model form encoded as
DAG-CBOR: sha-256, CIDv1, codec dag-cbor, base32 (``bafyrei...``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Any

import libipld

__all__ = ["blob_cid", "encode_record", "ipld_to_json", "json_to_ipld", "record_cid"]

_DAG_CBOR = 0x71
_RAW = 0x55
_SHA2_256 = 0x12
_TAG_42 = b"\xd8\x2a"  # CBOR tag of a CID link


def record_cid(value: dict[str, Any]) -> str:
    """The CID of a JSON record. ValueError if it is not atproto data (e.g. a float)."""
    if _plain(value):
        # Nothing to convert: libipld encodes the JSON value as it is (4.5 µs a reply
        # record here, against 9.7 through the converted copy).
        return _cid(_DAG_CBOR, libipld.encode_dag_cbor(value))
    return _cid(_DAG_CBOR, encode_record(value))


def blob_cid(data: bytes) -> str:
    """The CID of a blob: CIDv1, raw codec, sha-256 (``bafkrei...``)."""
    return _cid(_RAW, data)


def encode_record(value: dict[str, Any]) -> bytes:
    """The DAG-CBOR bytes of a JSON record."""
    swaps: list[tuple[bytes, bytes]] = []
    encoded = libipld.encode_dag_cbor(_to_ipld(value, swaps))
    # See _shield: put back the byte strings libipld would have taken for links.
    for placeholder, real in swaps:
        if encoded.count(placeholder) != 1:  # pragma: no cover - 2^-180 odds
            raise ValueError("could not encode a byte string unambiguously")
        encoded = encoded.replace(placeholder, real)
    return encoded


def json_to_ipld(value: Any) -> Any:
    """JSON form -> IPLD data model: ``$link`` -> CID bytes, ``$bytes`` -> bytes.

    libipld represents a link as the CID's binary form (a ``bytes``); see
    :func:`encode_record` for why bytes that look like a CID need care.
    """
    return _to_ipld(value, None)


def ipld_to_json(value: Any) -> Any:
    """IPLD data model (as libipld decodes it) -> JSON form.

    libipld decodes links and byte strings both to ``bytes``; a byte string that
    parses as a CID is taken for a link, the same guess libipld makes on encoding.
    """
    if isinstance(value, dict):
        return {k: ipld_to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ipld_to_json(v) for v in value]
    if isinstance(value, bytes):
        if _looks_like_cid(value):
            return {"$link": libipld.encode_cid(value)}
        return {"$bytes": base64.b64encode(value).decode().rstrip("=")}
    return value


def _cid(codec: int, data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return libipld.encode_cid(bytes((1, codec, _SHA2_256, len(digest))) + digest)


def _plain(value: Any) -> bool:
    """Whether ``value`` is its own IPLD form: only dicts with string keys, lists, strings,
    integers, booleans and None, and no ``$link`` or ``$bytes`` object. Anything else
    (a float, a tuple, a subclass) goes through :func:`_to_ipld`, which converts or refuses it."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            if len(v) == 1 and ("$link" in v or "$bytes" in v):
                return False
            for k, item in v.items():
                if type(k) is not str:
                    return False
                stack.append(item)
        elif t is list:
            stack.extend(v)
        elif t is not str and t is not int and t is not bool and v is not None:
            return False
    return True


def _to_ipld(value: Any, swaps: list[tuple[bytes, bytes]] | None) -> Any:
    if isinstance(value, dict):
        if len(value) == 1:
            if "$link" in value:
                return _link(value["$link"])
            if "$bytes" in value:
                data = _bytes(value["$bytes"])
                return _shield(data, swaps) if swaps is not None else data
        return {_key(k): _to_ipld(v, swaps) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_ipld(v, swaps) for v in value]
    if isinstance(value, float):
        raise ValueError(f"floats are not allowed in atproto records: {value!r}")
    if value is None or isinstance(value, str | int | bool):
        return value
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise ValueError(f"object keys must be strings, got {key!r}")
    return key


def _link(cid: Any) -> bytes:
    if not isinstance(cid, str):
        raise ValueError(f"$link must be a CID string, got {cid!r}")
    try:
        libipld.decode_cid(cid)
        # A CIDv0 ("Qm...") is a bare base58btc multihash without a multibase prefix.
        return libipld.decode_multibase("z" + cid if cid.startswith("Qm") else cid)[1]
    except ValueError as e:
        raise ValueError(f"$link is not a CID: {cid!r} ({e})") from None


def _bytes(b64: Any) -> bytes:
    if not isinstance(b64, str):
        raise ValueError(f"$bytes must be a base64 string, got {b64!r}")
    try:
        # atproto writes base64 without padding; accept either.
        return base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)
    except binascii.Error as e:
        raise ValueError(f"$bytes is not base64: {e}") from None


def _looks_like_cid(data: bytes) -> bool:
    return libipld.encode_dag_cbor(data).startswith(_TAG_42)


def _shield(data: bytes, swaps: list[tuple[bytes, bytes]]) -> bytes:
    """A stand-in for byte strings that libipld would encode as a CID link.

    libipld encodes any ``bytes`` that parse as a CID as a link (tag 42). A nonce
    or ciphertext can happen to parse as one, which would give the record the
    wrong CID. The stand-in has the same length (so the same CBOR header) and a
    0x00 first byte, which no CID has; it is swapped back after encoding.
    """
    if not _looks_like_cid(data):
        return data
    placeholder = b"\x00" + os.urandom(len(data) - 1)
    swaps.append((placeholder, data))
    return placeholder
