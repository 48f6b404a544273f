"""SPEC §16 OpenTelemetry: spans a real OTLP/HTTP receiver gets, content only when asked.

The receiver (testbed.otlp) is an HTTP server started by the test that decodes each
export with ``opentelemetry-proto``; turnd exports through the SDK's batch processor
and the OTLP/HTTP exporter, as it does in production.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from plugins import Plugin, PluginSet, Tool
from testbed.fakemodel import FakeModel, Reply, ToolCall
from testbed.otlp import OtlpReceiver
from testbed.ports import free_port
from tests.support.records import text_part
from tests.support.turnkit import DID, turn_kit
from turns.accounting import Accounting
from turns.telemetry import OtelSettings, open_telemetry

pytestmark = pytest.mark.anyio

SECRET_WORDS = (b"USER-PROMPT-TEXT", b"TOOL-ARGS-TEXT", b"TOOL-RESULT-TEXT", b"MODEL-ANSWER-TEXT")


def lookup_plugin() -> PluginSet:
    async def lookup(args: dict[str, Any], ctx: Any) -> Any:
        return {"found": "TOOL-RESULT-TEXT"}

    return PluginSet([Plugin("p", tools=[Tool("lookup", "d", {"type": "object"}, lookup)])])


async def tool_turn(tmp_path: Any, fake: FakeModel, telemetry: Any) -> tuple[str, dict]:
    fake.push(
        Reply.tool_calls(ToolCall("lookup", {"q": "TOOL-ARGS-TEXT"})).with_usage(30, 5),
        Reply.text(["MODEL-ANSWER-TEXT"]).with_usage(60, 9),
    )
    async with turn_kit(
        tmp_path, fake, plugins=lookup_plugin(), accounting=Accounting(telemetry=telemetry)
    ) as kit:
        skey = await kit.conversation()
        posted = await kit.post(skey, "USER-PROMPT-TEXT", tools=["lookup"])
        final = await kit.reply(skey, posted.reply_key)
    await anyio.to_thread.run_sync(telemetry.shutdown)  # flushes the batch
    return skey, final


async def test_a_turn_is_a_trace_of_turn_step_and_tool_spans_without_content(tmp_path, fake):
    with OtlpReceiver() as receiver:
        telemetry = open_telemetry(OtelSettings(endpoint=receiver.url, batch_delay_ms=50))
        skey, final = await tool_turn(tmp_path, fake, telemetry)
        spans = receiver.wait_for(4)
    assert final["status"] == "complete"
    by_name: dict[str, list] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert sorted(by_name) == ["chat fake-model", "execute_tool lookup", "turnd.turn"]
    [turn] = by_name["turnd.turn"]
    steps = by_name["chat fake-model"]
    [tool] = by_name["execute_tool lookup"]
    assert len(steps) == 2 and len(spans) == 4
    assert {s.trace_id for s in spans} == {turn.trace_id}
    assert all(s.parent_span_id == turn.span_id for s in [*steps, tool])
    assert turn.parent_span_id == "" and turn.resource["service.name"] == "turnd"
    assert turn.attributes["gen_ai.conversation.id"] == skey
    assert turn.attributes["turnd.status"] == "complete"
    steps.sort(key=lambda s: s.attributes["turnd.step"])
    for span, (inp, out) in zip(steps, [(30, 5), (60, 9)], strict=True):
        a = span.attributes
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "fake"
        assert a["gen_ai.request.model"] == "fake-model"
        assert a["gen_ai.response.model"] == "fake-model"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (inp, out)
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_fake0"
    raw = b"".join(receiver.bodies)
    for words in SECRET_WORDS:
        assert words not in raw  # no content unless capture_content
    for span in spans:
        assert not any(k in span.attributes for k in (
            "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ))


async def test_capture_content_puts_the_messages_and_tool_io_in_the_spans(tmp_path, fake):
    with OtlpReceiver() as receiver:
        telemetry = open_telemetry(
            OtelSettings(endpoint=receiver.url, capture_content=True, batch_delay_ms=50)
        )
        await tool_turn(tmp_path, fake, telemetry)
        spans = receiver.wait_for(4)
    step0 = next(s for s in spans if s.name.startswith("chat") and s.attributes["turnd.step"] == 0)
    tool = next(s for s in spans if s.name.startswith("execute_tool"))
    turn = next(s for s in spans if s.name == "turnd.turn")
    assert "USER-PROMPT-TEXT" in step0.attributes["gen_ai.input.messages"]
    assert "TOOL-ARGS-TEXT" in tool.attributes["gen_ai.tool.call.arguments"]
    assert "TOOL-RESULT-TEXT" in tool.attributes["gen_ai.tool.call.result"]
    assert "MODEL-ANSWER-TEXT" in turn.attributes["gen_ai.output.messages"]


async def test_a_dead_endpoint_never_fails_a_turn_and_is_logged_at_most_once_a_minute(
    tmp_path, fake, caplog
):
    caplog.set_level(logging.INFO)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    telemetry = open_telemetry(OtelSettings(endpoint=dead, batch_delay_ms=20))
    fake.default = Reply.text(["fine"])

    def otel_warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "turnd.otel" and r.levelno >= logging.WARNING]

    async with turn_kit(tmp_path, fake, accounting=Accounting(telemetry=telemetry)) as kit:
        skey = await kit.conversation()
        finals = []
        for text in ("one", "two", "three"):
            posted = await kit.engine.post_message(
                DID, skey, parent=None, parts=[text_part(text)], generation={}
            )
            finals.append(await kit.reply(skey, posted.reply_key))
        with anyio.fail_after(30):  # the exporter's retries end within its 5 s timeout
            while not otel_warnings():  # noqa: ASYNC110 - a poll of the captured log
                await anyio.sleep(0.05)
        for text in ("four", "five"):  # more failed exports, within the same minute
            posted = await kit.engine.post_message(
                DID, skey, parent=None, parts=[text_part(text)], generation={}
            )
            finals.append(await kit.reply(skey, posted.reply_key))
    await anyio.to_thread.run_sync(telemetry.shutdown)
    assert [f["status"] for f in finals] == ["complete"] * 5
    [warning] = otel_warnings()
    assert dead in warning.getMessage()
    # The exporter's own per-batch complaints are silenced: turnd says it once.
    assert not [
        r for r in caplog.records
        if r.name.startswith("opentelemetry.exporter") and r.levelno >= logging.WARNING
    ]
