"""turns.one_send: a model request's head and body reach the server in one send."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import struct
from pathlib import Path

import anyio
import anyio.abc
import httpcore2
import httpx2
import openai
import pytest
from anyio.streams.tls import TLSStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from testbed.fakemodel import FakeModel, Reply
from turns.generate import _stream_step
from turns.one_send import HOLD_BYTES, OneSendBackend, model_transport, uses_env_proxy
from turns.outcomes import Usage
from turns.parts import PartsBuilder
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


def _self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for 127.0.0.1 with a certificate of its own, and a client context
    that trusts only that certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client = ssl.create_default_context(cadata=cert_pem.decode())
    return server, client


async def test_a_tls_connection_holds_and_sends_as_a_plain_one(tmp_path: Path) -> None:
    server_ctx, client_ctx = _self_signed(tmp_path)
    received: list[bytes] = []

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError):
                tls = await TLSStream.wrap(stream, server_side=True, ssl_context=server_ctx)
                while True:
                    received.append(await tls.receive())
                    if received[-1].endswith(b"BODY"):
                        await tls.send(b"OK")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        plain = await OneSendBackend().connect_tcp("127.0.0.1", port, timeout=5)
        stream = await plain.start_tls(client_ctx, server_hostname="127.0.0.1", timeout=5)
        assert stream.get_extra_info("ssl_object") is not None
        assert stream.get_extra_info("server_addr")[1] == port
        await stream.write(b"POST / HTTP/1.1\r\n\r\n")
        await stream.write(b"BODY")
        assert await stream.read(10, timeout=5) == b"OK"
        assert received == [b"POST / HTTP/1.1\r\n\r\nBODY"]  # one TLS record, one send
        await stream.aclose()
        # A certificate the client does not trust is a connect error, as httpcore's is.
        other = await OneSendBackend().connect_tcp("127.0.0.1", port, timeout=5)
        with pytest.raises(httpcore2.ConnectError):
            await other.start_tls(model_tls_context(), server_hostname="127.0.0.1", timeout=5)
        tg.cancel_scope.cancel()
    await listener.aclose()


async def test_timeouts_and_failures_are_httpcores_errors() -> None:
    # A server that reads nothing and answers nothing: a read times out.
    async def silent(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, silent)
        stream = await OneSendBackend().connect_tcp("127.0.0.1", port, timeout=5)
        await stream.write(b"GET / HTTP/1.1\r\n\r\n")
        with pytest.raises(httpcore2.ReadTimeout):
            await stream.read(10, timeout=0.05)
        await stream.aclose()
        with pytest.raises(httpcore2.ReadError):  # read from a closed stream
            await stream.read(10, timeout=1)
        with pytest.raises(httpcore2.WriteError):  # and a write to it (sent at once, as large)
            await stream.write(b"x" * HOLD_BYTES)
        tg.cancel_scope.cancel()
    await listener.aclose()
    # Nothing listens on that port any more: the connect is refused.
    with pytest.raises(httpcore2.ConnectError):
        await OneSendBackend().connect_tcp("127.0.0.1", port, timeout=5)


async def test_a_reset_connection_is_a_read_error_and_readable() -> None:
    async def reset(stream: anyio.abc.SocketStream) -> None:
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()  # an RST, not a FIN

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, reset)
        stream = await OneSendBackend().connect_tcp("127.0.0.1", port, timeout=5)
        with pytest.raises(httpcore2.ReadError):
            await stream.read(10, timeout=5)
        assert stream.get_extra_info("is_readable") is True  # so the pool drops it
        await stream.aclose()
        tg.cancel_scope.cancel()
    await listener.aclose()


async def test_chat_calls_over_tls_reuse_one_connection(tmp_path: Path) -> None:
    # The whole path a provider's HTTPS call takes: the pool connects, upgrades to TLS in
    # place, sends the request in one record, reads a chunked SSE body, and keeps the
    # connection for the next call.
    server_ctx, client_ctx = _self_signed(tmp_path)
    connections: list[int] = []
    body = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-length: %d\r\n\r\n" % len(body))

    async def serve(stream: anyio.abc.SocketStream) -> None:
        connections.append(1)
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError):
                tls = await TLSStream.wrap(stream, server_side=True, ssl_context=server_ctx)
                request = b""
                while True:
                    request += await tls.receive()
                    if b"\r\n\r\n" in request and request.endswith(b"}"):  # head and JSON body
                        request = b""
                        await tls.send(head + body)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        limits = httpx2.Limits(max_connections=4, max_keepalive_connections=4)
        http = httpx2.AsyncClient(transport=model_transport(client_ctx, limits))
        client = openai.AsyncOpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="k",
                                    max_retries=0, http_client=http)
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        for _ in range(2):
            parts = PartsBuilder(None)
            with anyio.fail_after(10):
                await _stream_step(client, request, parts, Usage())
            parts.end_run()
            assert [p["text"] for p in parts.parts] == ["hi"]
        await client.close()
        tg.cancel_scope.cancel()
    await listener.aclose()
    assert len(connections) == 1
