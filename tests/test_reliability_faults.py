"""Model faults through the real daemon (``turnd serve`` in its own process).

Each fault gets one turn: 429 with ``Retry-After`` (retried, then answered; and
retried until the retries run out), 500, connection refused (a provider on a closed
port), a stream cut mid-way, a stall past ``timeoutSeconds``, a malformed chunk, and
the provider's API key inside an error body (HTTP error, in-stream error, plain-text
body). Each ends in the right status with the parts streamed so far kept, and the key
appears nowhere: not in the records (through the API and in the store's files), not in
the daemon's output, not in the SSE streams, not in ``/metrics``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.fakemodel import FakeModel, Reply
from testbed.ports import free_port
from tests.support.records import TEXT, reply_text
from tests.support.reliability import API_KEY, Turnd
from tests.support.sse import parse_events
from turns.tls import tls_context

pytestmark = pytest.mark.reliability

TIMEOUT_S = 4


@dataclass
class Fault:
    name: str
    replies: list[Reply]
    status: str
    error: str | None  # a piece of the expected error message
    text: str  # the text parts kept
    model: dict[str, str] | None = None


def _faults() -> list[Fault]:
    key_body = {"error": {"message": f"Incorrect API key provided: {API_KEY}.",
                          "type": "invalid_request_error", "code": "invalid_api_key"}}
    return [
        Fault("429 then answered", [
            Reply.error(429, "Rate limit reached", headers={"Retry-After": "1"}),
            Reply.text(["after ", "retry"]),
        ], "complete", None, "after retry"),
        Fault("429 past the retries", [
            Reply.error(429, "Rate limit reached", headers={"Retry-After": "1"}),
            Reply.error(429, "Rate limit reached", headers={"Retry-After": "1"}),
        ], "error", "429", ""),
        Fault("500", [Reply.error(500), Reply.error(500)], "error", "500", ""),
        Fault("connection refused", [], "error", "could not reach", "",
              model={"provider": "dead", "id": "m"}),
        Fault("stream cut", [Reply.text(["Hel", "lo ", "wor", "ld"]).cut(3)],
              "error", "cut", "Hello "),
        Fault("stall past the timeout", [Reply.text(["Hel", "lo ", "never"]).stall(3)],
              "cancelled", f"timed out after {TIMEOUT_S} s", "Hello "),
        Fault("malformed chunk", [Reply.text(["par", "tial ", "x"]).malformed(3)],
              "error", "malformed", "partial "),
        Fault("key in an error body", [Reply.error(401, body=key_body)],
              "error", "401", ""),
        Fault("key in an in-stream error", [
            Reply.text(["so ", "far ", "z"]).stream_error(3, f"bad key {API_KEY} refused")
        ], "error", "bad key", "so far "),
        Fault("key in a plain-text 500", [
            Reply.error(500, body=f"upstream proxy: key={API_KEY} denied"),
            Reply.error(500, body=f"upstream proxy: key={API_KEY} denied"),
        ], "error", "500", ""),
    ]


def _sse(api: httpx.Client, skey: str, reply: str) -> tuple[str, list[dict[str, Any]]]:
    """The raw stream (searched for the key) and its events, read to the end."""
    with api.stream("GET", f"/api/conversations/{skey}/messages/{reply}/stream") as r:
        assert r.status_code == 200, r.read()
        raw = r.read().decode()
    return raw, parse_events(raw)


def _wait_final(api: httpx.Client, skey: str, reply: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = {m["key"]: m["value"] for m in api.get(f"/api/conversations/{skey}").json()["messages"]}
        value = messages.get(reply)
        if value and value.get("status") not in (None, "pending"):
            return value
        time.sleep(0.1)
    raise AssertionError(f"{reply} still pending after {timeout}s")


def test_model_faults_end_right_and_leak_no_key(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there
    extra = f'\n[providers.dead]\nbase_url = "http://127.0.0.1:{closed}/v1"\napi_key_env = "T_FAKE_KEY"\n'
    with FakeModel(api_key=API_KEY) as fake:
        d = Turnd(
            tmp_path, "faults", tmp_path / "data", fake.base_url,
            turns={"retries": 1, "timeoutSeconds": TIMEOUT_S}, extra=extra,
        )
        d.start()
        streams: list[str] = []
        try:
            api = d.client()
            for fault in _faults():
                fake.reset()
                fake.push(*fault.replies)
                skey = api.post("/api/conversations", json={"title": fault.name}).json()["skey"]
                generation: dict[str, Any] = {"model": fault.model} if fault.model else {}
                started = time.monotonic()
                r = api.post(
                    f"/api/conversations/{skey}/messages",
                    json={"parts": [{"$type": TEXT, "text": fault.name}], "generation": generation},
                )
                assert r.status_code == 201, r.text
                reply = r.json()["replyKey"]
                raw, events = _sse(api, skey, reply)
                streams.append(raw)
                value = _wait_final(api, skey, reply)
                took = time.monotonic() - started
                assert value["status"] == fault.status, (fault.name, value)
                if fault.error is not None:
                    assert fault.error in value.get("error", ""), (fault.name, value)
                assert reply_text(value) == fault.text, (fault.name, value)
                # The stream: numbered 1..n, its deltas are the kept text, status last.
                assert [e["id"] for e in events] == list(range(1, len(events) + 1)), fault.name
                deltas = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
                assert deltas == fault.text, (fault.name, events)
                assert events[-1]["event"] == "status", fault.name
                assert events[-1]["data"]["status"] == fault.status, (fault.name, events[-1])
                if fault.name == "429 then answered":
                    # Retried once, with the key. How long the client waited (Retry-After)
                    # is the openai client's behaviour and a timing: not asserted.
                    assert len(fake.chat_requests) == 2
                    assert all(q.api_key == API_KEY for q in fake.chat_requests)
                # "stall past the timeout" is told apart by its error, "timed out after
                # 4 s", which only the turn's deadline writes; its duration is not asserted.
                print(f"fault {fault.name!r}: {value['status']} {value.get('error', '')!r} "
                      f"kept {reply_text(value)!r} in {took:.1f}s")

            metrics = httpx.get(f"{d.url}/metrics", verify=tls_context()).text
            conversations = api.get("/api/conversations").json()["conversations"]
            dumps = [api.get(f"/api/conversations/{c['skey']}").text for c in conversations]
            assert len(conversations) == len(_faults())
        finally:
            assert d.stop() == 0
            d.kill()

    logs = d.logs()
    assert "turnd: serving" in logs and "turnd.turns" in logs
    places = {"API answers": "\n".join(dumps), "SSE streams": "\n".join(streams),
              "/metrics": metrics, "daemon output": logs}
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            places[f"store file {path.name}"] = path.read_bytes().decode("latin-1")
    places["state file"] = d.state.read_bytes().decode("latin-1")
    for where, text in places.items():
        assert API_KEY not in text, f"the API key leaked into {where}"
        assert API_KEY[8:24] not in text, f"part of the API key leaked into {where}"
    print(f"faults: {len(_faults())} kinds, the key in none of {len(places)} places")
