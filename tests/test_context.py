"""SPEC §15, the context window: a real engine, a real local store, the fake model server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from recordstore import MESSAGE, SUMMARY
from testbed.fakemodel import Reply
from tests.support.records import text_part
from tests.support.turnkit import DID, long_conversation, turn_kit
from turns.context import ContextWindow, too_long
from turns.settings import TurnSettings

pytestmark = pytest.mark.anyio

# Each provider's answer to a prompt longer than its context, as its source writes it.
TOO_LONG = {
    "openai": {
        "error": {
            "message": "This model's maximum context length is 4000 tokens. However, your "
            "messages resulted in 9120 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    "vllm-legacy": {
        "object": "error",
        "message": "This model's maximum context length is 4000 tokens. However, you requested "
        "9120 tokens in the messages, Please reduce the length of the messages.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
    "vllm": {
        "error": {
            "message": "The prompt (total length 9120) is too long to fit into the model "
            "(context length 4000). Make sure that `max_model_len` is no smaller than the "
            "number of text tokens plus multimodal tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    },
    "llama.cpp": {
        "error": {
            "code": 400,
            "message": "request (9120 tokens) exceeds the available context size (4000 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 9120,
            "n_ctx": 4000,
        }
    },
    "llama.cpp-older": {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "invalid_request_error",
        }
    },
    "ollama": {
        "error": {
            "message": "the input length exceeds the context length",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    },
    "openrouter": {
        "error": {
            "message": "This endpoint's maximum context length is 4000 tokens. However, you "
            "requested about 9120 tokens (9000 of text input, 120 in the output). Please reduce "
            "the length of either one, or use the \"middle-out\" transform to compress your "
            "prompt automatically.",
            "code": 400,
            "metadata": {"provider_name": None},
        }
    },
}


def texts(value: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in value["content"]["parts"])


def sent(request: Any) -> list[dict[str, Any]]:
    return request.json["messages"]


def content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


async def all_messages(kit: Any, skey: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        page, cursor = await kit.store.list_records(DID, skey, MESSAGE, cursor=cursor)
        out.update((r.key, r.value) for r in page)
        if cursor is None:
            return out


async def ask(kit: Any, skey: str, parent: str | None, text: str) -> tuple[str, dict[str, Any], list]:
    posted = await kit.engine.post_message(
        DID, skey, parent=parent, parts=[text_part(text)], generation={}
    )
    assert posted.reply_key is not None
    events = await kit.events(skey, posted.reply_key)
    return posted.reply_key, await kit.reply(skey, posted.reply_key), events


# -- recognising the refusal -------------------------------------------------------------


@pytest.mark.parametrize("provider", sorted(TOO_LONG))
def test_each_providers_too_long_answer_is_recognised(provider):
    body = TOO_LONG[provider]
    assert too_long(400, body.get("error", body))
    assert too_long(400, body)  # whether or not the client unwrapped "error"


def test_other_400s_and_other_statuses_are_not_too_long():
    assert not too_long(400, {"message": "Invalid value for 'temperature'", "code": "invalid_value"})
    assert not too_long(429, TOO_LONG["openai"])
    assert not too_long(500, TOO_LONG["llama.cpp"])
    assert not too_long(None, TOO_LONG["openai"])


@pytest.mark.parametrize("provider", sorted(TOO_LONG))
async def test_a_too_long_refusal_is_retried_once_with_half_the_budget(tmp_path, fake, provider):
    fake.push(Reply.error(400, body=TOO_LONG[provider]), Reply.text("fits now"))
    async with turn_kit(tmp_path, fake) as kit:  # no declared context: half of what was sent
        skey, last = await long_conversation(kit, 20)
        _, final, events = await ask(kit, skey, last, "the newest question")
        assert final["status"] == "complete" and texts(final) == "fits now"
        first, second = fake.chat_requests
        assert len(sent(second)) < len(sent(first))
        size = lambda r: sum(len(content_text(m).encode()) for m in sent(r))  # noqa: E731
        assert size(second) <= size(first) / 2 + 400
        assert sent(second)[-1]["content"] == "the newest question"
        assert sent(second)[0]["role"] == "system"
        context = [data for _, name, data in events if name == "context"]
        assert context and context[-1]["dropped"] == len(sent(first)) - len(sent(second))


async def test_a_second_refusal_ends_the_turn_as_error(tmp_path, fake):
    fake.push(Reply.error(400, body=TOO_LONG["openai"]), Reply.error(400, body=TOO_LONG["openai"]))
    async with turn_kit(tmp_path, fake) as kit:
        skey, last = await long_conversation(kit, 10)
        _, final, _ = await ask(kit, skey, last, "again")
        assert final["status"] == "error" and "maximum context length" in final["error"]
        assert fake.request_count == 2


async def test_a_plain_400_is_not_retried(tmp_path, fake):
    fake.push(Reply.error(400, "Invalid value for 'temperature'", "invalid_request_error"))
    async with turn_kit(tmp_path, fake) as kit:
        skey, last = await long_conversation(kit, 3)
        _, final, _ = await ask(kit, skey, last, "q")
        assert final["status"] == "error" and fake.request_count == 1


# -- the declared context ------------------------------------------------------------------


async def test_a_long_conversation_against_a_small_context_sends_fewer_messages(tmp_path, fake):
    async with turn_kit(tmp_path, fake, model_context={"fake-model": 4000}) as kit:
        skey, last = await long_conversation(kit, 100)  # 200 messages, ~70 tokens each
        _, final, events = await ask(kit, skey, last, "the question that matters")
        assert final["status"] == "complete"
        messages = sent(fake.last_request)
        assert 202 > len(messages) > 3
        assert messages[0]["role"] == "system" and messages[0]["content"]
        assert messages[-1] == {"role": "user", "content": "the question that matters"}
        # What was kept is the newest end of the branch, in order.
        assert messages[-2]["content"].startswith("answer 99:")
        estimate = sum(len(content_text(m).encode()) for m in messages) / 3
        assert estimate <= 4000 - 2000
        context = [data for _, name, data in events if name == "context"]
        assert context == [{"dropped": 202 - len(messages), "summarized": False}]
        # The final record says nothing new.
        assert "context" not in final


async def test_a_provider_wide_context_applies_and_a_models_own_wins(tmp_path, fake):
    async with turn_kit(
        tmp_path, fake, context=100_000, model_context={"small": 3000}
    ) as kit:
        skey, last = await long_conversation(kit, 40)
        await ask(kit, skey, last, "q1")  # fake-model: provider-wide 100000, fits
        assert len(sent(fake.last_request)) == 1 + 80 + 1
        posted = await kit.engine.post_message(
            DID, skey, parent=last, parts=[text_part("q2")],
            generation={"model": {"provider": "fake", "id": "small"}},
        )
        await kit.reply(skey, posted.reply_key)
        assert len(sent(fake.last_request)) < 1 + 80 + 1


async def test_the_next_step_uses_the_previous_steps_prompt_tokens(tmp_path, fake):
    """A provider that reports far more prompt tokens than bytes/3 makes the tool step drop."""
    from plugins import Plugin, PluginSet, Tool
    from testbed.fakemodel import ToolCall

    async def echo(args: dict[str, Any], ctx: Any) -> str:
        return "result"

    tool = Tool("lookup", "look it up", {"type": "object", "properties": {}}, echo)
    plugins = PluginSet([Plugin("t", tools=[tool])])
    fake.push(
        Reply.tool_calls(ToolCall("lookup", {})).with_usage(prompt_tokens=5000, completion_tokens=5),
        Reply.text("done"),
    )
    async with turn_kit(tmp_path, fake, plugins=plugins, context=8000) as kit:
        skey, last = await long_conversation(kit, 30)  # ~2000 tokens by bytes: fits in 4000
        posted = await kit.engine.post_message(
            DID, skey, parent=last, parts=[text_part("use the tool")],
            generation={"tools": ["lookup"]},
        )
        final = await kit.reply(skey, posted.reply_key)
        assert final["status"] == "complete"
        first, second = fake.chat_requests
        assert len(sent(first)) == 1 + 60 + 1
        # 5000 reported (bytes/3 said ~2000): over the 4000 budget, so the oldest go.
        assert len(sent(second)) < len(sent(first)) + 2
        tail = sent(second)[-3:]
        assert [m["role"] for m in tail] == ["user", "assistant", "tool"]


def test_a_tool_call_is_left_out_together_with_its_result():
    import anyio

    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "u" * 300},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r" * 300},
        {"role": "assistant", "content": "a" * 300},
        {"role": "user", "content": "newest"},
    ]
    for budget in range(10, 400, 7):
        fitted = anyio.run(ContextWindow(context=budget * 2, reserve=budget).fit, messages, budget)
        kept = fitted.messages
        assert kept[0]["role"] == "system" and kept[-1]["content"] == "newest"
        calls = [m for m in kept if m.get("tool_calls")]
        results = [m for m in kept if m["role"] == "tool"]
        assert len(calls) == len(results)  # never one without the other


# -- summaries ---------------------------------------------------------------------------------


class Summariser:
    """Answers non-streamed requests (the summary calls) with numbered summaries."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, body: Any) -> Reply | None:
        if isinstance(body, dict) and not body.get("stream"):
            self.calls.append(body)
            return Reply.text(f"SUMMARY-{len(self.calls)}")
        return None


async def test_summaries_are_written_reused_on_the_branch_and_not_on_a_sibling(tmp_path, fake):
    summariser = fake.responder = Summariser()
    settings = TurnSettings(retries=0, summarize=True)
    async with turn_kit(tmp_path, fake, settings=settings, model_context={"fake-model": 4000}) as kit:
        skey, last = await long_conversation(kit, 100)
        reply, final, events = await ask(kit, skey, last, "first question")
        assert final["status"] == "complete" and len(summariser.calls) == 1
        context = [d for _, n, d in events if n == "context"]
        assert context and context[-1]["summarized"] is True and context[-1]["dropped"] > 0
        records, _ = await kit.store.list_records(DID, skey, SUMMARY)
        assert len(records) == 1
        summary = records[0]
        assert summary.value["covers"] == summary.key and summary.value["text"] == "SUMMARY-1"
        assert summary.value["model"] == {"provider": "fake", "id": "fake-model"}
        messages = await all_messages(kit, skey)
        assert summary.key in messages  # the key of the last message it covers
        first_prompt = sent(fake.last_request)
        assert "SUMMARY-1" in first_prompt[1]["content"]
        assert all("SUMMARY" not in content_text(m) for m in first_prompt[2:])

        # The same branch, one exchange later: the summary is reused, not made again.
        _, final, events = await ask(kit, skey, reply, "second question")
        assert final["status"] == "complete" and len(summariser.calls) == 1
        assert "SUMMARY-1" in sent(fake.last_request)[1]["content"]

        # A sibling branch from before the covered message: it does not pass through it.
        chain = [summary.key]
        while "parent" in messages[chain[-1]]:
            chain.append(messages[chain[-1]]["parent"])
        sibling_parent = chain[4]  # four messages before the covered one
        _, final, _ = await ask(kit, skey, sibling_parent, "a different road")
        assert final["status"] == "complete"
        prompt = sent(fake.last_request)
        assert all("SUMMARY-1" not in content_text(m) for m in prompt)
        assert len(summariser.calls) == 2 and "SUMMARY-2" in prompt[1]["content"]
        records, _ = await kit.store.list_records(DID, skey, SUMMARY)
        assert len(records) == 2


async def test_a_failing_summary_model_still_drops_and_answers(tmp_path, fake):
    def responder(body: Any) -> Reply | None:
        if isinstance(body, dict) and not body.get("stream"):
            return Reply.error(500)
        return None

    fake.responder = responder
    settings = TurnSettings(retries=0, summarize=True)
    async with turn_kit(tmp_path, fake, settings=settings, model_context={"fake-model": 4000}) as kit:
        skey, last = await long_conversation(kit, 60)
        _, final, events = await ask(kit, skey, last, "q")
        assert final["status"] == "complete"
        context = [d for _, n, d in events if n == "context"]
        assert context and context[-1]["summarized"] is False and context[-1]["dropped"] > 0
        records, _ = await kit.store.list_records(DID, skey, SUMMARY)
        assert records == []


def test_the_config_declares_contexts_presets_and_the_new_turn_settings(tmp_path):
    from daemon.config import build_config
    from daemon.config_file import ConfigError

    def config(**tables):
        data = {"providers": {"local": {"base_url": "http://127.0.0.1:9/v1", **tables.pop("local", {})}}}
        return build_config({**data, **tables}, env={}, path=None, base_dir=tmp_path)

    built = config(
        local={"context": 8192, "model": {"big": {"context": 32768}}},
        turns={"replyReserveTokens": 1000, "summarize": True, "summaryModel": "local:small",
               "titleModel": "", "imageMaxPixels": 1024},
        presets={"p": {"title": "T", "model": "local:big", "template": "x"}},
    )
    local = built.providers["local"]
    assert local.context_of("big") == 32768 and local.context_of("other") == 8192
    assert built.turns.summarize is True and built.turns.reply_reserve_tokens == 1000
    assert built.turns.title_model == "" and built.turns.image_max_pixels == 1024
    assert built.presets == {"p": {"title": "T", "model": "local:big", "template": "x"}}
    for bad, key in (
        ({"turns": {"summarize": "yes"}}, "turns.summarize"),
        ({"turns": {"summaryModel": "nowhere:m"}}, "turns.summaryModel"),
        ({"presets": {"p": {"model": "nope"}}}, "presets.p.model"),
        ({"local": {"context": 0}}, "providers.local.context"),
        ({"local": {"model": {"m": {"contxt": 5}}}}, "providers.local.model.m.contxt"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            config(**bad)
