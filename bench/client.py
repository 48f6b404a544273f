"""Client-side probes: an SSE reader for turnd's reply streams, the bare ``openai``
client reading the fake model, and direct XRPC writes.

The SSE reader counts events in the raw bytes instead of parsing them, so that the
bench's own CPU cost per token stays far below turnd's and the figure is turnd's.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai

from recordstore.local_db import COLLECTION_IS

# Re-exported: the bench's other modules spell the names through this one.
from recordstore.vocabulary import INFO as INFO
from recordstore.vocabulary import MESSAGE as MESSAGE
from recordstore.vocabulary import PLAIN_CONTENT as PLAIN  # noqa: F401
from recordstore.vocabulary import TEXT_PART as TEXT_PART
from turns.tls import tls_context

MODEL = "fake-model"
PROMPT = [{"role": "user", "content": "hi"}]

_DELTA = b"event: delta\n"
_STATUS = b"event: status\n"
_ID = b"\nid: "


def now() -> float:
    return time.perf_counter()


@dataclass
class StreamResult:
    first_delta: float | None = None  # perf_counter() when the first token arrived
    last_delta: float | None = None
    tokens: int = 0
    status: str | None = None  # the status event's data, raw
    end: float = 0.0
    events: int = 0  # events received (each carries one id line)
    last_id: int = 0  # the id of the last event received
    resubscribed: int = 0  # subscriptions that failed before their first byte


RESUBSCRIBE = 3  # attempts after a kept-alive connection the server had closed


async def read_reply(http: httpx.AsyncClient, url: str) -> StreamResult:
    """Follow one reply stream to its ``status`` event, counting ``delta`` events.

    Like an EventSource, it subscribes again when the request fails before anything
    arrived: under load a pooled connection can be one the server's keep-alive timer
    has just closed (the request then reads EOF). Counted in ``resubscribed``.
    """
    for attempt in range(RESUBSCRIBE + 1):
        out = StreamResult(resubscribed=attempt)
        try:
            return await _read_reply(http, url, out)
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
            if out.events or attempt == RESUBSCRIBE:
                raise
    raise AssertionError("unreachable")


async def _read_reply(http: httpx.AsyncClient, url: str, out: StreamResult) -> StreamResult:
    async with http.stream("GET", url) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"GET {url}: {response.status_code} {response.text[:200]}")
        buf = b""
        async for chunk in response.aiter_raw():
            if out.status is not None:
                # Read to the end of the body (turnd ends it after the status), as a
                # keep-alive client does: left half-read, the connection could not be
                # used again and every turn would connect anew (the bare client reads
                # its streams to the end too).
                continue
            t = now()
            buf += chunk
            cut = buf.rfind(b"\n\n")
            if cut < 0:
                continue
            complete, buf = buf[: cut + 2], buf[cut + 2 :]
            ids = complete.count(_ID)
            if ids:
                out.events += ids
                at_id = complete.rfind(_ID) + len(_ID)
                out.last_id = int(complete[at_id : complete.index(b"\n", at_id)])
            n = complete.count(_DELTA)
            if n:
                if out.first_delta is None:
                    out.first_delta = t
                out.last_delta = t
                out.tokens += n
            at = complete.find(_STATUS)
            if at >= 0:
                line = complete[at + len(_STATUS) :].split(b"\n", 1)[0]
                out.status = line.removeprefix(b"data: ").decode()
    out.end = now()
    return out


# Idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them under
# us (a POST on a connection the server is closing fails with ReadError). Both clients,
# turnd's and the bare one, keep as many connections alive as they use at once.
KEEPALIVE_EXPIRY = 2.0


def api_client(base_url: str, token: str, connections: int = 64) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {token}"},
        # A loop busy starting hundreds of turns accepts late: the many-streams run waits.
        timeout=httpx.Timeout(120, connect=60),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                            keepalive_expiry=KEEPALIVE_EXPIRY), verify=tls_context(),
    )


async def new_conversation(http: httpx.AsyncClient) -> str:
    r = await http.post("/api/conversations", json={})
    r.raise_for_status()
    return str(r.json()["skey"])


def message_body(provider: str | None = None) -> dict[str, Any]:
    generation: dict[str, Any] = {}
    if provider:
        generation["model"] = {"provider": provider, "id": MODEL}
    return {"parts": [{"$type": TEXT_PART, "text": "hi"}], "generation": generation}


@dataclass
class TurnSample:
    ttft: float  # seconds: POST sent -> first delta at the subscriber
    tokens: int
    per_token: float | None  # seconds between tokens at the subscriber
    status: str | None
    events: int = 0  # events the subscriber received
    last_id: int = 0  # the last one's id: ``last_id - events`` were not delivered
    resubscribed: int = 0


async def turnd_turn(
    http: httpx.AsyncClient, skey: str, provider: str | None = None, t0: float | None = None
) -> TurnSample:
    """POST a message, subscribe to its reply, follow it to the end."""
    start = now() if t0 is None else t0
    r = await http.post(f"/api/conversations/{skey}/messages", json=message_body(provider))
    if r.status_code != 201:
        raise RuntimeError(f"POST message: {r.status_code} {r.text[:200]}")
    reply = r.json()["replyKey"]
    res = await read_reply(http, f"/api/conversations/{skey}/messages/{reply}/stream")
    if res.first_delta is None:
        raise RuntimeError(f"reply {reply} streamed no delta (status {res.status})")
    return TurnSample(
        ttft=res.first_delta - start,
        tokens=res.tokens,
        per_token=_per_token(res.first_delta, res.last_delta, res.tokens),
        status=res.status,
        events=res.events,
        last_id=res.last_id,
        resubscribed=res.resubscribed,
    )


def _per_token(first: float | None, last: float | None, tokens: int) -> float | None:
    if first is None or last is None or tokens < 2:
        return None
    return (last - first) / (tokens - 1)


def bare_client(base_url: str, connections: int | None = None) -> openai.AsyncOpenAI:
    """The stock client; with ``connections``, its pool keeps that many alive (its
    default keeps 100, so 200 concurrent streams would connect anew each time)."""
    http = None
    if connections is not None:
        import httpx2  # the openai SDK's HTTP client

        http = openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(
            max_connections=connections, max_keepalive_connections=connections,
            keepalive_expiry=KEEPALIVE_EXPIRY))
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench-fake", max_retries=0,
                              timeout=120, http_client=http)


async def bare_stream(client: openai.AsyncOpenAI) -> TurnSample:
    """The bare ``openai`` client: request -> first content chunk -> end of stream."""
    start = now()
    first = last = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=MODEL, messages=PROMPT, stream=True, stream_options={"include_usage": True}  # type: ignore[arg-type]
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            t = now()
            if first is None:
                first = t
            last = t
            tokens += 1
    if first is None:
        raise RuntimeError("the bare client read no content chunk")
    return TurnSample(first - start, tokens, _per_token(first, last, tokens), None)


# -- direct writes through the local XRPC ------------------------------------------------


async def xrpc_session(http: httpx.AsyncClient, handle: str, password: str) -> str:
    r = await http.post("/xrpc/com.atproto.server.createSession",
                        json={"identifier": handle, "password": password})
    r.raise_for_status()
    return str(r.json()["accessJwt"])


async def xrpc_create(
    http: httpx.AsyncClient, jwt: str, did: str, collection: str, rkey: str, record: dict[str, Any]
) -> None:
    await xrpc_send(http, xrpc_create_request(http, jwt, did, collection, rkey, record))


def xrpc_create_request(
    http: httpx.AsyncClient, jwt: str, did: str, collection: str, rkey: str, record: dict[str, Any]
) -> httpx.Request:
    """A ``createRecord`` request, built (headers, JSON body) and not sent yet."""
    return http.build_request(
        "POST",
        "/xrpc/com.atproto.repo.createRecord",
        headers={"Authorization": f"Bearer {jwt}"},
        json={"repo": did, "collection": collection, "rkey": rkey, "record": record},
    )


async def xrpc_send(http: httpx.AsyncClient, request: httpx.Request) -> None:
    r = await http.send(request)
    if r.status_code != 200:
        raise RuntimeError(f"{request.url.path}: {r.status_code} {r.text[:200]}")


class ClaimWatcher:
    """Sees a reply's placeholder appear in the local store's SQLite file (read-only).

    Reading the file costs turnd nothing, unlike polling its HTTP routes.
    """

    def __init__(self, store_file: Path, did: str) -> None:
        self._db = sqlite3.connect(f"file:{store_file}?mode=ro", uri=True,
                                   check_same_thread=False)
        self._did = did

    def claimed(self, skey: str, key: str) -> bool:
        row = self._db.execute(
            f"SELECT 1 FROM records WHERE did = ? AND space = ? AND {COLLECTION_IS} AND key = ?",
            (self._did, skey, MESSAGE, key),
        ).fetchone()
        return row is not None

    async def wait(self, skey: str, key: str, limit: float = 10.0, poll: float = 0.0002) -> float:
        """When the reply's placeholder was first seen. Polled on a thread of its own: a
        sleep on the event loop lasts at least a millisecond (epoll's timeout is in whole
        ms), which put ~0.5-1 ms of the watcher's own delay into every figure."""
        return await anyio.to_thread.run_sync(self._wait, skey, key, limit, poll)

    def _wait(self, skey: str, key: str, limit: float, poll: float) -> float:
        deadline = now() + limit
        while True:
            if self.claimed(skey, key):
                return now()
            if now() > deadline:
                raise TimeoutError(f"reply {key} not claimed within {limit}s")
            time.sleep(poll)

    def close(self) -> None:
        self._db.close()
