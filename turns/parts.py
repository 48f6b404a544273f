"""Stream chunks -> lexicon parts and stream events.

Parts are kept in the order the model produced them. Text and reasoning arrive
as deltas and are published as they come (no I/O: the buffer is in memory);
tool calls, tool results and sources are published whole when finished.
"""

from __future__ import annotations

import time
from typing import Any

from recordstore.stored_json import compact
from recordstore.vocabulary import REASONING_PART as REASONING
from recordstore.vocabulary import SOURCE_PART as SOURCE
from recordstore.vocabulary import TEXT_PART as TEXT
from recordstore.vocabulary import TOOL_CALL_PART as TOOL_CALL
from recordstore.vocabulary import TOOL_RESULT_PART as TOOL_RESULT
from turns.streams import StreamBuffer

# The lexicons' maxLength of a text or reasoning part, in UTF-8 bytes: a longer run
# continues in a new part of the same type (SPEC §12), so nothing streamed is lost.
PART_TEXT_BYTES = 500_000

_EVENT_TYPE = {
    TEXT: "text",
    REASONING: "reasoning",
    TOOL_CALL: "toolCall",
    TOOL_RESULT: "toolResult",
    SOURCE: "source",
}


def encode_json(value: Any) -> str:
    return compact(value)


def tool_output(value: Any) -> str:
    """A tool result as the lexicon stores it: JSON-encoded unless already a string."""
    return value if isinstance(value, str) else encode_json(value)


class _Run:
    """A text or reasoning part being streamed."""

    __slots__ = ("index", "type", "chunks", "size", "provider_data")

    def __init__(self, index: int, type_: str) -> None:
        self.index = index
        self.type = type_
        self.chunks: list[str] = []
        self.size = 0  # UTF-8 bytes so far
        self.provider_data: dict[str, Any] | None = None


class PartsBuilder:
    def __init__(self, buffer: StreamBuffer | None) -> None:
        self.parts: list[dict[str, Any]] = []
        self._buffer = buffer
        self._run: _Run | None = None
        self.first_delta_at: float | None = None  # monotonic time of the first token
        self.streamed = 0  # text and reasoning deltas published so far

    # -- streamed text and reasoning --------------------------------------------------

    def text(self, delta: str) -> None:
        self._delta(TEXT, delta)

    def reasoning(self, delta: str) -> None:
        self._delta(REASONING, delta)

    def _delta(self, type_: str, delta: str) -> None:
        run = self._run
        if run is None or run.type != type_:
            run = self._new_run(type_)
        size = len(delta.encode())
        while run.size + size > PART_TEXT_BYTES:
            head = _utf8_prefix(delta, PART_TEXT_BYTES - run.size)
            if head:
                self._append(run, head)
            delta = delta[len(head):]
            size = len(delta.encode())
            run = self._new_run(type_)
        if delta:
            self._append(run, delta)
            run.size += size

    def _new_run(self, type_: str) -> _Run:
        self.end_run()
        run = self._run = _Run(len(self.parts), type_)
        self.parts.append({"$type": type_, "text": ""})
        self._publish_start(run.index, type_)
        return run

    def _append(self, run: _Run, delta: str) -> None:
        run.chunks.append(delta)
        self.streamed += 1
        if self.first_delta_at is None:
            self.first_delta_at = time.monotonic()
        if self._buffer is not None:
            self._buffer.publish_delta(run.index, delta)  # the hot path

    def provider_data(self, data: dict[str, Any]) -> None:
        """Provider metadata for the part being streamed; later keys win (signatures come last)."""
        if self._run is not None:
            self._run.provider_data = {**(self._run.provider_data or {}), **data}

    def end_run(self) -> None:
        run = self._run
        if run is None:
            return
        part = self.parts[run.index]
        part["text"] = "".join(run.chunks)
        if run.provider_data:
            part["providerData"] = encode_json(run.provider_data)
        self._run = None

    # -- whole parts ------------------------------------------------------------------

    def tool_call(
        self, call_id: str, tool: str, arguments: str, provider_data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        part: dict[str, Any] = {"$type": TOOL_CALL, "callId": call_id, "tool": tool, "input": arguments}
        if provider_data:
            part["providerData"] = encode_json(provider_data)
        return self._whole(part)

    def tool_result(self, call_id: str, output: Any, is_error: bool = False) -> dict[str, Any]:
        part = {"$type": TOOL_RESULT, "callId": call_id, "output": tool_output(output)}
        if is_error:
            part["isError"] = True
        return self._whole(part)

    def source(self, url: str, title: str | None = None) -> dict[str, Any]:
        part: dict[str, Any] = {"$type": SOURCE, "url": url}
        if title:
            part["title"] = title
        return self._whole(part)

    def _whole(self, part: dict[str, Any]) -> dict[str, Any]:
        self.end_run()
        index = len(self.parts)
        self.parts.append(part)
        self._publish_start(index, part["$type"])
        if self._buffer is not None:
            self._buffer.publish("part", {"index": index, "part": part})
        return part

    def _publish_start(self, index: int, type_: str) -> None:
        if self._buffer is not None:
            self._buffer.publish("part-start", {"index": index, "type": _EVENT_TYPE[type_]})

    def finish(self) -> list[dict[str, Any]]:
        self.end_run()
        return self.parts


def _utf8_prefix(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``limit`` bytes."""
    return text.encode()[:max(limit, 0)].decode(errors="ignore")
