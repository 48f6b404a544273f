"""Hostile input against a real ``turnd serve`` on loopback.

- The whole HTTP API (``/api``, XRPC, the echo provider, ops routes) fuzzed from its
  own OpenAPI document with schemathesis, valid and invalid inputs: never a 5xx.
- Oversized bodies (413), deep nesting, invalid UTF-8, 100 000 parts, unknown
  ``$type``s, keys crafted by a client (a user record at ``<key>.r0``, ``..``,
  600-character keys), a malformed record written straight into the store's file:
  clear 4xx answers or error replies, never a 500, and nothing written but what is
  valid (the store's keys are compared before and after).
- Two accounts: bob's token and bob's session reach nothing of alice's, streams included.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings

from recordstore import InvalidRecord
from recordstore.lexicon import validate_record
from recordstore.local import DB_NAME
from testbed.fakemodel import FakeModel
from tests.support.accounts import ALICE, ALICE_PASSWORD, ALICE_TOKEN, BOB, BOB_PASSWORD, BOB_TOKEN
from tests.support.records import MESSAGE, TEXT, now_iso, user_message
from tests.support.reliability import Turnd, wait_until
from turns.tls import tls_context

pytestmark = pytest.mark.reliability

FUZZ_EXAMPLES = 30  # per operation and generation mode


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Turnd]:
    tmp = tmp_path_factory.mktemp("hostile")
    with FakeModel() as fake:
        d = Turnd(tmp, "hostile", tmp / "data", fake.base_url)
        d.start()
        # Logged in before the fuzz: its wrong passwords lock logins from this address
        # for 5 minutes (SPEC §12), and its deleteSession ends the fuzz's own session.
        _SESSIONS.clear()
        for handle, password in (("alice.test", ALICE_PASSWORD), ("bob.test", BOB_PASSWORD)):
            _SESSIONS[handle] = _login(d, handle, password)
        try:
            yield d
        finally:
            code = d.stop()
            d.kill()
        assert code == 0, d.logs()[-3000:]


_SESSIONS: dict[str, str] = {}


def _session(d: Turnd, handle: str, password: str) -> str:
    return _SESSIONS.get(handle) or _login(d, handle, password)


def _login(d: Turnd, handle: str, password: str) -> str:
    r = httpx.post(
        f"{d.url}/xrpc/com.atproto.server.createSession",
        json={"identifier": handle, "password": password}, verify=tls_context(),
    )
    assert r.status_code == 200, r.text
    return r.json()["accessJwt"]


def _keys(d: Turnd) -> set[tuple[str, ...]]:
    """(did, space, collection, key, cid) of every record; a conversationRef's CID is left
    out (turnd touches its ``updatedAt`` just after a reply is written)."""
    with sqlite3.connect(d.data / DB_NAME) as db:
        rows = db.execute("SELECT did, space, collection, key, cid FROM records").fetchall()
    return {(*r[:4], "" if r[2].endswith("conversationRef") else r[4]) for r in rows}


def _error_shape(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("message"), str), body


# -- schemathesis --------------------------------------------------------------------------


def _converse(d: Turnd, title: str, text: str) -> tuple[str, dict[str, Any]]:
    """A new conversation titled ``title`` and the posted answer to ``text`` in it."""
    api = d.client()
    skey = api.post("/api/conversations", json={"title": title}).json()["skey"]
    posted = api.post(
        f"/api/conversations/{skey}/messages",
        json={"parts": [{"$type": TEXT, "text": text}], "generation": {}},
    ).json()
    return skey, posted


def test_openapi_fuzz_never_500(daemon: Turnd) -> None:
    schema = schemathesis.openapi.from_url(f"{daemon.url}/openapi.json")
    jwt = _login(daemon, "alice.test", ALICE_PASSWORD)  # its own: the fuzz may delete it
    # Something real to aim at: a conversation with a message and a finished reply.
    skey, posted = _converse(daemon, "fuzz", "hi")
    cases: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.path for op in operations]
    for op in operations:
        auth = jwt if op.path.startswith("/xrpc/") else ALICE_TOKEN
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            path_parameters = None
            if "{skey}" in op.path and mode is schemathesis.GenerationMode.POSITIVE:
                # Half the positive cases land on the real conversation and keys.
                path_parameters = {"skey": skey}
                if "{key}" in op.path:
                    path_parameters["key"] = posted["userKey"]
                if "{replyKey}" in op.path:
                    path_parameters["replyKey"] = posted["replyKey"]
            strategies = [op.as_strategy(generation_mode=mode)]
            if path_parameters:
                strategies.append(
                    op.as_strategy(generation_mode=mode, path_parameters=path_parameters)
                )
            for strategy in strategies:
                try:
                    _fuzz_one(daemon, strategy, auth, op, cases, statuses, failures)
                except Exception as err:  # nothing to negate (no parameters): Unsatisfiable
                    if "Unsatisfiable" not in type(err).__name__:
                        raise
    assert not failures, failures[:10]
    total = sum(cases.values())
    print(f"\nschemathesis: {total} cases over {len(operations)} operations; "
          f"statuses {dict(sorted(statuses.items()))}")
    assert total >= 500
    assert httpx.get(f"{daemon.url}/healthz", verify=tls_context()).status_code == 200
    assert "unhandled error" not in daemon.logs()


def _fuzz_one(
    d: Turnd, strategy: Any, auth: str, op: Any, cases: Counter[str], statuses: Counter[int],
    failures: list[str],
) -> None:
    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(case: Any) -> None:
        cases[f"{op.method} {op.path}"] += 1
        headers = {"Authorization": f"Bearer {auth}"}
        if "/stream" in op.path:
            headers["Accept"] = "text/event-stream"
        try:
            response = _call(case, d.url, headers, streams=op.path.endswith(("/events", "/stream")))
        except Exception as err:  # the client refusing to send it is not the server's fault
            if "Invalid" in type(err).__name__ or "Encode" in type(err).__name__:
                return
            raise
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: "
                f"{response.text[:200]}"
            )

    run()


def _call(case: Any, base_url: str, headers: dict[str, str], *, streams: bool) -> Any:
    """The case's request. schemathesis reads an event stream until it ends or its read
    timeout passes: a quiet account stream (the keepalive comes every 15 s) held each
    positive case 15 s, over a minute of the run waiting. A stream's status and first
    bytes arrive at once, so its read timeout is 2 s; one whose headers were later than
    that (a loaded machine) is asked again with the 15 s of every other request."""
    if streams:
        try:
            return case.call(base_url=base_url, headers=headers, timeout=(15, 2))
        except requests.exceptions.ReadTimeout:
            pass
    return case.call(base_url=base_url, headers=headers, timeout=15)


# -- crafted requests ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conversation(daemon: Turnd) -> dict[str, Any]:
    skey, posted = _converse(daemon, "hostile", "hello")
    wait_until(
        lambda: _status(daemon, skey, posted["replyKey"]) == "complete", 15, "the first reply"
    )
    return {"skey": skey, **posted}


def _status(d: Turnd, skey: str, key: str) -> str | None:
    with sqlite3.connect(d.data / DB_NAME) as db:
        row = db.execute(
            "SELECT value FROM records WHERE space=? AND collection=? AND key=?",
            (skey, MESSAGE, key),
        ).fetchone()
    return json.loads(row[0]).get("status") if row else None


def test_refused_bodies_write_nothing(daemon: Turnd, conversation: dict[str, Any]) -> None:
    api = daemon.client()
    skey = conversation["skey"]
    jwt = _session(daemon, "alice.test", ALICE_PASSWORD)
    xrpc = {"Authorization": f"Bearer {jwt}", "Content-Type": "application/json"}
    messages = f"/api/conversations/{skey}/messages"
    json_headers = {"Content-Type": "application/json"}
    deep = 100_000

    def create(record: Any, rkey: str | None = None) -> bytes:
        body = {"repo": ALICE, "collection": MESSAGE, "rkey": rkey or f"{skey}:3zzzzzzzzzzz2",
                "record": record}
        return json.dumps(body).encode()

    def chunks(data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), 65536):
            yield data[i : i + 65536]

    big = json.dumps({"parts": [{"$type": TEXT, "text": "x" * 2_000_000}]}).encode()
    nested_part = f'{{"$type": "{TEXT}", "text": "a", "x": {"[" * 5000}1{"]" * 5000}}}'
    requests: list[tuple[str, str, str, bytes, dict[str, str], set[int]]] = [
        ("oversized, declared", "POST", messages, big, json_headers, {413}),
        ("oversized, chunked", "POST", messages, big, json_headers, {413}),
        ("oversized XRPC record", "POST", "/xrpc/com.atproto.repo.createRecord",
         create(user_message("y" * 2_000_000)), xrpc, {413}),
        ("a record over the lexicon's limits", "POST", "/xrpc/com.atproto.repo.createRecord",
         create(user_message("z" * 600_000)), xrpc, {400}),
        ("deeply nested JSON", "POST", messages,
         b'{"parts": [' + b"[" * deep + b"]" * deep + b"]}", json_headers, {400, 422}),
        ("deeply nested part", "POST", messages,
         f'{{"parts": [{nested_part}]}}'.encode(), json_headers, {400, 422}),
        ("deeply nested XRPC record", "POST", "/xrpc/com.atproto.repo.createRecord",
         create({"$type": MESSAGE}).replace(b'{"$type"', b'{"deep": ' + b"[" * 5000 + b"1"
                                            + b"]" * 5000 + b', "$type"'), xrpc, {400}),
        ("invalid UTF-8", "POST", messages,
         b'{"parts": [{"$type": "' + TEXT.encode() + b'", "text": "\xff\xfe\xc3"}]}',
         json_headers, {400, 422}),
        ("invalid UTF-8 XRPC", "POST", "/xrpc/com.atproto.repo.createRecord",
         create(user_message("ok")).replace(b'"ok"', b'"\xff\xc0\x80"'), xrpc, {400}),
        ("lone surrogate", "POST", messages,
         b'{"parts": [{"$type": "' + TEXT.encode() + b'", "text": "\\ud800"}]}',
         json_headers, {400, 422}),
        ("100 000 parts", "POST", messages,
         json.dumps({"parts": [{}] * 100_000}).encode(), json_headers, {413, 422}),
        ("100 000 parts XRPC", "POST", "/xrpc/com.atproto.repo.createRecord",
         create({**user_message("x"), "content": {
             "$type": "network.sharedcomputer.chat.defs#plainContent", "parts": [{}] * 100_000}}),
         xrpc, {400}),
        ("not JSON", "POST", messages, b"\x00\x01garbage", json_headers, {400, 422}),
        ("a float", "POST", "/xrpc/com.atproto.repo.createRecord",
         create({**user_message("f"), "score": 1.5}), xrpc, {400}),
        ("wrong $type for the collection", "POST", "/xrpc/com.atproto.repo.createRecord",
         create({**user_message("t"), "$type": "network.sharedcomputer.chat.info"}), xrpc, {400}),
        ("record key ..", "POST", "/xrpc/com.atproto.repo.createRecord",
         create(user_message("dots"), rkey=f"{skey}:.."), xrpc, {400}),
        ("record key of 600 characters", "POST", "/xrpc/com.atproto.repo.createRecord",
         create(user_message("long"), rkey=f"{skey}:{'a' * 600}"), xrpc, {400}),
        ("space key of 600 characters", "POST", "/xrpc/com.atproto.repo.createRecord",
         create(user_message("long"), rkey=f"{'s' * 600}:3zzzzzzzzzzz3"), xrpc, {400}),
        ("parent ..", "POST", messages,
         json.dumps({"parent": "..", "parts": [{"$type": TEXT, "text": "p"}]}).encode(),
         json_headers, {400, 404}),
        ("parent of 600 characters", "POST", messages,
         json.dumps({"parent": "p" * 600, "parts": [{"$type": TEXT, "text": "p"}]}).encode(),
         json_headers, {400, 404}),
        ("regenerate ..", "POST", f"/api/conversations/{skey}/messages/%2E%2E/regenerate",
         b"{}", json_headers, {400, 404}),
        ("regenerate a 600-character key", "POST",
         f"/api/conversations/{skey}/messages/{'k' * 600}/regenerate", b"{}", json_headers,
         {400, 404}),
        ("stream of a 600-character key", "GET",
         f"/api/conversations/{skey}/messages/{'k' * 600}.r0/stream", b"", {}, {400, 404}),
        ("conversation key of 600 characters", "GET", f"/api/conversations/{'c' * 600}", b"",
         {}, {400, 404}),
        ("getRecord ..", "GET",
         f"/xrpc/com.atproto.repo.getRecord?repo={ALICE}&collection={MESSAGE}&rkey=..", b"",
         {}, {400}),
        ("an unknown field", "POST", messages,
         json.dumps({"parts": [{"$type": TEXT, "text": "u"}], "sneaky": 1}).encode(),
         json_headers, {422}),
        ("an attempt past 1000", "POST", messages,
         json.dumps({"parts": [{"$type": TEXT, "text": "a"}], "generation": {"attempt": 1001}}
                    ).encode(), json_headers, {422}),
        ("an unknown effort", "POST", messages,
         json.dumps({"parts": [{"$type": TEXT, "text": "a"}], "generation": {"effort": "ultra"}}
                    ).encode(), json_headers, {422}),
    ]
    before = _keys(daemon)
    seen = []
    for name, method, path, body, headers, expected in requests:
        content: Any = chunks(body) if name == "oversized, chunked" else body
        hdrs = dict(headers)
        if "Authorization" not in hdrs:
            hdrs["Authorization"] = f"Bearer {ALICE_TOKEN}"
        r = api.request(method, path, content=content or None, headers=hdrs)
        assert r.status_code in expected, (name, r.status_code, r.text[:300])
        _error_shape(r)
        seen.append(f"{name}: {r.status_code} {r.json()['error']}")
        assert _keys(daemon) == before, f"{name} wrote something"
    assert httpx.get(f"{daemon.url}/healthz", verify=tls_context()).status_code == 200
    assert "unhandled error" not in daemon.logs()
    print("\n" + "\n".join(seen))


def test_deep_nesting_in_the_validator() -> None:
    value: Any = 1
    for _ in range(20_000):
        value = [value]
    with pytest.raises(InvalidRecord):
        validate_record(MESSAGE, {**user_message("d"), "deep": value})


def test_unknown_types_and_crafted_keys(daemon: Turnd, conversation: dict[str, Any]) -> None:
    api = daemon.client()
    skey = conversation["skey"]
    jwt = _session(daemon, "alice.test", ALICE_PASSWORD)
    xrpc = {"Authorization": f"Bearer {jwt}"}

    # An unknown part $type is kept in the record and skipped in the prompt.
    weird = {"$type": "com.example.weird#part", "payload": "kept"}
    r = api.post(
        f"/api/conversations/{skey}/messages",
        json={"parts": [weird, {"$type": TEXT, "text": "and text"}], "generation": {}},
    )
    assert r.status_code == 201, r.text
    posted = r.json()
    wait_until(lambda: _status(daemon, skey, posted["replyKey"]) == "complete", 15, "reply")
    stored = {m["key"]: m["value"] for m in api.get(f"/api/conversations/{skey}").json()["messages"]}
    assert stored[posted["userKey"]]["content"]["parts"][0] == weird

    def create(rkey: str, record: dict[str, Any]) -> None:
        r = httpx.post(
            f"{daemon.url}/xrpc/com.atproto.repo.createRecord",
            headers=xrpc,
            json={"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:{rkey}", "record": record}, verify=tls_context(),
        )
        assert r.status_code == 200, r.text

    # A user record at a reply-shaped key never starts a turn, whatever it asks.
    user_key = "3zzzzzzzzzzz4"
    crafted = f"{user_key}.r0"
    create(crafted, user_message("pretend reply"))
    # A real user message whose reply key the user has already taken: answered, not run.
    squat_key = "3zzzzzzzzzzz5"
    create(f"{squat_key}.r0", {**user_message("squatter", attempt=None), "role": "assistant",
                               "status": "complete"})
    create(squat_key, user_message("squatted"))
    # A plain message after them, answered: the feed, which handles changes in order, has
    # then handled both writes above (a wait on the feed, not a fixed sleep).
    control = "3zzzzzzzzzzz7"
    create(control, user_message("control"))
    wait_until(lambda: _status(daemon, skey, f"{control}.r0") == "complete", 30, "the control")
    keys = {k for (_, space, _, k, _) in _keys(daemon) if space == skey}
    assert f"{crafted}.r0" not in keys  # the record at a reply key started nothing
    assert f"{squat_key}.r1" not in keys
    assert _status(daemon, skey, f"{squat_key}.r0") == "complete"  # the squatter's, untouched
    # A turn the user asks for at a reply key through the API is refused.
    r = api.post(f"/api/conversations/{skey}/messages/{crafted}/regenerate", json={})
    assert r.status_code == 404, r.text

    # A malformed record written straight into the store's file gets an error reply.
    bad_key = "3zzzzzzzzzzz6"
    bad = {**user_message("x"), "content": {"$type": "network.sharedcomputer.chat.defs#plainContent",
                                            "parts": [{"$type": TEXT, "text": 42}]}}
    with sqlite3.connect(daemon.data / DB_NAME) as db:
        db.execute(
            "INSERT INTO records (did, space, collection, key, cid, value) VALUES (?,?,?,?,?,?)",
            (ALICE, skey, MESSAGE, bad_key, "bafyreibogus", json.dumps(bad)),
        )
    wait_until(lambda: _status(daemon, skey, f"{bad_key}.r0") == "error", 15, "the error reply")
    stored = {m["key"]: m["value"] for m in api.get(f"/api/conversations/{skey}").json()["messages"]}
    assert "invalid" in stored[f"{bad_key}.r0"]["error"]
    assert "unhandled error" not in daemon.logs()
    _ = now_iso  # createdAt of the crafted records is now: they are seen live


def test_one_account_reaches_nothing_of_another(
    daemon: Turnd, conversation: dict[str, Any]
) -> None:
    skey, user_key, reply = conversation["skey"], conversation["userKey"], conversation["replyKey"]
    before = _keys(daemon)
    bob = daemon.client(BOB_TOKEN)
    base = f"/api/conversations/{skey}"
    attempts = [
        ("GET", base, None),
        ("POST", f"{base}/messages", {"parts": [{"$type": TEXT, "text": "mine now"}],
                                      "generation": {}}),
        ("POST", f"{base}/messages/{user_key}/regenerate", {}),
        ("POST", f"{base}/messages/{reply}/cancel", None),
        ("GET", f"{base}/messages/{reply}/stream", None),
    ]
    for method, path, body in attempts:
        r = bob.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        _error_shape(r)
    assert skey not in {c["skey"] for c in bob.get("/api/conversations").json()["conversations"]}
    # A live stream of alice's, too.
    alice = daemon.client()
    posted = alice.post(f"{base}/messages", json={
        "parts": [{"$type": TEXT, "text": "again"}], "parent": reply, "generation": {}}).json()
    r = bob.get(f"{base}/messages/{posted['replyKey']}/stream")
    assert r.status_code == 404
    wait_until(lambda: _status(daemon, skey, posted["replyKey"]) == "complete", 15, "reply")
    after_alice = _keys(daemon)

    # Bob's XRPC session cannot write into alice's repo.
    jwt = _session(daemon, "bob.test", BOB_PASSWORD)
    xrpc = {"Authorization": f"Bearer {jwt}"}
    for nsid, body in [
        ("createRecord", {"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:3zzzzzzzzzzz7",
                          "record": user_message("bob was here")}),
        ("putRecord", {"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:{user_key}",
                       "record": user_message("bob was here")}),
        ("deleteRecord", {"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:{user_key}"}),
    ]:
        r = httpx.post(f"{daemon.url}/xrpc/com.atproto.repo.{nsid}", headers=xrpc, json=body, verify=tls_context())
        assert r.status_code in (400, 401, 403), (nsid, r.status_code, r.text)
    # Bob's API token is not an XRPC session, and bob's session is not an API token.
    r = httpx.post(
        f"{daemon.url}/xrpc/com.atproto.repo.createRecord",
        headers={"Authorization": f"Bearer {BOB_TOKEN}"},
        json={"repo": BOB, "collection": MESSAGE, "rkey": f"{skey}:3zzzzzzzzzzz8",
              "record": user_message("x")}, verify=tls_context(),
    )
    assert r.status_code in (400, 401), r.text
    assert httpx.get(f"{daemon.url}/api/conversations", headers=xrpc, verify=tls_context()).status_code == 401
    assert _keys(daemon) == after_alice and before <= after_alice
    assert {k for k in after_alice if k[0] == BOB} <= {k for k in before if k[0] == BOB}
