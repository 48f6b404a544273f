"""CIDs as a PDS computes them."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import libipld
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recordstore.cid import blob_cid, encode_record, ipld_to_json, json_to_ipld, record_cid

VECTORS = json.loads((Path(__file__).parent / "vectors" / "cids.json").read_text())["vectors"]
SOME_CID = "bafyreidlpnm5ajxotpgxx4ob3t2d2ujwczow3lvpfzhzazo4ehjba6hbce"


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_reference_pds_vectors(vector: dict[str, Any]) -> None:
    assert record_cid(vector["record"]) == vector["cid"]


def test_record_cid_is_cidv1_dag_cbor_sha256() -> None:
    cid = libipld.decode_cid(record_cid({"a": 1}))
    assert (cid["version"], cid["codec"], cid["hash"]["code"]) == (1, 0x71, 0x12)
    assert cid["hash"]["digest"] == hashlib.sha256(libipld.encode_dag_cbor({"a": 1})).digest()


def test_key_order_does_not_change_the_cid() -> None:
    # DAG-CBOR sorts map keys, so JSON key order is irrelevant.
    assert record_cid({"a": 1, "bb": 2, "c": 3}) == record_cid({"c": 3, "bb": 2, "a": 1})


def test_blob_cid() -> None:
    # The well-known CID of the bytes "hello" (raw codec, sha-256).
    assert blob_cid(b"hello") == "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"
    cid = libipld.decode_cid(blob_cid(b""))
    assert (cid["version"], cid["codec"], cid["hash"]["code"]) == (1, 0x55, 0x12)


def test_links_become_cbor_links() -> None:
    encoded = encode_record({"ref": {"$link": SOME_CID}})
    raw = libipld.decode_multibase(SOME_CID)[1]
    # tag 42, byte string of 0x00 + the binary CID
    assert b"\xd8\x2a\x58\x25\x00" + raw in encoded
    assert encoded == libipld.encode_dag_cbor({"ref": raw})


def test_blob_ref_cid_differs_from_a_string_ref() -> None:
    blob = {"$type": "blob", "ref": {"$link": SOME_CID}, "mimeType": "image/png", "size": 3}
    as_string = {**blob, "ref": SOME_CID}
    assert record_cid(blob) != record_cid(as_string)


def test_bytes_become_cbor_bytes() -> None:
    data = b"\x00\x01nonce"
    unpadded = base64.b64encode(data).decode().rstrip("=")
    assert encode_record({"n": {"$bytes": unpadded}}) == libipld.encode_dag_cbor({"n": data})
    assert record_cid({"n": {"$bytes": unpadded}}) == record_cid(
        {"n": {"$bytes": base64.b64encode(data).decode()}}
    )


def test_bytes_that_parse_as_a_cid_stay_bytes() -> None:
    # A nonce can happen to look like a CID; libipld alone would encode it as a link.
    nonce = bytes([1, 0x55, 0x12, 20]) + bytes(range(20))
    encoded = encode_record({"nonce": {"$bytes": base64.b64encode(nonce).decode()}})
    assert encoded == b"\xa1\x65nonce\x58\x18" + nonce


def test_objects_with_more_keys_are_not_links() -> None:
    value = {"$link": SOME_CID, "other": 1}
    assert encode_record(value) == libipld.encode_dag_cbor(value)


@pytest.mark.parametrize(
    "bad",
    [
        {"x": 1.5},
        {"x": [0.0]},
        {"x": {"$link": "not a cid"}},
        {"x": {"$link": 5}},
        {"x": {"$bytes": "!!!"}},
        {"x": {1, 2}},
    ],
)
def test_not_atproto_data(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        record_cid(bad)


def test_ipld_json_round_trip() -> None:
    value = {
        "$type": "x.y.z",
        "blob": {"$type": "blob", "ref": {"$link": SOME_CID}, "mimeType": "a/b", "size": 1},
        "bytes": {"$bytes": "aGVsbG8"},
        "list": [1, "two", None, True],
    }
    decoded = libipld.decode_dag_cbor(encode_record(value))
    assert ipld_to_json(decoded) == value
    assert json_to_ipld(value)["bytes"] == b"hello"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
        # "$bytes" and "$link" objects are not plain JSON: they encode as bytes and links.
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.text().filter(lambda k: k not in ("$bytes", "$link")), inner, max_size=4),
        max_leaves=20,
    )
)
def test_plain_json_encodes_as_libipld_does(value: Any) -> None:
    assert encode_record(value) == libipld.encode_dag_cbor(value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text()
    | st.builds(lambda cid: {"$link": cid}, st.just(SOME_CID)),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)


@given(_JSON)
def test_a_plain_record_is_encoded_as_it_is_converted(value: Any) -> None:
    # record_cid encodes a value with nothing to convert straight away; the converted
    # copy (every $link a CID) must give the same bytes, with or without links.
    converted = hashlib.sha256(encode_record({"v": value})).digest()
    assert libipld.decode_cid(record_cid({"v": value}))["hash"]["digest"] == converted


@pytest.mark.parametrize(
    "value", [{"x": 1.5}, {"x": float("nan")}, {1: "a"}, {"x": b"raw"}, {"x": [1, {2}]}]
)
def test_what_is_not_plain_json_still_goes_through_the_conversion(value: Any) -> None:
    with pytest.raises(ValueError):
        record_cid(value)


def test_a_tuple_is_converted_to_the_list_it_stands_for() -> None:
    assert record_cid({"x": [1, (2, 3)]}) == record_cid({"x": [1, [2, 3]]})
