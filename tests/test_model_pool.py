"""turns.model_pool: a provider's requests fill one small pool before the next."""

from __future__ import annotations

import contextlib

import httpx2
import pytest

from testbed.fakemodel import FakeModel, Reply
from turns.model_pool import ShardedTransport
from turns.one_send import model_transport
from turns.tls import model_tls_context

pytestmark = pytest.mark.anyio

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _sharded(pools: int, fill: int) -> ShardedTransport:
    limits = httpx2.Limits(max_connections=10, max_keepalive_connections=fill)
    return ShardedTransport([model_transport(model_tls_context(), limits) for _ in range(pools)],
                            fill=fill)


async def _open(stack: contextlib.AsyncExitStack, http: httpx2.AsyncClient, url: str) -> None:
    r = await stack.enter_async_context(http.stream("POST", url, json=BODY))
    assert r.status_code == 200


async def test_requests_fill_the_first_pool_then_the_next(fake_model: FakeModel) -> None:
    url = f"{fake_model.base_url}/v1/chat/completions"
    transport = _sharded(pools=3, fill=2)
    async with httpx2.AsyncClient(transport=transport) as http:
        for _ in range(8):
            fake_model.push(Reply.text(["Hel", "lo"]))
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(5):
                await _open(stack, http, url)
            assert transport.in_flight == (2, 2, 1)
        assert transport.in_flight == (0, 0, 0)  # each body's close gave its place back
        # Quiet again, the first pool takes the next request (and its kept connection).
        async with http.stream("POST", url, json=BODY) as r:
            assert transport.in_flight == (1, 0, 0)
            text = (await r.aread()).decode()
        assert '"Hel"' in text and "[DONE]" in text


async def test_when_every_pool_is_full_the_least_busy_takes_the_request(fake_model: FakeModel) -> None:
    url = f"{fake_model.base_url}/v1/chat/completions"
    transport = _sharded(pools=2, fill=1)
    async with httpx2.AsyncClient(transport=transport) as http:
        for _ in range(4):
            fake_model.push(Reply.text(["x"]))
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(3):
                await _open(stack, http, url)
            assert transport.in_flight == (2, 1)
            await _open(stack, http, url)
            assert transport.in_flight == (2, 2)
        assert transport.in_flight == (0, 0)


async def test_a_request_that_fails_gives_its_place_back() -> None:
    transport = _sharded(pools=2, fill=1)
    async with httpx2.AsyncClient(transport=transport) as http:
        with pytest.raises(httpx2.ConnectError):
            await http.post("http://127.0.0.1:9/v1/chat/completions", json=BODY)  # discard port
        assert transport.in_flight == (0, 0)


def test_a_transport_needs_a_pool() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ShardedTransport([], fill=1)
