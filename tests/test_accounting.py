"""SPEC §16 on the engine: step/retry/fallback events, usage rows, cost, quotas.

Every test runs the real engine on a real local store through the real ``openai``
client against the fake model server, which fails, reports cached tokens or its own
``usage.cost`` as a provider does.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import anyio
import pytest

from plugins import Plugin, PluginSet, Tool
from testbed.fakemodel import Reply, ToolCall
from tests.support.records import text_part
from tests.support.turnkit import DID, long_conversation, turn_kit
from turns.accounting import Accounting
from turns.pricing import Price
from turns.quota import Quota
from turns.settings import TurnSettings
from turns.usage import usage_report

pytestmark = pytest.mark.anyio

FAKE = {"provider": "fake", "id": "fake-model"}
BACKUP = {"provider": "other", "id": "backup"}


class Clock:
    """An injectable UTC clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def run_turn(kit: Any, skey: str, text: str = "q") -> tuple[str, dict[str, Any], list]:
    posted = await kit.engine.post_message(
        DID, skey, parent=None, parts=[text_part(text)], generation={}
    )
    assert posted.turn == "claimed"
    events = await kit.events(skey, posted.reply_key)
    return posted.reply_key, await kit.reply(skey, posted.reply_key), events


def named(events: list, name: str) -> list[dict[str, Any]]:
    return [data for _, event, data in events if event == name]


async def test_retries_of_the_client_are_visible_as_retry_events(tmp_path, fake):
    fake.push(
        Reply.error(429, "slow down", headers={"Retry-After": "0.2"}),
        Reply.error(503, headers={"Retry-After": "0.1"}),
        Reply.text(["ok"]),
    )
    async with turn_kit(tmp_path, fake, settings=TurnSettings(retries=2)) as kit:
        _, final, events = await run_turn(kit, await kit.conversation())
    assert final["status"] == "complete" and fake.request_count == 3
    names = [e for _, e, _ in events]
    assert names[:3] == ["step", "retry", "retry"] and names[-1] == "status"
    assert named(events, "step") == [{"index": 0, "model": FAKE}]
    assert named(events, "retry") == [
        {"step": 0, "attempt": 1, "reason": "429 Too Many Requests", "waitSeconds": 0.2},
        {"step": 0, "attempt": 2, "reason": "503 Service Unavailable", "waitSeconds": 0.1},
    ]
    # The SDK's policy, unchanged: each retry waits what Retry-After said, as the events
    # above report. How long it really waited is a timing, never asserted in tests.


async def test_a_model_failing_before_its_first_token_falls_back_in_order(tmp_path, fake):
    fake.push(
        Reply.error(500), Reply.error(500),  # fake-model, with its one retry
        Reply.error(502),  # the first fallback, no retry left... it has its own
        Reply.error(502),
        Reply.text(["from ", "backup"]),  # the second fallback answers
    )
    accounting = Accounting(fallbacks={"fake:fake-model": ["other:broken", "other:backup"]})
    async with turn_kit(
        tmp_path, fake, settings=TurnSettings(retries=1), accounting=accounting
    ) as kit:
        reply, final, events = await run_turn(kit, await kit.conversation())
        rows = await kit.state.usage_rows(DID)
    assert final["status"] == "complete" and final["model"] == BACKUP
    assert [r.json["model"] for r in fake.chat_requests] == [
        "fake-model", "fake-model", "broken", "broken", "backup"
    ]
    seq = [(e, d.get("model") or d.get("to")) for _, e, d in events if e in ("step", "fallback")]
    assert seq == [
        ("step", FAKE),
        ("fallback", {"provider": "other", "id": "broken"}),
        ("step", {"provider": "other", "id": "broken"}),
        ("fallback", BACKUP),
        ("step", BACKUP),
    ]
    first = named(events, "fallback")[0]
    assert first["from"] == FAKE and "500" in first["reason"]
    assert [r["step"] for r in named(events, "retry")] == [0, 0]
    status = named(events, "status")[0]
    assert status["model"] == BACKUP
    # One row per model call of the step: the two that failed, then the one that answered.
    assert [(r.model, r.step, r.outcome) for r in rows] == [
        ("fake-model", 0, "fallback"), ("broken", 0, "fallback"), ("backup", 0, "ok")
    ]
    assert {r.reply_key for r in rows} == {reply}


async def test_a_stream_failing_before_its_first_token_falls_back_too(tmp_path, fake):
    fake.push(Reply.text(["never"]).stream_error(1, "overloaded"), Reply.text(["fine"]))
    accounting = Accounting(fallbacks={"fake:fake-model": ["other:backup"]})
    async with turn_kit(tmp_path, fake, accounting=accounting) as kit:
        _, final, events = await run_turn(kit, await kit.conversation())
    assert final["status"] == "complete" and final["model"] == BACKUP
    assert "overloaded" in named(events, "fallback")[0]["reason"]


async def test_no_fallback_once_the_first_token_is_out(tmp_path, fake):
    fake.push(Reply.text(["partial ", "more"]).cut(after=2), Reply.text(["not used"]))
    accounting = Accounting(fallbacks={"fake:fake-model": ["other:backup"]})
    async with turn_kit(tmp_path, fake, accounting=accounting) as kit:
        _, final, events = await run_turn(kit, await kit.conversation())
    assert final["status"] == "error" and final["model"] == FAKE
    assert named(events, "fallback") == [] and fake.request_count == 1
    assert final["content"]["parts"][0]["text"] == "partial "


async def test_cost_from_configured_prices_with_cached_tokens(tmp_path, fake):
    fake.push(Reply.text(["hi"]).with_usage(1000, 200, cached_tokens=400))
    prices = {"fake:fake-model": Price(input=2.0, output=8.0, cached_input=0.5)}
    async with turn_kit(tmp_path, fake, accounting=Accounting(prices=prices)) as kit:
        _, final, events = await run_turn(kit, await kit.conversation())
        rows = await kit.state.usage_rows(DID)
    status = named(events, "status")[0]
    # (1000 - 400) × 2 + 400 × 0.5 + 200 × 8, per million tokens
    assert status["cost"] == pytest.approx(0.003)
    assert status["usage"] == {
        "inputTokens": 1000, "outputTokens": 200, "reasoningTokens": 0, "cachedTokens": 400
    }
    assert 0 <= status["ttftMs"] <= status["latencyMs"]
    assert final["usage"] == {"inputTokens": 1000, "outputTokens": 200, "reasoningTokens": 0}
    assert [(r.input_tokens, r.output_tokens, r.cached_tokens) for r in rows] == [(1000, 200, 400)]
    assert rows[0].cost == pytest.approx(0.003)


async def test_cached_input_without_its_own_price_costs_the_input_price(tmp_path, fake):
    fake.push(Reply.text(["hi"]).with_usage(1000, 0, cached_tokens=400))
    prices = {"fake:fake-model": Price(input=3.0, output=15.0)}
    async with turn_kit(tmp_path, fake, accounting=Accounting(prices=prices)) as kit:
        _, _, events = await run_turn(kit, await kit.conversation())
    assert named(events, "status")[0]["cost"] == pytest.approx(0.003)


async def test_cost_reported_by_the_provider_is_taken(tmp_path, fake):
    fake.push(Reply.text(["hi"]).with_usage(50, 10, cost=0.01234))
    async with turn_kit(tmp_path, fake) as kit:
        _, _, events = await run_turn(kit, await kit.conversation())
        rows = await kit.state.usage_rows(DID)
    assert named(events, "status")[0]["cost"] == pytest.approx(0.01234)
    assert rows[0].cost == pytest.approx(0.01234)


async def test_no_cost_without_a_price_or_a_reported_cost(tmp_path, fake):
    fake.push(Reply.text(["hi"]).with_usage(50, 10))
    async with turn_kit(tmp_path, fake) as kit:
        _, _, events = await run_turn(kit, await kit.conversation())
        rows = await kit.state.usage_rows(DID)
    status = named(events, "status")[0]
    assert "cost" not in status and "latencyMs" in status
    assert rows[0].cost is None and rows[0].input_tokens == 50


async def test_a_tool_turn_has_one_usage_row_per_step_and_no_content_in_the_state_file(
    tmp_path, fake
):
    async def lookup(args: dict[str, Any], ctx: Any) -> Any:
        return {"found": "TOOL-RESULT-TEXT"}

    plugin = Plugin("p", tools=[Tool("lookup", "d", {"type": "object"}, lookup)])
    fake.push(
        Reply.tool_calls(ToolCall("lookup", {"q": "TOOL-ARGS-TEXT"})).with_usage(30, 5),
        Reply.text(["MODEL-ANSWER-TEXT"]).with_usage(60, 9, cached_tokens=30),
    )
    prices = {"fake:fake-model": Price(input=1.0, output=2.0)}
    async with turn_kit(
        tmp_path, fake, plugins=PluginSet([plugin]), accounting=Accounting(prices=prices)
    ) as kit:
        skey = await kit.conversation()
        posted = await kit.post(skey, "USER-PROMPT-TEXT", tools=["lookup"])
        events = await kit.events(skey, posted.reply_key)
        final = await kit.reply(skey, posted.reply_key)
        rows = await kit.state.usage_rows(DID)
    assert final["status"] == "complete"
    assert named(events, "step") == [{"index": 0, "model": FAKE}, {"index": 1, "model": FAKE}]
    assert [(r.step, r.input_tokens, r.output_tokens, r.cached_tokens, r.outcome) for r in rows] == [
        (0, 30, 5, 0, "ok"), (1, 60, 9, 30, "ok")
    ]
    assert all(r.skey == skey and r.reply_key == posted.reply_key and r.kind == "turn" for r in rows)
    status = named(events, "status")[0]
    assert status["usage"]["inputTokens"] == 90 and status["usage"]["cachedTokens"] == 30
    assert status["cost"] == pytest.approx((30 + 5 * 2 + 60 + 9 * 2) / 1e6)
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("state.sqlite3*"))
    for text in (b"USER-PROMPT-TEXT", b"TOOL-ARGS-TEXT", b"TOOL-RESULT-TEXT", b"MODEL-ANSWER-TEXT"):
        assert text not in raw


async def test_past_the_daily_token_quota_no_model_is_called(tmp_path, fake):
    clock = Clock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    accounting = Accounting(
        quotas=lambda did: Quota(tokens_per_day=100) if did == DID else None, clock=clock
    )
    fake.push(Reply.text(["first"]).with_usage(80, 30))
    async with turn_kit(tmp_path, fake, accounting=accounting) as kit:
        skey = await kit.conversation()
        _, first, _ = await run_turn(kit, skey)
        assert first["status"] == "complete"
        clock.now += timedelta(hours=3)
        _, second, events = await run_turn(kit, skey)
    assert fake.request_count == 1  # the second turn reached no model
    assert second["status"] == "error"
    assert second["error"].startswith("quota exceeded:")
    assert "tokensPerDay" in second["error"]
    assert "resets at 2026-12-02T00:00:00Z" in second["error"]
    assert named(events, "step") == []
    assert named(events, "status")[0]["status"] == "error"


async def test_the_daily_quota_resets_at_the_utc_day_boundary(tmp_path, fake):
    clock = Clock(datetime(2026, 12, 1, 23, 59, 0, tzinfo=UTC))
    accounting = Accounting(quotas=lambda did: Quota(tokens_per_day=100), clock=clock)
    fake.default = Reply.text(["x"]).with_usage(90, 20)
    async with turn_kit(tmp_path, fake, accounting=accounting) as kit:
        skey = await kit.conversation()
        _, first, _ = await run_turn(kit, skey)
        clock.now = datetime(2026, 12, 1, 23, 59, 59, tzinfo=UTC)
        _, refused, _ = await run_turn(kit, skey)
        clock.now = datetime(2026, 12, 2, 0, 0, 1, tzinfo=UTC)
        _, after, _ = await run_turn(kit, skey)
    assert first["status"] == "complete" and after["status"] == "complete"
    assert refused["status"] == "error" and "resets at 2026-12-02T00:00:00Z" in refused["error"]
    assert fake.request_count == 2


async def test_the_monthly_cost_quota_names_itself_and_its_reset(tmp_path, fake):
    clock = Clock(datetime(2026, 12, 31, 22, 0, tzinfo=UTC))
    accounting = Accounting(
        quotas=lambda did: Quota(tokens_per_day=10**9, cost_per_month=0.01), clock=clock
    )
    fake.default = Reply.text(["x"]).with_usage(10, 10, cost=0.02)
    async with turn_kit(tmp_path, fake, accounting=accounting) as kit:
        skey = await kit.conversation()
        await run_turn(kit, skey)
        _, refused, _ = await run_turn(kit, skey)
        clock.now = datetime(2027, 1, 1, 0, 0, 5, tzinfo=UTC)
        _, january, _ = await run_turn(kit, skey)
    assert refused["error"].startswith("quota exceeded: costPerMonth")
    assert "resets at 2027-01-01T00:00:00Z" in refused["error"]
    assert "tokensPerDay" not in refused["error"]
    assert january["status"] == "complete" and fake.request_count == 2


async def test_title_and_summary_calls_are_usage_rows_like_any_step(tmp_path, fake):
    def answer(body: Any) -> Reply | None:
        if isinstance(body, dict) and not body.get("stream"):
            system = body["messages"][0]["content"]
            if "title" in system.lower():
                return Reply.text("A title").with_usage(40, 3)
            return Reply.text("SUMMARY").with_usage(900, 20)
        return Reply.text(["answer"]).with_usage(500, 7)

    fake.responder = answer
    settings = TurnSettings(retries=0, summarize=True)
    prices = {"fake:fake-model": Price(input=1.0, output=1.0)}
    async with turn_kit(
        tmp_path, fake, settings=settings, model_context={"fake-model": 4000}, titles=True,
        accounting=Accounting(prices=prices),
    ) as kit:
        skey, last = await long_conversation(kit, 100)
        posted = await kit.engine.post_message(
            DID, skey, parent=last, parts=[text_part("q")], generation={}
        )
        assert (await kit.reply(skey, posted.reply_key))["status"] == "complete"
        untitled = await kit.conversation()  # a title is asked for an untitled conversation
        posted = await kit.engine.post_message(
            DID, untitled, parent=None, parts=[text_part("q")], generation={}
        )
        assert (await kit.reply(untitled, posted.reply_key))["status"] == "complete"
        with anyio.fail_after(10):  # the title is asked for after the reply's status
            while not any(r.kind == "title" for r in await kit.state.usage_rows(DID)):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        rows = await kit.state.usage_rows(DID)
        usage = await usage_report(kit.state, DID, date(2000, 1, 1), date(2100, 1, 1), "total")
    kinds = {r.kind: (r.input_tokens, r.output_tokens, r.cost) for r in rows}
    assert kinds["summary"][:2] == (900, 20) and kinds["title"][:2] == (40, 3)
    assert [r[:2] for k, r in kinds.items() if k == "turn"] == [(500, 7)]
    assert kinds["title"][2] == pytest.approx(43 / 1e6)
    [total] = usage["rows"]
    assert total["turns"] == 2 and total["steps"] == 4  # two steps, the summary, the title
    assert total["inputTokens"] == 500 * 2 + 900 + 40
    assert total["cost"] == pytest.approx((507 * 2 + 920 + 43) / 1e6)
