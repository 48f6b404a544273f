"""The fake model server, driven by the real ``openai.AsyncOpenAI`` client over loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import openai
import pytest

from testbed.fakemodel import FakeModel, Reply, ToolCall
from turns.tls import tls_context

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def client_for(fake: FakeModel, **kw: Any) -> openai.AsyncOpenAI:
    kw.setdefault("max_retries", 0)
    kw.setdefault("api_key", "sk-test-key")
    return openai.AsyncOpenAI(base_url=fake.base_url, **kw)


async def collect(fake: FakeModel, **kw: Any) -> list[Any]:
    async with client_for(fake) as client:
        stream = await client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "hi"}], stream=True, **kw
        )
        return [chunk async for chunk in stream]


async def test_text_stream_and_usage(fake_model: FakeModel) -> None:
    fake_model.push(Reply.text(["Hel", "lo", " world"]).with_usage(11, 3, 0))
    chunks = await collect(fake_model, stream_options={"include_usage": True})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.model == "m1" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (11, 3)
    assert last.usage.completion_tokens_details.reasoning_tokens == 0


async def test_no_usage_chunk_without_include_usage(fake_model: FakeModel) -> None:
    chunks = await collect(fake_model)  # the default reply
    assert all(c.choices for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello!"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning(fake_model: FakeModel, field: str) -> None:
    fake_model.push(Reply.reasoning(["Let me ", "think."], ["Answer"], field=field))  # type: ignore[arg-type]
    chunks = await collect(fake_model, stream_options={"include_usage": True})
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, field, None) or "" for d in deltas)
    assert reasoning == "Let me think."
    assert "".join(d.content or "" for d in deltas) == "Answer"
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 2


@pytest.mark.parametrize("interleave", [False, True])
async def test_tool_calls_assembled_by_index(fake_model: FakeModel, interleave: bool) -> None:
    fake_model.push(Reply.tool_calls(
        [ToolCall("get_weather", {"city": "Paris", "unit": "C"}, id="call_a"),
         ToolCall("search", '{"q": "turnd daemon"}', fragment_size=3)],
        interleave=interleave,
    ))
    chunks = await collect(fake_model)
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in c.choices[0].delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
            if tc.id:
                slot["id"] = tc.id
                assert tc.type == "function"
            if tc.function and tc.function.name:
                slot["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                slot["args"] += tc.function.arguments
    assert calls[0]["id"] == "call_a" and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["args"]) == {"city": "Paris", "unit": "C"}
    assert calls[1]["name"] == "search" and calls[1]["id"]
    assert json.loads(calls[1]["args"]) == {"q": "turnd daemon"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # Arguments really arrive in fragments, as from a real provider.
    frags = sum(1 for c in chunks for tc in c.choices[0].delta.tool_calls or [] if tc.function.arguments)
    assert frags > 4


async def test_http_429_with_retry_after(fake_model: FakeModel) -> None:
    fake_model.push(Reply.error(429, "Rate limit reached", "rate_limit_exceeded",
                                code="rate_limit_exceeded", headers={"Retry-After": "7"}))
    with pytest.raises(openai.RateLimitError) as info:
        await collect(fake_model)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "7"
    assert "Rate limit reached" in info.value.message
    assert fake_model.request_count == 1


async def test_http_500_then_retry_succeeds(fake_model: FakeModel) -> None:
    # The client's own retry (max_retries=1) consumes the next queued reply.
    fake_model.push(Reply.error(500, headers={"Retry-After": "0"}), Reply.text(["ok"]))
    async with client_for(fake_model, max_retries=1) as client:
        stream = await client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "hi"}], stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "ok" and fake_model.request_count == 2


@pytest.mark.parametrize("rst", [False, True])
async def test_cut_stream_raises(fake_model: FakeModel, rst: bool) -> None:
    fake_model.push(Reply.text(["a", "b", "c", "d"]).cut(after=3, rst=rst))
    got: list[str] = []
    with pytest.raises((httpx.HTTPError, openai.APIError)):
        async with client_for(fake_model) as client:
            stream = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], stream=True)
            async for c in stream:
                got.append(c.choices[0].delta.content or "")
    assert "".join(got) in ("ab", "")  # rst may drop bytes still in flight
    if not rst:
        assert "".join(got) == "ab"


async def test_malformed_chunk_raises(fake_model: FakeModel) -> None:
    fake_model.push(Reply.text(["a", "b"]).malformed(at=2))
    with pytest.raises(ValueError):  # json.JSONDecodeError from the SSE parser
        await collect(fake_model)


async def test_in_stream_error_event(fake_model: FakeModel) -> None:
    fake_model.push(Reply.text(["a", "b", "c"]).stream_error(2, "Upstream overloaded", "server_error"))
    with pytest.raises(openai.APIError) as info:
        await collect(fake_model)
    assert "Upstream overloaded" in info.value.message


async def test_request_recording_and_reset(fake_model: FakeModel) -> None:
    async with client_for(fake_model, api_key="sk-secret-123") as client:
        await client.chat.completions.create(
            model="m2", messages=[{"role": "user", "content": "yo"}], stream=True,
            stream_options={"include_usage": True}, reasoning_effort="high")
        await client.chat.completions.create(model="m2", messages=[{"role": "user", "content": "2"}])
    assert fake_model.request_count == 2 and len(fake_model.requests) == 2
    first = fake_model.requests[0]
    assert first.method == "POST" and first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer sk-secret-123"
    assert first.api_key == "sk-secret-123"
    assert first.json["model"] == "m2" and first.json["stream"] is True
    assert first.json["reasoning_effort"] == "high"
    assert first.json["messages"] == [{"role": "user", "content": "yo"}]
    assert first.finished and not first.disconnected
    fake_model.push(Reply.text("x"))
    fake_model.reset()
    assert fake_model.request_count == 0 and fake_model.requests == [] and fake_model.pending == 0


async def test_stall_for_a_while_then_resume(fake_model: FakeModel) -> None:
    # Where the stall is: a client that will not wait 20 s gives up after line 2 ...
    fake_model.push(Reply.text(["a", "b", "c"]).stall(after=2, seconds=20))
    assert await _read_until_timeout(fake_model, read=0.5) == ["", "a"]
    # ... and after a short stall the stream goes on to the end. (How long a stall lasts
    # is a timing: the benchmarks use it, no test asserts it.)
    fake_model.push(Reply.text(["a", "b", "c"]).stall(after=2, seconds=0.3))
    chunks = await collect(fake_model)
    assert [c.choices[0].delta.content for c in chunks if c.choices] == ["", "a", "b", "c", None]


async def test_stall_forever_hits_client_read_timeout(fake_model: FakeModel) -> None:
    fake_model.push(Reply.text(["a", "b"]).stall(after=2))
    assert await _read_until_timeout(fake_model, read=0.3) == ["", "a"]
    # The server notices the client going away.
    deadline = time.monotonic() + 2
    # Polling: the flag is set on the server's own thread, no event to await.
    while not fake_model.last_request.disconnected and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.01)
    assert fake_model.last_request.disconnected


async def test_delays(fake_model: FakeModel) -> None:
    # A ttft longer than the client waits: nothing arrives, not even the role chunk.
    fake_model.push(Reply.text(["a", "b"]).delayed(ttft=20))
    assert await _read_until_timeout(fake_model, read=0.5) == []
    # A delay between data lines: the role chunk (line 0) comes, then the wait.
    fake_model.push(Reply.text(["a", "b"]).delayed(chunk_delay=20))
    assert await _read_until_timeout(fake_model, read=0.5) == [""]
    # Short delays still deliver everything, in order (their durations are bench figures).
    fake_model.push(Reply.text(["a", "b", "c", "d"]).delayed(ttft=0.15, chunk_delay=0.05))
    chunks = await collect(fake_model)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "abcd"


async def test_responder_answers_by_request() -> None:
    def respond(req: dict[str, Any]) -> Reply:
        if req["messages"][-1]["role"] == "tool":
            return Reply.text(["It is ", req["messages"][-1]["content"]])
        return Reply.tool_calls(ToolCall("get_weather", {"city": "Oslo"}, id="call_1"))

    with FakeModel(responder=respond) as fake:
        async with client_for(fake) as client:
            msgs: list[Any] = [{"role": "user", "content": "weather?"}]
            first = await client.chat.completions.create(model="m", messages=msgs)
            call = first.choices[0].message.tool_calls[0]
            assert first.choices[0].finish_reason == "tool_calls"
            assert json.loads(call.function.arguments) == {"city": "Oslo"}
            msgs += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
            stream = await client.chat.completions.create(model="m", messages=msgs, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "It is sunny"
    assert fake.requests[1].json["messages"][-1]["tool_call_id"] == "call_1"


async def test_queue_wins_over_responder_and_responder_errors_surface() -> None:
    def boom(req: dict[str, Any]) -> Reply:
        raise RuntimeError("responder bug")

    with FakeModel(responder=boom) as fake:
        fake.push("queued")
        async with client_for(fake) as client:
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            assert r.choices[0].message.content == "queued"
            with pytest.raises(openai.InternalServerError, match="responder bug"):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        assert isinstance(fake.errors[0], RuntimeError)


async def test_non_stream_completion_and_models(fake_model: FakeModel) -> None:
    fake_model.push(Reply.reasoning("hmm", ["Hi", " there"]).with_usage(5, 3, 1))
    async with client_for(fake_model) as client:
        r = await client.chat.completions.create(model="m9", messages=[{"role": "user", "content": "a"}])
        models = await client.models.list()
    assert r.object == "chat.completion" and r.model == "m9"
    assert r.choices[0].message.content == "Hi there"
    assert r.choices[0].message.reasoning_content == "hmm"  # type: ignore[attr-defined]
    assert r.usage is not None and r.usage.total_tokens == 8
    assert [m.id for m in models.data] == ["fake-model"]


async def test_provider_metadata(fake_model: FakeModel) -> None:
    fake_model.push(Reply.text(["x"]).with_extra(delta={"provider_specific_fields": {"k": 1}},
                                                 chunk={"provider": "FakeCloud"}))
    chunks = await collect(fake_model)
    assert all(c.provider == "FakeCloud" for c in chunks)  # type: ignore[attr-defined]
    content = [c.choices[0].delta for c in chunks if c.choices[0].delta.content]
    assert content[0].provider_specific_fields == {"k": 1}  # type: ignore[attr-defined]


async def test_api_key_enforced() -> None:
    with FakeModel(api_key="sk-right") as fake:
        with pytest.raises(openai.AuthenticationError):
            async with client_for(fake, api_key="sk-wrong") as client:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        async with client_for(fake, api_key="sk-right") as client:
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        assert r.choices[0].message.content == "Hello!"


def test_sync_use_and_keep_alive() -> None:
    with FakeModel() as fake, httpx.Client(base_url=fake.base_url, verify=tls_context()) as http:
        for _ in range(3):
            r = http.post("/chat/completions", json={"model": "m", "stream": True, "messages": []})
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in r.text.split("\n\n") if ln]
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[0][6:])["object"] == "chat.completion.chunk"
        assert http.get("/nope").status_code == 404
        assert fake.connections == 1 and fake.request_count == 3


def test_cli_serves_default_reply() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.fakemodel", "--port", "0", "--tokens", "5",
         "--ttft-ms", "20", "--chunk-delay-ms", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["base_url"].startswith("http://127.0.0.1:") and ready["base_url"].endswith("/v1")
        with httpx.Client(base_url=ready["base_url"], verify=tls_context()) as http:
            r = http.post("/chat/completions", json={"model": "m", "stream": True, "messages": []})
        data = [json.loads(ln[6:]) for ln in r.text.split("\n\n") if ln and ln != "data: [DONE]"]
        assert "".join(d["choices"][0]["delta"].get("content") or "" for d in data) == \
            "tok0 tok1 tok2 tok3 tok4 "
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


async def _read_until_timeout(fake: FakeModel, read: float) -> list[str]:
    """The content deltas a client with a ``read`` s timeout gets before it gives up."""
    got: list[str] = []
    with pytest.raises((httpx2.ReadTimeout, openai.APITimeoutError)):
        # The openai client's own HTTP library's Timeout: httpx2 2.17 refuses httpx's.
        async with client_for(fake, timeout=httpx2.Timeout(5, read=read)) as client:
            stream = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], stream=True)
            async for c in stream:
                got.append(c.choices[0].delta.content or "")
    return got
