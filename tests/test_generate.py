"""turns.generate: what reaches a record of a failure (scrub); the model's SSE body read as
bytes."""

from __future__ import annotations

import anyio
import anyio.abc
import openai
import pytest

from turns.generate import MAX_ERROR, _chunk, _stream_step, scrub
from turns.models import providers_http_client
from turns.outcomes import Usage
from turns.parts import PartsBuilder

# Neither shaped like an OpenAI key nor like a bearer header: only the configured-secret
# path can remove it.
CONFIGURED = "key-SeCrEt-7f3a9b2c4d5e6f708192a3b4"


def test_configured_secrets_are_removed_whatever_their_shape() -> None:
    text = scrub(f"upstream said: key={CONFIGURED} denied", [CONFIGURED])
    assert CONFIGURED not in text and text == "upstream said: key=[redacted] denied"


def test_key_shaped_strings_are_removed_even_when_not_configured() -> None:
    # A key of another provider, or one the config does not know: no configured secret.
    text = scrub("bad key sk-proj-AbC123xyz_-99 and Authorization: Bearer abc.def.ghi used", [])
    assert "sk-proj" not in text and "abc.def.ghi" not in text
    assert text == "bad key [redacted] and Authorization: [redacted] used"


def test_both_at_once_and_empty_secrets_ignored() -> None:
    text = scrub(f"{CONFIGURED} then sk-live-0123456789", ["", CONFIGURED])
    assert text == "[redacted] then [redacted]"


def test_plain_text_is_kept_and_long_text_cut() -> None:
    assert scrub("429 Too Many Requests", ["x" * 20]) == "429 Too Many Requests"
    long = scrub("e" * 5000, [])
    assert len(long) == MAX_ERROR and long.endswith("…")


# -- the model's SSE body, read as bytes (turns.generate._lines) -----------------------

_PIECES = [
    # A line cut in two, a \r\n cut between its \r and \n, lines ended by \r alone, a
    # comment and an event name (not data), and a chunk with bytes that are not UTF-8.
    b'data: {"choices":[{"delta":{"content":"He',
    b'l"}}]}\r',
    b'\n\r\n: keep-alive\r\revent: x\ndata: {"choices":[{"delta":{"content":"lo \xff!"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]',
    b"\n\n",
]


async def _serve_pieces(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        await stream.receive()  # the request (held and sent whole by turns.one_send)
        await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                          b"transfer-encoding: chunked\r\n\r\n")
        for piece in _PIECES:
            await anyio.sleep(0.02)  # each piece its own read
            await stream.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        await stream.send(b"0\r\n\r\n")


@pytest.mark.anyio
async def test_lines_cut_anywhere_and_bytes_not_utf8_are_read_as_httpx_text_was() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _serve_pieces)
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                                    max_retries=0, http_client=providers_http_client())
        parts, usage = PartsBuilder(None), Usage()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with anyio.fail_after(10):
            calls = await _stream_step(client, body, parts, usage)
        await client.close()
        tg.cancel_scope.cancel()
    await listener.aclose()
    parts.end_run()
    assert calls == []
    assert [p["text"] for p in parts.parts] == ["Hello \ufffd!"]
    assert (usage.input, usage.output) == (3, 2)


def test_a_data_line_that_is_not_json_is_refused_whatever_its_bytes() -> None:
    with pytest.raises(ValueError):
        _chunk(b'{"choices": [')
    with pytest.raises(ValueError):
        _chunk(b'{"choices": [\xff')
