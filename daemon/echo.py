"""The built-in ``echo`` provider: an OpenAI-compatible endpoint served by turnd itself.

It answers with ``Echo: <the last user message>``, streamed a few words per chunk in
exactly the shape of OpenAI's Chat Completions stream, so a new user sees the whole
path (write -> claim -> model -> stream -> final record) work before adding a key.
It is deterministic: the same request gives the same text and the same usage. turnd's own
title request is answered with the first words of the user's message, so the embedded
defaults list conversations by what was said, not as "Echo: User: ...".
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from daemon.config_file import client_host, parse_listen
from turns.settings import Provider

if TYPE_CHECKING:
    from fastapi import APIRouter

WORDS_PER_CHUNK = 3

ECHO = "echo"  # the provider's name, reserved
ECHO_LABEL = "echo (built-in test provider)"
ECHO_MODEL = "echo"


def echo_provider(listen: str) -> Provider:
    host, port = parse_listen(listen)
    return Provider(
        name=ECHO,
        base_url=f"http://{client_host(host)}:{port}/echo/v1",
        # Not a secret: the openai client insists on some key, the echo ignores it.
        api_key="echo",
        models=(ECHO_MODEL,),
        label=ECHO_LABEL,
    )



class ChatRequest(BaseModel):
    # Clients send many optional fields (tools, temperature, reasoning_effort ...): keep them.
    model_config = ConfigDict(extra="allow")

    model: str = ECHO_MODEL
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None


def _text_of(content: Any) -> str:
    """The text of an OpenAI message content (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    texts.append(str(part.get("text", "")))
                elif part.get("type") == "image_url":
                    texts.append("[image]")
        return "\n".join(texts)
    return ""


def echo_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            text = _text_of(message.get("content")).strip()
            return f"Echo: {text}" if text else "Echo: (empty message)"
    return "Echo: (no user message)"


def echo_title(user_text: str) -> str:
    """The echo's answer to a title request: the first line of the user's message (what a
    model would make of "hello"), never the request itself echoed back ("Echo: User: ...")."""
    first_line = next((line for line in user_text.splitlines() if line.strip()), "")
    title = " ".join(first_line.split())  # turnd keeps at most 60 characters, cut at a word
    return title[:1].upper() + title[1:]


def _chunks(text: str) -> list[str]:
    """A few words per chunk, whitespace kept, so the joined chunks are ``text`` exactly."""
    pieces = text.split(" ")
    return [
        " ".join(pieces[i : i + WORDS_PER_CHUNK])
        + (" " if i + WORDS_PER_CHUNK < len(pieces) else "")
        for i in range(0, len(pieces), WORDS_PER_CHUNK)
    ]


def _usage(messages: list[dict[str, Any]], completion: int) -> dict[str, int]:
    # Whitespace words stand in for tokens: deterministic and good enough for a test provider.
    prompt = sum(len(_text_of(m.get("content")).split()) for m in messages)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def _stream(req: ChatRequest, text: str) -> AsyncIterator[bytes]:
    ident = f"chatcmpl-echo-{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    pieces = _chunks(text)
    yield _sse(chunk({"role": "assistant", "content": ""}))
    for piece in pieces:
        yield _sse(chunk({"content": piece}))
    yield _sse(chunk({}, "stop"))
    if (req.stream_options or {}).get("include_usage"):
        yield _sse(
            {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": req.model,
                "system_fingerprint": None,
                "choices": [],
                "usage": _usage(req.messages, len(pieces)),
            }
        )
    yield _sse("[DONE]")


def router() -> APIRouter:
    """Mounted by the HTTP app at ``/echo/v1``."""
    # fastapi is imported here, not above: the config (and so ``turnd send``) imports
    # this module for the provider's name, and must not pay for the HTTP framework.
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse, StreamingResponse

    from turns.titles import asked_title

    api = APIRouter(prefix="/echo/v1", tags=[ECHO_LABEL])

    @api.get("/models", summary="The models of the built-in echo provider")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": ECHO_MODEL,
                    "object": "model",
                    "created": 0,
                    "owned_by": ECHO_LABEL,
                }
            ],
        }

    @api.post("/chat/completions", summary="Echo the last user message (built-in test provider)")
    async def chat_completions(req: ChatRequest) -> Any:
        asked = asked_title(req.messages)
        text = echo_text(req.messages) if asked is None else echo_title(asked)
        if req.stream:
            return StreamingResponse(
                _stream(req, text),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        pieces = _chunks(text)
        return JSONResponse(
            {
                "id": f"chatcmpl-echo-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.model,
                "system_fingerprint": None,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": _usage(req.messages, len(pieces)),
            }
        )

    return api
