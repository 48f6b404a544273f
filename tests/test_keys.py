"""TIDs, record keys, reply keys and the classic-repo mapping."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recordstore import InvalidKey
from recordstore.keys import (
    TID_ALPHABET,
    is_tid,
    message_sort_key,
    new_tid,
    parse_reply_key,
    parse_tid,
    reply_key,
    repo_rkey,
    split_repo_rkey,
    tid_datetime,
    tid_from_parts,
    validate_collection,
    validate_did,
    validate_key,
    validate_space_key,
)

micros = st.integers(0, (1 << 53) - 1)
clock_ids = st.integers(0, 1023)


def test_tid_shape_and_time() -> None:
    tid = new_tid()
    assert len(tid) == 13 and is_tid(tid)
    assert tid[0] in "234567abcdefghij"
    assert set(tid) <= set(TID_ALPHABET)
    assert abs((tid_datetime(tid) - datetime.now(UTC)).total_seconds()) < 5


def test_known_tid() -> None:
    # The atproto spec's example TID; its clock id is in the low 10 bits.
    micros, clock_id = parse_tid("3jzfcijpj2z2a")
    assert tid_from_parts(micros, clock_id) == "3jzfcijpj2z2a"
    assert datetime.fromtimestamp(micros / 1e6, UTC).year == 2023
    assert tid_from_parts(0, 0) == "2222222222222"


def test_tids_strictly_increase_in_a_tight_loop() -> None:
    tids = [new_tid() for _ in range(20_000)]
    assert all(a < b for a, b in zip(tids, tids[1:], strict=False))


def test_tids_strictly_increase_across_threads() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def mint(out: list[str]) -> None:
        for _ in range(2_000):
            out.append(new_tid())

    threads = [threading.Thread(target=mint, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [tid for r in results for tid in r]
    assert len(set(everything)) == len(everything)
    for r in results:  # each thread sees its own TIDs in increasing order
        assert r == sorted(r)


def test_tid_after_a_clock_step_back_still_increases(monkeypatch: pytest.MonkeyPatch) -> None:
    first = new_tid()
    monkeypatch.setattr(time, "time_ns", lambda: 0)
    assert new_tid() > first


@given(micros, clock_ids)
def test_tid_round_trip(us: int, clock_id: int) -> None:
    tid = tid_from_parts(us, clock_id)
    assert is_tid(tid)
    assert parse_tid(tid) == (us, clock_id)


@given(micros, clock_ids, micros, clock_ids)
def test_tid_text_order_is_numeric_order(a: int, ca: int, b: int, cb: int) -> None:
    assert (tid_from_parts(a, ca) < tid_from_parts(b, cb)) == ((a, ca) < (b, cb))


@pytest.mark.parametrize(
    "bad", ["", "3jzfcijpj2z2", "3jzfcijpj2z2aa", "kjzfcijpj2z2a", "3jzfcijpj2z2A", "3jzfcijpj2z21"]
)
def test_not_tids(bad: str) -> None:
    assert not is_tid(bad)
    with pytest.raises(InvalidKey, match="not a TID"):
        parse_tid(bad)


def test_tid_parts_out_of_range() -> None:
    with pytest.raises(ValueError):
        tid_from_parts(1 << 53, 0)
    with pytest.raises(ValueError):
        tid_from_parts(0, 1024)


@pytest.mark.parametrize(
    "key", ["self", "3jzfcijpj2z2a", "a.r0", "a:b", "~x_y-z.", "A" * 512, "...", "a..b"]
)
def test_valid_record_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "length 0"),
        ("A" * 513, "length 513"),
        (".", "reserved"),
        ("..", "reserved"),
        ("a/b", "only A-Z"),
        ("a b", "only A-Z"),
        ("héllo", "only A-Z"),
        ("a#b", "only A-Z"),
        (None, "expected a string"),
    ],
)
def test_invalid_record_keys(key: str, message: str) -> None:
    with pytest.raises(InvalidKey, match=message):
        validate_key(key)


def test_space_keys_refuse_colons() -> None:
    assert validate_space_key("self") == "self"
    with pytest.raises(InvalidKey, match="':'"):
        validate_space_key("a:b")


def test_dids_and_collections() -> None:
    assert validate_did("did:plc:z72i7hdynmk6r22z27h6tvur")
    assert validate_did("did:web:example.com")
    for bad in ["", "plc:abc", "did:PLC:abc", "did:plc:abc/def", "did:plc:"]:
        with pytest.raises(InvalidKey, match="invalid DID"):
            validate_did(bad)
    assert validate_collection("network.sharedcomputer.chat.message")
    for bad in ["message", "network..chat", "network.chat.1message", "a/b.c.d"]:
        with pytest.raises(InvalidKey, match="invalid collection"):
            validate_collection(bad)


def test_reply_keys() -> None:
    assert reply_key("3jzfcijpj2z2a", 0) == "3jzfcijpj2z2a.r0"
    assert reply_key("3jzfcijpj2z2a", 12) == "3jzfcijpj2z2a.r12"
    assert parse_reply_key("3jzfcijpj2z2a.r12") == ("3jzfcijpj2z2a", 12)
    assert parse_reply_key("a.b.r3") == ("a.b", 3)
    for not_reply in ["3jzfcijpj2z2a", "a.r", "a.r01", "a.rx", ".r1", "a.r1001", "a.R1"]:
        assert parse_reply_key(not_reply) is None
    for bad_attempt in [-1, 1001, 1.0, True, "1"]:
        with pytest.raises(InvalidKey):
            reply_key("a", bad_attempt)  # type: ignore[arg-type]
    with pytest.raises(InvalidKey):
        reply_key("a/b", 0)


@given(st.from_regex(r"[A-Za-z0-9._:~-]{1,100}", fullmatch=True), st.integers(0, 1000))
def test_reply_key_round_trip(user_key: str, attempt: int) -> None:
    if user_key in (".", ".."):
        return
    assert parse_reply_key(reply_key(user_key, attempt)) == (user_key, attempt)


def test_attempts_order_by_number() -> None:
    keys = ["k.r10", "k.r2", "k", "k.r0", "k.r1"]
    assert "k.r10" < "k.r2"  # as text: the problem
    assert sorted(keys, key=message_sort_key) == ["k", "k.r0", "k.r1", "k.r2", "k.r10"]


def test_classic_repo_mapping() -> None:
    assert repo_rkey("3m2a4b5c6d7e2", "3m2b4b5c6d7e2") == "3m2a4b5c6d7e2:3m2b4b5c6d7e2"
    assert repo_rkey("self", "self") == "self:self"
    assert split_repo_rkey("3m2a4b5c6d7e2:3m2b4b5c6d7e2.r0") == (
        "3m2a4b5c6d7e2",
        "3m2b4b5c6d7e2.r0",
    )
    # A key within a space may itself hold a colon; the space never does.
    assert split_repo_rkey(repo_rkey("s", "a:b")) == ("s", "a:b")
    with pytest.raises(InvalidKey):
        repo_rkey("a:b", "c")
    with pytest.raises(InvalidKey):
        repo_rkey("s", "..")
    for bad in ["nospace", ":key", "space:", "a/b:c"]:
        with pytest.raises(InvalidKey):
            split_repo_rkey(bad)


@given(
    st.from_regex(r"[A-Za-z0-9._~-]{1,40}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9._:~-]{1,40}", fullmatch=True),
)
def test_classic_repo_round_trip(space: str, key: str) -> None:
    if space in (".", "..") or key in (".", ".."):
        return
    assert split_repo_rkey(repo_rkey(space, key)) == (space, key)
