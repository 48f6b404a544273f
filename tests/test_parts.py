"""turns.parts: stream chunks -> lexicon parts in the model's order, and their events."""

from __future__ import annotations

import json

from turns.parts import REASONING, TEXT, TOOL_CALL, TOOL_RESULT, PartsBuilder, tool_output
from turns.streams import StreamBuffer


def events(buffer: StreamBuffer) -> list[tuple[str, dict]]:
    return [(e.event, json.loads(e.data)) for e in buffer.published()]


def test_deltas_join_into_runs_in_order_with_their_events() -> None:
    buffer = StreamBuffer()
    parts = PartsBuilder(buffer)
    parts.reasoning("thin")
    parts.reasoning("king")
    parts.provider_data({"signature": "a"})
    parts.provider_data({"signature": "b"})  # later keys win
    parts.text("Hel")
    parts.text("lo")
    out = parts.finish()
    assert out == [
        {"$type": REASONING, "text": "thinking", "providerData": '{"signature":"b"}'},
        {"$type": TEXT, "text": "Hello"},
    ]
    assert events(buffer) == [
        ("part-start", {"index": 0, "type": "reasoning"}),
        ("delta", {"index": 0, "text": "thin"}),
        ("delta", {"index": 0, "text": "king"}),
        ("part-start", {"index": 1, "type": "text"}),
        ("delta", {"index": 1, "text": "Hel"}),
        ("delta", {"index": 1, "text": "lo"}),
    ]
    assert parts.first_delta_at is not None


def test_whole_parts_end_the_run_and_are_published_whole() -> None:
    buffer = StreamBuffer()
    parts = PartsBuilder(buffer)
    parts.text("Let me look. ")
    parts.tool_call("c1", "lookup", '{"q":"x"}')
    parts.tool_result("c1", {"answer": 42})
    parts.tool_result("c2", "boom", is_error=True)
    parts.text('"quoted"')
    out = parts.finish()
    assert [p["$type"] for p in out] == [TEXT, TOOL_CALL, TOOL_RESULT, TOOL_RESULT, TEXT]
    assert out[2]["output"] == '{"answer":42}' and "isError" not in out[2]
    assert out[3] == {"$type": TOOL_RESULT, "callId": "c2", "output": "boom", "isError": True}
    assert ("part", {"index": 1, "part": out[1]}) in events(buffer)
    # A delta with JSON-special characters is still one valid JSON event.
    assert events(buffer)[-1] == ("delta", {"index": 4, "text": '"quoted"'})


def test_without_a_buffer_nothing_is_published_and_parts_are_the_same() -> None:
    parts = PartsBuilder(None)
    parts.text("a")
    parts.tool_call("c", "t", "{}")
    assert parts.finish() == [{"$type": TEXT, "text": "a"},
                              {"$type": TOOL_CALL, "callId": "c", "tool": "t", "input": "{}"}]


def test_tool_output_is_json_unless_already_a_string() -> None:
    assert tool_output("plain") == "plain"
    assert tool_output({"é": [1, None]}) == '{"é":[1,null]}'
