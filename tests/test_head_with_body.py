"""daemon.head_with_body: a response's head goes out with what follows it, in one send."""

from __future__ import annotations

import asyncio
import socket

import pytest

from daemon.head_with_body import HeadWithBody

pytestmark = pytest.mark.anyio

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n"


async def _pair() -> tuple[HeadWithBody, socket.socket]:
    ours, peer = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    peer.setblocking(False)
    return HeadWithBody(transport, loop), peer


async def _read(peer: socket.socket) -> bytes:
    for _ in range(100):
        try:
            return peer.recv(1 << 16)
        except BlockingIOError:
            await asyncio.sleep(0.01)
    raise AssertionError("nothing arrived")


def _nothing_sent(peer: socket.socket) -> bool:
    try:
        peer.recv(100)
    except BlockingIOError:
        return True
    return False


async def test_a_head_is_sent_with_the_body_that_follows_it() -> None:
    out, peer = await _pair()
    out.write(bytearray(HEAD))
    assert _nothing_sent(peer)
    assert out.get_write_buffer_size() == len(HEAD)
    out.write(b"body")  # taken along at once, not at the end of the pass
    assert peer.recv(100) == HEAD + b"body"
    assert out.get_write_buffer_size() == 0
    out.close()
    peer.close()


async def test_a_head_alone_goes_at_the_end_of_the_pass_and_frames_at_once() -> None:
    out, peer = await _pair()
    head = bytearray(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
    out.write(head)
    head[:] = b"X" * len(head)  # a writer may reuse its buffer once write returns
    assert _nothing_sent(peer)
    await asyncio.sleep(0)
    assert await _read(peer) == b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    out.write(b"event: delta\r\ndata: {}\r\n\r\n")  # a frame is never held
    assert peer.recv(100) == b"event: delta\r\ndata: {}\r\n\r\n"
    out.close()
    peer.close()


async def test_a_close_sends_what_was_written_and_an_abort_drops_it() -> None:
    out, peer = await _pair()
    out.write(HEAD)
    out.close()
    assert out.is_closing()
    assert await _read(peer) == HEAD
    assert await _read(peer) == b""  # then the end of the stream
    peer.close()

    out, peer = await _pair()
    out.write(HEAD)
    out.abort()
    assert await _read(peer) == b""
    peer.close()
