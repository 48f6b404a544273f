"""turns.one_send: a model request's head and body reach the server in one send."""

from __future__ import annotations

import anyio
import httpx2
import pytest

from testbed.fakemodel import FakeModel, Reply
from turns.one_send import HOLD_BYTES, OneSendBackend, model_transport, uses_env_proxy
from turns.tls import model_tls_context

pytestmark = pytest.mark.anyio


class _Server:
    """A TCP server on loopback that keeps every chunk it receives, as it arrives."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.large = anyio.Event()  # HOLD_BYTES more arrived after the first request

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                while True:
                    chunk = await stream.receive()
                    self.chunks.append(chunk)
                    if sum(map(len, self.chunks)) >= HOLD_BYTES:
                        self.large.set()
                    if chunk.endswith(b"BODY"):
                        await stream.send(b"OK")
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass


async def test_writes_are_held_until_the_connection_is_read_from() -> None:
    server = _Server()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.serve)
        stream = await OneSendBackend().connect_tcp("127.0.0.1", port)
        await stream.write(b"POST / HTTP/1.1\r\n\r\n")
        await stream.write(b"BODY")
        await anyio.sleep(0.1)
        assert server.chunks == []  # nothing went out before the read
        assert await stream.read(10) == b"OK"
        assert server.chunks == [b"POST / HTTP/1.1\r\n\r\nBODY"]  # one send, read at once
        # A large body is not held: past HOLD_BYTES it goes out as it comes.
        await stream.write(b"x" * HOLD_BYTES)
        with anyio.fail_after(5):
            await server.large.wait()
        await stream.aclose()
        tg.cancel_scope.cancel()
    await listener.aclose()


async def test_a_model_request_through_the_transport_is_answered(fake_model: FakeModel) -> None:
    fake_model.push(Reply.text(["Hel", "lo"]))
    limits = httpx2.Limits(max_connections=4, max_keepalive_connections=4)
    async with httpx2.AsyncClient(transport=model_transport(model_tls_context(), limits)) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with http.stream("POST", f"{fake_model.base_url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            text = (await r.aread()).decode()
    assert '"Hel"' in text and "[DONE]" in text
    assert fake_model.last_request.json["messages"][0]["content"] == "hi"


def test_a_proxy_in_the_environment_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert not uses_env_proxy()
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert uses_env_proxy()


async def test_an_idle_connection_is_readable_once_the_server_closes_it() -> None:
    # The pool asks this of every idle connection before it reuses one.
    closed = anyio.Event()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            assert await stream.receive() == b"CLOSE"
        closed.set()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        stream = await OneSendBackend().connect_tcp("127.0.0.1", port)
        assert stream.get_extra_info("is_readable") is False
        assert stream.get_extra_info("socket") is not None
        await stream.write(b"CLOSE")
        assert await stream.read(10) == b""  # the read sends what was held; then EOF
        await closed.wait()
        assert stream.get_extra_info("is_readable") is True
        await stream.aclose()
        tg.cancel_scope.cancel()
    await listener.aclose()
