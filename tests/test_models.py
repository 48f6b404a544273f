"""turns.models: which model and effort a turn uses."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest

from testbed.fakemodel import FakeModel, Reply
from turns.models import (
    Clients,
    choose_effort,
    choose_model,
    parse_model,
    post_chat,
    reasoning_effort,
)
from turns.settings import Provider

DEFAULT = "admin:default-model"


def reply(model_id: str, status: str = "complete") -> dict[str, Any]:
    return {"role": "assistant", "status": status, "model": {"provider": "p", "id": model_id}}


USER = {"role": "user"}


def test_the_request_wins() -> None:
    asked = {"model": {"provider": "p", "id": "asked"}}
    prefs = {"defaultModel": {"provider": "p", "id": "pref"}}
    assert choose_model(asked, [USER, reply("earlier")], prefs, DEFAULT)["id"] == "asked"


def test_then_the_nearest_complete_reply_up_the_branch() -> None:
    branch = [USER, reply("first"), USER, reply("second"), USER]
    assert choose_model({}, branch, None, DEFAULT) == {"provider": "p", "id": "second"}


@pytest.mark.parametrize("status", ["error", "pending", "cancelled"])
def test_replies_that_did_not_complete_are_skipped(status: str) -> None:
    branch = [USER, reply("completed"), USER, reply("failed", status), USER]
    assert choose_model({}, branch, None, DEFAULT)["id"] == "completed"
    # And with no complete reply at all, preferences then the admin default.
    only_failed = [USER, reply("failed", status), USER]
    prefs = {"defaultModel": {"provider": "p", "id": "pref"}}
    assert choose_model({}, only_failed, prefs, DEFAULT)["id"] == "pref"
    assert choose_model({}, only_failed, None, DEFAULT) == {"provider": "admin", "id": "default-model"}


def test_then_preferences_then_the_admin_default() -> None:
    prefs = {"defaultModel": {"provider": "p", "id": "pref"}}
    assert choose_model({}, [USER], prefs, DEFAULT)["id"] == "pref"
    assert choose_model({}, [USER], {}, DEFAULT) == {"provider": "admin", "id": "default-model"}


def test_malformed_model_refs_are_passed_over() -> None:
    bad = {"model": {"provider": "p"}}
    assert choose_model(bad, [USER], {"defaultModel": "p:x"}, DEFAULT)["id"] == "default-model"


def test_parse_model_keeps_colons_in_the_id() -> None:
    assert parse_model("ollama:llama3:8b") == {"provider": "ollama", "id": "llama3:8b"}
    with pytest.raises(ValueError):
        parse_model("no-provider")


def test_effort_request_then_preferences() -> None:
    assert choose_effort({"effort": "high"}, {"defaultEffort": "low"}) == "high"
    assert choose_effort({}, {"defaultEffort": "low"}) == "low"
    assert choose_effort({}, None) is None
    assert reasoning_effort("max") == "high" and reasoning_effort(None) is None


@pytest.mark.anyio
async def test_a_chat_call_goes_to_the_clients_base_url_as_it_is_now(fake_model: FakeModel) -> None:
    # post_chat joins the chat path to a client's base URL once and keeps it: a client
    # whose base URL is changed afterwards must be asked at the new one.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with FakeModel() as other:
        fake_model.push(Reply.text(["one"]))
        other.push(Reply.text(["two"]))
        async with openai.AsyncOpenAI(
            base_url=fake_model.base_url, api_key="sk-test", max_retries=0
        ) as client:
            first = await post_chat(client, body, dict)
            client.base_url = other.base_url
            second = await post_chat(client, body, dict)
    assert first["choices"][0]["message"]["content"] == "one"
    assert second["choices"][0]["message"]["content"] == "two"
    assert [r.path for r in fake_model.chat_requests] == ["/v1/chat/completions"]
    assert [r.path for r in other.chat_requests] == ["/v1/chat/completions"]


@pytest.mark.anyio
async def test_a_chat_call_tells_the_provider_nothing_of_the_machine(fake_model: FakeModel) -> None:
    # The SDK's platform headers (OS, architecture, Python and SDK versions, retries, read
    # timeout) are not sent; the key and the SDK's User-Agent are.
    fake_model.push(Reply.text(["one"]))
    fake_model.push(Reply.text(["two"]))
    clients = Clients({"p": Provider("p", fake_model.base_url, "sk-test")})
    try:
        client = clients.client(clients.provider({"provider": "p", "id": "m"}), retries=2)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        await post_chat(client, body, dict)
        response = await post_chat(client, {**body, "stream": True}, httpx2.Response, stream=True)
        async for _ in response.aiter_lines():
            pass
        await response.aclose()
    finally:
        await clients.aclose()
    assert len(fake_model.chat_requests) == 2
    for request in fake_model.chat_requests:
        assert request.headers["authorization"] == "Bearer sk-test"
        assert "OpenAI/Python" in request.headers["user-agent"]
        assert not [name for name in request.headers if name.startswith("x-stainless")]
