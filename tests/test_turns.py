"""The acceptance criteria of the seed "Chat Turns", one test each (named after it).

Every test runs the real engine on a real local store, through the real
``openai`` client, against the fake model server on loopback.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from plugins import AFTER_MODEL, BEFORE_MODEL, TURN_AFTER, Plugin, PluginSet, Tool
from recordstore import MESSAGE, PREFERENCES, SETTINGS, SETTINGS_SPACE
from recordstore.keys import new_tid
from testbed.fakemodel import Reply, ToolCall
from tests.support.records import text_part
from tests.support.turnkit import API_KEY, DID, OTHER_DID, turn_kit, user_message
from turns.settings import TurnSettings

pytestmark = pytest.mark.anyio


def iso(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def texts(value: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in value["content"]["parts"] if p["$type"].endswith("#textPart"))


async def test_posting_with_generation_writes_user_message_pending_reply_then_final(tmp_path, fake):
    fake.push(Reply.text(["Hel", "lo"]).delayed(ttft=0.3))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation(title="t")
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("hi")], generation={}
        )
        assert posted.turn == "claimed" and posted.reply_key == f"{posted.user_key}.r0"
        pending = (await kit.messages(skey))[posted.reply_key]
        assert pending["status"] == "pending" and pending["parent"] == posted.user_key
        assert pending["content"]["parts"] == []
        # Placeholders are unique per claim (a PDS claim reads the key back and compares).
        assert pending["claim"].startswith(kit.state.instance_id + ":")
        final = await kit.reply(skey, posted.reply_key)
        assert final["status"] == "complete" and texts(final) == "Hello"
        assert final["model"] == {"provider": "fake", "id": "fake-model"}
        assert "claim" not in final
        assert (await kit.messages(skey))[posted.user_key]["role"] == "user"


async def test_text_with_unicode_line_separators_is_relayed_whole(tmp_path, fake):
    # JSON lets U+2028, U+2029 and U+0085 stand unescaped in a string (the fake, like a
    # Node or Rust server, writes them so); SSE ends lines only at \r and \n. httpx's
    # line reader split at them too, and the turn failed on half a chunk.
    fake.push(Reply.text(["one\u2028two", "\u2029three\x85four"]))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("hi")], generation={}
        )
        final = await kit.reply(skey, posted.reply_key)
        assert final["status"] == "complete", final.get("error")
        assert texts(final) == "one\u2028two\u2029three\x85four"


async def test_posting_without_generation_writes_only_the_user_message(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("hi")], generation=None)
        assert posted.turn is None and posted.reply_key is None
        assert list(await kit.messages(skey)) == [posted.user_key]
        assert fake.request_count == 0


async def test_direct_write_with_generation_seen_through_live_sync_starts_a_turn(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit, anyio.create_task_group() as tg:
        await tg.start(kit.feed)
        await kit.until_live()
        skey, key = new_tid(), new_tid()
        # Created three hours ago by the client's clock: seen live, its age does not matter.
        old = iso(-timedelta(hours=3))
        await user_message(kit.store, skey, key, "direct", generation={"attempt": 0}, createdAt=old)
        final = await kit.reply(skey, f"{key}.r0")
        assert final["status"] == "complete"
        assert (await kit.delivered(key)).live  # the turn came from live sync, not a backfill
        tg.cancel_scope.cancel()


async def test_old_unanswered_message_seen_during_backfill_does_not_start_a_turn(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey, key, control = new_tid(), new_tid(), new_tid()
        await user_message(kit.store, skey, key, "old", generation={}, createdAt=iso(-timedelta(hours=3)))
        # A young message after it: its answer shows the backfill reached past the old one.
        await user_message(kit.store, skey, control, "young", generation={})
        async with anyio.create_task_group() as tg:
            await tg.start(kit.feed)
            assert (await kit.reply(skey, f"{control}.r0"))["status"] == "complete"
            change = await kit.delivered(key)
            tg.cancel_scope.cancel()
        await kit.engine.shutdown(5)
        assert not change.live and change.record["content"]["parts"][0]["text"] == "old"
        assert f"{key}.r0" not in await kit.messages(skey)
        assert fake.request_count == 1


async def test_backfill_starts_turns_for_unanswered_messages_newer_than_the_window_not_older(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = new_tid()
        old, young = new_tid(), new_tid()
        await user_message(kit.store, skey, old, "old", generation={}, createdAt=iso(-timedelta(minutes=61)))
        await user_message(kit.store, skey, young, "young", generation={}, createdAt=iso(-timedelta(minutes=59)))
        async with anyio.create_task_group() as tg:
            await tg.start(kit.feed)
            final = await kit.reply(skey, f"{young}.r0")
            tg.cancel_scope.cancel()
        assert final["status"] == "complete"
        assert f"{old}.r0" not in await kit.messages(skey)
        assert fake.request_count == 1


async def test_message_authored_by_someone_other_than_the_owner_does_not_start_a_turn(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey, key, control = new_tid(), new_tid(), new_tid()
        await user_message(kit.store, skey, key, "not yours", did=OTHER_DID, generation={})
        await user_message(kit.store, skey, control, "yours", generation={})
        async with anyio.create_task_group() as tg:
            await tg.start(kit.feed)
            await kit.until_live()
            # Live as well as in the backfill.
            live_key = new_tid()
            await user_message(kit.store, skey, live_key, "not yours, live", did=OTHER_DID, generation={})
            assert (await kit.reply(skey, f"{control}.r0"))["status"] == "complete"
            delivered = [await kit.delivered(key), await kit.delivered(live_key)]
            tg.cancel_scope.cancel()
        await kit.engine.shutdown(5)
        assert [c.did for c in delivered] == [OTHER_DID, OTHER_DID]
        for k in (key, live_key):
            assert await kit.store.get_record(OTHER_DID, skey, MESSAGE, f"{k}.r0") is None
        assert fake.request_count == 1


async def _start_on(kit: Any, skey: str, key: str, outcomes: list[str | None]) -> None:
    outcomes.append(await kit.engine.start_turn(DID, skey, key))


async def test_when_web_ui_and_sync_both_notice_a_message_exactly_one_generation_runs(tmp_path, fake):
    fake.default = Reply.text(["one"]).delayed(ttft=0.05)
    settings = TurnSettings(retries=0, rate_per_minute=1000)
    rounds = 20
    # Two engines (two daemons, their own state files) on one store, each with its change
    # feed: only the create-only claim can keep them from both generating.
    async with (
        turn_kit(tmp_path, fake, settings=settings) as a,
        turn_kit(tmp_path, fake, settings=settings, state_path=tmp_path / "b.sqlite3") as b,
        anyio.create_task_group() as tg,
    ):
        assert a.state.instance_id != b.state.instance_id
        await tg.start(a.feed)
        await tg.start(b.feed)
        skey = await a.conversation()
        keys = []
        for i in range(rounds):
            if i % 2:
                # The web UI's route on one daemon, then a start on the other.
                posted = await a.engine.post_message(
                    DID, skey, parent=None, parts=[text_part("x")], generation={}
                )
                keys.append(posted.user_key)
                outcomes = [posted.turn, await b.engine.start_turn(DID, skey, posted.user_key)]
            else:
                # A direct write both feeds see, and both daemons' starts racing on it.
                key = new_tid()
                await user_message(a.store, skey, key, f"m{i}", generation={})
                keys.append(key)
                outcomes = []
                async with anyio.create_task_group() as race:
                    for kit in (a, b):
                        race.start_soon(_start_on, kit, skey, key, outcomes)
            assert sorted(outcomes) == ["answered", "claimed"], outcomes
        for key in keys:
            assert (await a.reply(skey, f"{key}.r0"))["status"] == "complete"
        tg.cancel_scope.cancel()
        await a.engine.shutdown(5)
        await b.engine.shutdown(5)
    assert fake.request_count == rounds
    assert sorted(r.json["messages"][-1]["content"] for r in fake.chat_requests) == sorted(
        ["x"] * (rounds // 2) + [f"m{i}" for i in range(0, rounds, 2)]
    )


async def test_regenerating_raises_the_attempt_and_writes_a_new_reply_keeping_earlier_ones(tmp_path, fake):
    fake.push("first", "second")
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        await kit.reply(skey, posted.reply_key)
        reply, turn = await kit.engine.regenerate(DID, skey, posted.user_key, effort="high")
        assert reply == f"{posted.user_key}.r1" and turn == "claimed"
        second = await kit.reply(skey, reply)
        messages = await kit.messages(skey)
        assert texts(messages[f"{posted.user_key}.r0"]) == "first" and texts(second) == "second"
        assert messages[posted.user_key]["generation"]["attempt"] == 1
        assert second["effort"] == "high"
        assert fake.chat_requests[-1].json["reasoning_effort"] == "high"


async def test_an_edit_creates_a_sibling_message_with_the_same_parent_and_its_own_reply(tmp_path, fake):
    fake.push("a1", "a2", "edited")
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        first = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q1")], generation={})
        await kit.reply(skey, first.reply_key)
        second = await kit.engine.post_message(
            DID, skey, parent=first.reply_key, parts=[text_part("q2")], generation={}
        )
        await kit.reply(skey, second.reply_key)
        edit = await kit.engine.post_message(
            DID, skey, parent=first.reply_key, parts=[text_part("q2 edited")], generation={}
        )
        assert texts(await kit.reply(skey, edit.reply_key)) == "edited"
        messages = await kit.messages(skey)
        assert messages[edit.user_key]["parent"] == messages[second.user_key]["parent"]
        sent = fake.chat_requests[-1].json["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"] == ["q1", "q2 edited"]


async def test_model_resolution_follows_request_then_last_completed_reply_then_preferences_then_admin(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        # Admin default.
        a = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("1")], generation={})
        assert (await kit.reply(skey, a.reply_key))["model"] == {"provider": "fake", "id": "fake-model"}
        # Preferences win over the admin default (a new branch: no reply above).
        await kit.store.create_space(DID, SETTINGS, SETTINGS_SPACE)
        await kit.store.put_record(DID, SETTINGS_SPACE, PREFERENCES, "self", {
            "$type": PREFERENCES, "defaultModel": {"provider": "other", "id": "pref-model"},
            "updatedAt": iso(timedelta()),
        })
        b = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("2")], generation={})
        assert (await kit.reply(skey, b.reply_key))["model"]["id"] == "pref-model"
        # The request wins.
        c = await kit.engine.post_message(
            DID, skey, parent=b.reply_key, parts=[text_part("3")],
            generation={"model": {"provider": "fake", "id": "asked"}},
        )
        assert (await kit.reply(skey, c.reply_key))["model"]["id"] == "asked"
        # Then the last completed reply up the branch wins over preferences.
        d = await kit.engine.post_message(DID, skey, parent=c.reply_key, parts=[text_part("4")], generation={})
        assert (await kit.reply(skey, d.reply_key))["model"]["id"] == "asked"
        # A reply that did not complete is passed over, whatever model it names.
        e = await kit.engine.post_message(DID, skey, parent=d.reply_key, parts=[text_part("5")], generation=None)
        await kit.store.create_record(DID, skey, MESSAGE, f"{e.user_key}.r0", {
            "$type": MESSAGE, "role": "assistant", "parent": e.user_key, "status": "error",
            "error": "broken", "model": {"provider": "other", "id": "failed-model"},
            "content": {"$type": "network.sharedcomputer.chat.defs#plainContent", "parts": []},
            "createdAt": iso(timedelta()),
        })
        f = await kit.engine.post_message(DID, skey, parent=f"{e.user_key}.r0", parts=[text_part("6")], generation={})
        assert (await kit.reply(skey, f.reply_key))["model"]["id"] == "asked"
        assert [r.json["model"] for r in fake.chat_requests] == ["fake-model", "pref-model", "asked", "asked", "asked"]


async def test_prompt_contains_only_the_branch_with_custom_instructions_and_system_prompt_as_instructions(tmp_path, fake):
    fake.push("r1", "sibling", "r2")
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, system_prompt="BASE")) as kit:
        await kit.store.create_space(DID, SETTINGS, SETTINGS_SPACE)
        await kit.store.put_record(DID, SETTINGS_SPACE, PREFERENCES, "self", {
            "$type": PREFERENCES, "customInstructions": "CUSTOM", "updatedAt": iso(timedelta()),
        })
        skey = await kit.conversation(system_prompt="CONVERSATION")
        one = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q1")], generation={})
        await kit.reply(skey, one.reply_key)
        other = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("other branch")], generation={})
        await kit.reply(skey, other.reply_key)
        two = await kit.engine.post_message(DID, skey, parent=one.reply_key, parts=[text_part("q2")], generation={})
        await kit.reply(skey, two.reply_key)
        sent = fake.chat_requests[-1].json["messages"]
        assert sent == [
            {"role": "system", "content": "BASE\n\nCUSTOM\n\nCONVERSATION"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "r1"},
            {"role": "user", "content": "q2"},
        ]


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Not/AZone", None])
async def test_instructions_start_with_the_base_prompt_with_the_date_in_the_users_zone_falling_back_to_utc(
    tmp_path, fake, zone
):
    from zoneinfo import ZoneInfo

    settings = TurnSettings(retries=0, system_prompt="{{appName}} {{date}} {{time}} {{timezone}}")
    async with turn_kit(tmp_path, fake, settings=settings) as kit:
        if zone:
            await kit.store.create_space(DID, SETTINGS, SETTINGS_SPACE)
            await kit.store.put_record(DID, SETTINGS_SPACE, PREFERENCES, "self", {
                "$type": PREFERENCES, "timezone": zone, "updatedAt": iso(timedelta()),
            })
        skey = await kit.conversation()
        before = datetime.now(UTC).replace(second=0, microsecond=0)
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        await kit.reply(skey, posted.reply_key)
        after = datetime.now(UTC)
    expected_zone = "Pacific/Kiritimati" if zone == "Pacific/Kiritimati" else "UTC"
    system = fake.chat_requests[0].json["messages"][0]["content"]
    found = re.fullmatch(r"turnd (\w+, \d{2} \w+ \d{4}) (\d{2}:\d{2}) (\S+)", system)
    assert found, system
    assert found[3] == expected_zone
    # {{date}} and {{time}} read together as a wall-clock time in that zone fall between the
    # clock before and after the turn: the same wall clock in another zone is hours away
    # (Kiritimati is UTC+14), at any hour of the day.
    stamp = datetime.strptime(f"{found[1]} {found[2]}", "%A, %d %B %Y %H:%M")
    assert before <= stamp.replace(tzinfo=ZoneInfo(expected_zone)) <= after


def _echo_tool(name: str = "lookup") -> Tool:
    async def handler(args: dict[str, Any], ctx: Any) -> Any:
        return {"echo": args}

    return Tool(name, "echo the arguments", {"type": "object", "properties": {}}, handler)


async def test_hooks_receive_the_names_of_the_tools_offered_this_turn(tmp_path, fake):
    seen: list[list[str]] = []
    plugin = Plugin("p", tools=[_echo_tool("lookup"), _echo_tool("unused")])
    plugin.on(BEFORE_MODEL)(lambda messages, ctx: seen.append(list(ctx.tools)) or messages)
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin])) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("q")], generation={"tools": ["lookup", "missing"]}
        )
        await kit.reply(skey, posted.reply_key)
    assert seen == [["lookup"]]
    assert [t["function"]["name"] for t in fake.chat_requests[0].json["tools"]] == ["lookup"]


async def test_error_and_pending_replies_are_left_out_of_the_prompt_and_cancelled_keep_partial_text(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        chain = []
        parent = None
        for status, text in (("error", "broken"), ("pending", "half"), ("cancelled", "partial")):
            key = new_tid()
            await user_message(kit.store, skey, key, f"q-{status}", parent=parent) if parent else await user_message(kit.store, skey, key, f"q-{status}")
            reply = f"{key}.r0"
            await kit.store.create_record(DID, skey, MESSAGE, reply, {
                "$type": MESSAGE, "role": "assistant", "parent": key, "status": status,
                "content": {"$type": "network.sharedcomputer.chat.defs#plainContent", "parts": [text_part(text)]},
                "createdAt": iso(timedelta()),
            })
            chain.append(key)
            parent = reply
        posted = await kit.engine.post_message(DID, skey, parent=parent, parts=[text_part("last")], generation={})
        await kit.reply(skey, posted.reply_key)
    sent = fake.chat_requests[0].json["messages"][1:]
    assert sent == [
        {"role": "user", "content": "q-error"},
        {"role": "user", "content": "q-pending"},
        {"role": "user", "content": "q-cancelled"},
        {"role": "assistant", "content": "partial"},
        {"role": "user", "content": "last"},
    ]


async def test_stream_parts_map_to_lexicon_parts_with_tool_input_and_output_json_encoded(tmp_path, fake):
    fake.push(
        Reply(
            reasoning_deltas=("think", "ing"),
            reasoning_field="reasoning",
            text_deltas=("Let me look.",),
            calls=(ToolCall("lookup", {"q": "Paris"}, id="call_1"), ToolCall("text_tool", {"n": 1}, id="call_2")),
            interleave_calls=True,
        ).with_extra(delta={"reasoning_signature": "sig"}).with_usage(1, 1, 2),
        Reply.text(["It is ", "22 °C."]).with_usage(10, 5, 2),
    )

    async def as_text(args: dict[str, Any], ctx: Any) -> str:
        return "plain"

    tools = [
        Tool("lookup", "d", {"type": "object"}, _echo_tool().handler),
        Tool("text_tool", "d", {"type": "object"}, as_text),
    ]
    plugin = Plugin("p", tools=tools)
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin])) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("q")], generation={"tools": ["lookup", "text_tool"]}
        )
        final = await kit.reply(skey, posted.reply_key)
    parts = final["content"]["parts"]
    kinds = [p["$type"].split("#")[1] for p in parts]
    assert kinds == ["reasoningPart", "textPart", "toolCallPart", "toolCallPart",
                     "toolResultPart", "toolResultPart", "textPart"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        by_kind.setdefault(p["$type"].split("#")[1], []).append(p)
    assert by_kind["reasoningPart"][0]["text"] == "thinking"
    assert json.loads(by_kind["reasoningPart"][0]["providerData"]) == {"reasoning_signature": "sig"}
    calls = by_kind["toolCallPart"]
    assert [(c["callId"], c["tool"], json.loads(c["input"])) for c in calls] == [
        ("call_1", "lookup", {"q": "Paris"}), ("call_2", "text_tool", {"n": 1})
    ]
    results = by_kind["toolResultPart"]
    assert json.loads(results[0]["output"]) == {"echo": {"q": "Paris"}}
    assert results[1]["output"] == "plain"  # already a string: not encoded again
    assert texts(final).endswith("It is 22 °C.")
    # Usage is summed over the steps.
    assert final["usage"] == {"inputTokens": 11, "outputTokens": 6, "reasoningTokens": 4}
    # The model saw the tool results in the next step.
    followup = fake.chat_requests[-1].json["messages"]
    assert followup[-1] == {"role": "tool", "tool_call_id": "call_2", "content": "plain"}


async def test_a_tool_error_or_timeout_is_a_result_the_model_sees(tmp_path, fake):
    async def failing(args: dict[str, Any], ctx: Any) -> str:
        raise RuntimeError("boom")

    async def slow(args: dict[str, Any], ctx: Any) -> str:
        await anyio.sleep(10)
        return "late"

    fake.push(
        Reply.tool_calls([ToolCall("failing", {}, id="c1"), ToolCall("slow", {}, id="c2")]),
        Reply.text("done"),
    )
    plugin = Plugin("p", tools=[Tool("failing", "d", {}, failing), Tool("slow", "d", {}, slow)])
    settings = TurnSettings(retries=0, tool_timeout_seconds=0.2)
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin]), settings=settings) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("q")], generation={"tools": ["failing", "slow"]}
        )
        final = await kit.reply(skey, posted.reply_key)
    assert final["status"] == "complete"
    results = [p for p in final["content"]["parts"] if p["$type"].endswith("toolResultPart")]
    assert [r["isError"] for r in results] == [True, True]
    assert "boom" in results[0]["output"] and "timed out" in results[1]["output"]


async def test_a_loop_guard_stops_a_model_repeating_the_same_tool_call(tmp_path, fake):
    fake.default = Reply.tool_calls([ToolCall("lookup", {"q": "same"}, id="c")])
    plugin = Plugin("p", tools=[_echo_tool()])
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin])) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("q")], generation={"tools": ["lookup"]}
        )
        final = await kit.reply(skey, posted.reply_key)
    assert final["status"] == "error" and "loop" in final["error"]
    assert fake.request_count == 2
    assert sum(p["$type"].endswith("toolCallPart") for p in final["content"]["parts"]) == 1


async def test_a_provider_error_ends_the_turn_with_error_a_message_without_secrets_and_the_partial_parts(tmp_path, fake):
    fake.push(Reply.text(["partial ", "text ", "more"]).stream_error(3, message=f"bad key {API_KEY} used"))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        final = await kit.reply(skey, posted.reply_key)
        events = await kit.events(skey, posted.reply_key)
    assert final["status"] == "error"
    assert API_KEY not in json.dumps(final) and "[redacted]" in final["error"]
    assert texts(final) == "partial text "
    assert API_KEY not in json.dumps(events)
    assert fake.chat_requests[0].api_key == API_KEY  # the key did reach the provider


async def test_an_http_error_status_with_the_key_in_its_body_is_scrubbed(tmp_path, fake):
    fake.push(Reply.error(401, f"Incorrect API key provided: {API_KEY}"))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        final = await kit.reply(skey, posted.reply_key)
    assert final["status"] == "error" and "401" in final["error"]
    assert API_KEY not in final["error"]


async def test_retries_before_the_first_token_honour_retry_after(tmp_path, fake):
    fake.push(Reply.error(429, "slow down", headers={"Retry-After": "0.3"}), Reply.error(503), Reply.text("ok"))
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=2)) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        final = await kit.reply(skey, posted.reply_key)
    assert final["status"] == "complete" and texts(final) == "ok"
    # Retried twice, each time with the whole prompt. How long the client waits (the
    # Retry-After) is the openai client's own behaviour and a timing: not asserted here.
    assert fake.request_count == 3
    assert len({json.dumps(r.json, sort_keys=True) for r in fake.chat_requests}) == 1


async def test_cancelling_ends_the_turn_with_cancelled_and_the_partial_parts(tmp_path, fake):
    fake.push(Reply.text(["a", "b"]).stall(3))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        # Wait until both deltas reached the reply's stream (the model then stalls).
        deltas = []
        with anyio.fail_after(10):
            async for event in kit.engine.stream(DID, skey, posted.reply_key).events():
                if event.event == "delta":
                    deltas.append(json.loads(event.data)["text"])
                if deltas == ["a", "b"]:
                    break
        assert await kit.engine.cancel(DID, skey, posted.reply_key)
        final = await kit.reply(skey, posted.reply_key)
    assert final["status"] == "cancelled" and texts(final) == "ab"


async def test_a_turn_past_the_timeout_is_cancelled(tmp_path, fake):
    fake.push(Reply.text(["slow"]).stall(2))
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, timeout_seconds=0.5)) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        final = await kit.reply(skey, posted.reply_key)
    assert final["status"] == "cancelled" and texts(final) == "slow"
    assert "timed out" in final["error"]


async def test_a_final_record_over_900_kb_moves_the_largest_tool_outputs_into_output_blobs(tmp_path, fake):
    # Three outputs of different sizes, 1 MB together: moving the largest alone is enough.
    sizes = {"a": 300_000, "b": 500_000, "c": 200_000}

    async def large(args: dict[str, Any], ctx: Any) -> str:
        return args["n"] * sizes[args["n"]]

    fake.push(
        Reply.tool_calls([ToolCall("large", {"n": n}, id=f"c{n}") for n in sizes]),
        Reply.text("done"),
    )
    plugin = Plugin("p", tools=[Tool("large", "d", {}, large)])
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin])) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("q")], generation={"tools": ["large"]}
        )
        final = await kit.reply(skey, posted.reply_key)
        assert final["status"] == "complete"
        results = [p for p in final["content"]["parts"] if p["$type"].endswith("toolResultPart")]
        moved = [r for r in results if "outputBlob" in r]
        assert [r["callId"] for r in moved] == ["cb"]
        blob = await kit.store.get_blob(DID, moved[0]["outputBlob"]["ref"]["$link"])
        assert blob.decode() == "b" * 500_000 and len(moved[0]["output"]) < 300
        assert [r["output"] for r in results if r["callId"] != "cb"] == ["a" * 300_000, "c" * 200_000]
        assert len(json.dumps(final)) < 900_000


async def test_the_stream_replays_buffered_events_to_a_late_subscriber_then_sends_live_ones(tmp_path, fake):
    fake.push(Reply.text(["a", "b", "c", "d"]).delayed(chunk_delay=0.1))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        buffer = kit.engine.stream(DID, skey, posted.reply_key)
        with anyio.fail_after(10):  # wait until some events are buffered, the turn going on
            async for event in buffer.events():
                if event.id == 2:
                    break
        assert not buffer.done
        late = await kit.events(skey, posted.reply_key)
        resumed = await kit.events(skey, posted.reply_key, after=2)
    assert [e[0] for e in late] == list(range(1, len(late) + 1))
    assert [e[1] for e in late] == ["step", "part-start", "delta", "delta", "delta", "delta", "status"]
    assert "".join(e[2]["text"] for e in late if e[1] == "delta") == "abcd"
    assert late[-1][2]["status"] == "complete"
    assert resumed == late[2:]


async def _past_the_limit(kit: Any) -> tuple[str, Any]:
    """A conversation whose first turn used the minute's one start; its second message posted."""
    skey = await kit.conversation()
    first = await kit.post(skey, "1")
    await kit.reply(skey, first.reply_key)
    return skey, await kit.post(skey, "2")


async def test_past_the_rate_limit_the_turn_waits_unclaimed_and_starts_once_the_limit_allows(tmp_path, fake):
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, rate_per_minute=1)) as kit:
        skey, second = await _past_the_limit(kit)
        assert second.turn == "queued"
        assert second.reply_key not in await kit.messages(skey)  # nothing claimed while waiting
        events = []
        async for event in kit.engine.stream(DID, skey, second.reply_key).events():
            events.append(event.event)
            break
        assert events == ["queued"]
        assert kit.engine.metrics.queue._value.get() == 1
        # The window is a sliding minute: make the first start a minute old.
        kit.engine._limiter._starts[DID][0] -= 60
        final = await kit.reply(skey, second.reply_key, wait=70)
        assert final["status"] == "complete"


async def test_the_same_unclaimed_turn_requested_twice_is_queued_once(tmp_path, fake):
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, rate_per_minute=1)) as kit:
        skey, second = await _past_the_limit(kit)
        again = await kit.engine.start_turn(DID, skey, second.user_key)
        assert (second.turn, again) == ("queued", "queued")
        assert len(await kit.state.requests()) == 1
        assert kit.engine._limiter.waiting == 1


async def test_on_startup_requested_but_unclaimed_turns_newer_than_the_window_are_retried_older_dropped(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = new_tid()
        young, old = new_tid(), new_tid()
        await user_message(kit.store, skey, young, "young", generation={})
        await user_message(kit.store, skey, old, "old", generation={})
        await kit.state.add_request(DID, skey, young, 0)
        await kit.state.add_request(DID, skey, old, 0)
    db = sqlite3.connect(tmp_path / "state.sqlite3")
    db.execute("UPDATE turn_request SET requested_at = requested_at - 7200 WHERE user_key = ?", (old,))
    db.commit()
    db.close()
    async with turn_kit(tmp_path, fake) as kit:
        await kit.engine.recover()
        assert (await kit.reply(skey, f"{young}.r0"))["status"] == "complete"
        await kit.engine.shutdown(5)  # anything recovery started has finished
        assert f"{old}.r0" not in await kit.messages(skey)
        assert await kit.state.requests() == []
        assert fake.request_count == 1


async def test_on_startup_pending_replies_this_server_claimed_are_marked_interrupted_others_left_alone(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        ours = kit.state.instance_id
        skey = new_tid()
        # mine: our claim row and our token. raced: our claim row (we crashed between the
        # row and the create) but another daemon's token, so another daemon won it. theirs:
        # another daemon's claim we never tracked.
        tokens = {"mine": f"{ours}:0a1b2c3d4e5f", "raced": "other-instance:0a1b2c3d4e5f",
                  "theirs": "other-instance:f5e4d3c2b1a0"}
        keys = {name: new_tid() for name in tokens}
        for name, key in keys.items():
            await user_message(kit.store, skey, key, "q")
            await kit.store.create_record(DID, skey, MESSAGE, f"{key}.r0", {
                "$type": MESSAGE, "role": "assistant", "parent": key, "status": "pending",
                "content": {"$type": "network.sharedcomputer.chat.defs#plainContent", "parts": [text_part("so far")]},
                "claim": tokens[name], "createdAt": iso(timedelta()),
            })
        await kit.state.add_claim(DID, skey, f"{keys['mine']}.r0")
        await kit.state.add_claim(DID, skey, f"{keys['raced']}.r0")
    async with turn_kit(tmp_path, fake) as kit:
        assert kit.state.instance_id == ours  # the same daemon, restarted
        await kit.engine.recover()
        messages = await kit.messages(skey)
        mine = messages[f"{keys['mine']}.r0"]
        assert mine["status"] == "error" and mine["error"] == "interrupted"
        assert texts(mine) == "so far" and "claim" not in mine
        for name in ("raced", "theirs"):
            other = messages[f"{keys[name]}.r0"]
            assert other["status"] == "pending" and other["claim"] == tokens[name], name
        assert await kit.state.claims() == []


async def test_a_turn_reads_the_conversation_from_the_record_store_and_stores_no_content_server_side(tmp_path, fake):
    fake.push(Reply.text("SECRET-ANSWER").delayed(ttft=0.2))

    def state_dump() -> str:
        with sqlite3.connect(tmp_path / "state.sqlite3") as db:
            return "\n".join(db.iterdump())

    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, rate_per_minute=1)) as kit:
        skey = await kit.conversation(title="SECRET-TITLE")
        a = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("SECRET-QUESTION")], generation={})
        b = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("SECRET-QUEUED")], generation={})
        assert b.turn == "queued"
        # While running and queued, the state file holds references only.
        dump = state_dump()
        assert a.user_key in dump and b.user_key in dump
        assert "SECRET" not in dump
        assert texts(await kit.reply(skey, a.reply_key)) == "SECRET-ANSWER"
        # And after the turn has finished and written its reply.
        await kit.engine.shutdown(5)
    dump = state_dump()
    assert b.user_key in dump  # the queued request is kept for the next start
    assert "SECRET" not in dump


async def test_an_invalid_direct_write_message_with_a_generation_request_gets_an_error_reply_quoting_the_validation_error(
    tmp_path, fake
):
    from recordstore.cid import record_cid

    async with turn_kit(tmp_path, fake) as kit, anyio.create_task_group() as tg:
        await tg.start(kit.feed)
        skey, key = new_tid(), new_tid()
        await kit.store.create_space(DID, "network.sharedcomputer.chat.conversation", skey)
        raw = {"$type": MESSAGE, "role": "user", "content": {"$type": "network.sharedcomputer.chat.defs#plainContent",
               "parts": [{"$type": "network.sharedcomputer.chat.defs#textPart"}]},
               "generation": {"attempt": 2}, "createdAt": iso(timedelta())}

        # The store refuses to write it, so it is written as another program (or an older
        # turnd) would: straight into the store's file. The feed validates what it reads.
        def write_raw() -> None:
            with sqlite3.connect(kit.store.db_path) as db:
                db.execute(
                    "INSERT INTO records (did, space, collection, key, cid, value) VALUES (?, ?, ?, ?, ?, ?)",
                    (DID, skey, MESSAGE, key, record_cid(raw), json.dumps(raw)),
                )

        await anyio.to_thread.run_sync(write_raw)
        reply = await kit.reply(skey, f"{key}.r2")
        change = await kit.delivered(key)
        tg.cancel_scope.cancel()
    assert change.error is not None and "text" in change.error
    assert reply["status"] == "error" and change.error in reply["error"]
    assert fake.request_count == 0


async def test_encrypted_content_with_a_generation_request_gets_an_error_reply(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit, anyio.create_task_group() as tg:
        await tg.start(kit.feed)
        skey, key = new_tid(), new_tid()
        await kit.store.create_space(DID, "network.sharedcomputer.chat.conversation", skey)
        await kit.store.create_record(DID, skey, MESSAGE, key, {
            "$type": MESSAGE, "role": "user", "generation": {},
            "content": {"$type": "network.sharedcomputer.chat.defs#encryptedContent", "scheme": "x",
                        "keyId": "k", "nonce": {"$bytes": "AAAA"}, "ciphertext": {"$bytes": "AAAA"}},
            "createdAt": iso(timedelta()),
        })
        reply = await kit.reply(skey, f"{key}.r0")
        tg.cancel_scope.cancel()
    assert reply["status"] == "error" and "encrypted" in reply["error"]


async def test_the_turn_after_hook_runs_after_the_final_record_is_written_with_the_turn_context(tmp_path, fake):
    seen: list[Any] = []
    ran = anyio.Event()
    plugin = Plugin("p")
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin])) as kit:

        async def after(ctx: Any) -> None:
            records, _ = await kit.store.list_records(DID, skey, MESSAGE)
            seen.append((ctx, {r.key: r.value["status"] for r in records if r.value["role"] == "assistant"}))
            ran.set()

        plugin.on(AFTER_MODEL)(lambda record, ctx: {**record, "status": record["status"]})
        plugin.on(TURN_AFTER)(after)
        skey = await kit.conversation()
        posted = await kit.engine.post_message(DID, skey, parent=None, parts=[text_part("q")], generation={})
        await kit.reply(skey, posted.reply_key)
        with anyio.fail_after(5):
            await ran.wait()
    ctx, statuses = seen[0]
    assert statuses == {posted.reply_key: "complete"}
    assert ctx.user == DID and ctx.reply["status"] == "complete" and ctx.model["id"] == "fake-model"
    assert ctx.conversation.endswith(skey)


async def test_shutdown_stops_queued_turns_at_once_and_keeps_their_requests_for_the_next_start(tmp_path, fake):
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, rate_per_minute=1)) as kit:
        skey, second = await _past_the_limit(kit)
        assert second.turn == "queued"
        with anyio.fail_after(5):
            await kit.engine.shutdown(grace=30)
        assert second.reply_key not in await kit.messages(skey)
        assert [r.user_key for r in await kit.state.requests()] == [second.user_key]


async def test_the_first_delta_of_a_burst_reaches_subscribers_before_the_rest_is_parsed(
    tmp_path, fake
):
    # 400 deltas in one write, as a provider or a proxy may send them: parsed without the
    # loop running anything else, a subscriber's first batch would hold all of them.
    fake.push(Reply.text([f"t{i} " for i in range(400)]).delayed(ttft=0.3))
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation(title="t")
        posted = await kit.post(skey, "hi")
        buffer = kit.engine.stream(DID, skey, posted.reply_key)
        assert buffer is not None
        batches = []
        with anyio.fail_after(10):
            async for batch in buffer.batches():
                batches.append([e.event for e in batch])
        first = next(b for b in batches if "delta" in b)
        assert first.count("delta") < 10, first
        assert sum(b.count("delta") for b in batches) == 400
        assert texts(await kit.reply(skey, posted.reply_key)) == "".join(f"t{i} " for i in range(400))


async def test_a_posted_message_whose_turn_already_ran_here_is_not_started_again(tmp_path, fake):
    """The change feed can start a posted message's turn, and finish it, before the POST
    that wrote the message starts it (under load its write came back from aiosqlite's
    thread late). The POST then finds it answered, and the finished reply's stream keeps
    its deltas for a subscriber who comes now: a second runner used to lose the claim and
    put a stream of the stored status alone in its place."""
    from recordstore import Record
    from turns import records
    from turns.address import TurnAddress

    async with turn_kit(tmp_path, fake) as kit:
        fake.push(Reply.text(["Hel", "lo"]))
        skey = await kit.conversation()
        key = new_tid()
        value = records.user_message([text_part("hi")], None, {})
        created = await kit.store.create_record(DID, skey, MESSAGE, key, value)
        assert await kit.engine.start_turn(DID, skey, key) == "claimed"  # as the feed does
        with anyio.fail_after(10):
            await kit.engine._starts[TurnAddress(DID, skey, key, 0)].finished.wait()
        assert isinstance(created, Record)
        assert await kit.engine._start(DID, skey, created, fresh=True) == "answered"  # the POST
        events = await kit.events(skey, f"{key}.r0")
        assert [data["text"] for _, name, data in events if name == "delta"] == ["Hel", "lo"]
        assert events[-1][1] == "status" and events[-1][2]["status"] == "complete"
        assert fake.request_count == 1


async def test_a_posted_turn_uses_the_info_its_post_read_and_a_queued_one_reads_it_again(tmp_path, fake):
    """A POST reads the conversation's info (to know it exists) and its turn does not
    read it again a moment later. A turn that waited in the rate limit's queue does:
    the system prompt changed meanwhile is the one its model is sent."""
    from recordstore import INFO

    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=0, rate_per_minute=1)) as kit:
        skey = await kit.conversation(system_prompt="Answer in French.")
        first = await kit.post(skey, "1")
        await kit.reply(skey, first.reply_key)
        assert fake.last_request.json["messages"][0]["content"].endswith("Answer in French.")
        second = await kit.post(skey, "2")
        assert second.turn == "queued"
        info = await kit.store.get_record(DID, skey, INFO, "self")
        await kit.store.put_record(DID, skey, INFO, "self", {**info.value, "systemPrompt": "Answer in German."})
        kit.engine._limiter._starts[DID][0] -= 60  # the minute's start is a minute old
        await kit.reply(skey, second.reply_key)
        assert fake.last_request.json["messages"][0]["content"].endswith("Answer in German.")
