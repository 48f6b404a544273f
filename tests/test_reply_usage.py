"""``GET /api/conversations/{skey}/usage``: each reply's usage, cost and latency (SPEC §17).

The page shows usage, cost and latency under every reply, also under the replies it
loads from history, whose records hold tokens only. The real ``turnd`` service in front
of the fake model server; the route's numbers must equal what the model reported and
what the reply's own final ``status`` event said.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE, BOB_TOKEN
from tests.support.daemon import Daemon, running_daemon
from tests.support.sse import read_events

pytestmark = pytest.mark.anyio

PRICES = {"fake-model": {"inputPrice": 2.0, "outputPrice": 10.0, "cachedInputPrice": 1.0}}


def tables(fake: FakeModel, **turns: object) -> dict[str, object]:
    return {
        "providers": {
            "fake": {"base_url": fake.base_url, "api_key_env": "T_FAKE_KEY", "model": PRICES},
            "unpriced": {"base_url": fake.base_url, "api_key_env": "T_FAKE_KEY"},
        },
        "models": {"default": "fake:fake-model", "fallbacks": {"unpriced:down": ["fake:fake-model"]}},
        "turns": {"retries": 0, "titleModel": "", **turns},
    }


async def answered(dm: Daemon, skey: str, text: str, **body: object) -> tuple[str, dict]:
    """Post a message and read its reply's stream to the end (its usage is stored by then)."""
    posted = await dm.post(skey, text, **{"generation": {}, **body})
    key = posted["replyKey"]
    assert posted["turn"] == "claimed", posted
    async with dm.http.stream("GET", f"/api/conversations/{skey}/messages/{key}/stream") as r:
        if r.status_code != 200:
            raise AssertionError(f"{r.status_code} {(await r.aread()).decode()}")
        events = await read_events(r)
    assert events[-1]["event"] == "status"
    return key, events[-1]["data"]


async def test_each_reply_has_its_usage_cost_and_the_latency_its_status_said(
    tmp_path: Path,
) -> None:
    with FakeModel() as fake:
        fake.push(
            Reply.text(["one"]).with_usage(100, 20, cached_tokens=40),
            Reply.text(["two"]).with_usage(300, 50),
            Reply.error(500, "down"),  # unpriced:down fails before its first token ...
            Reply.text(["three"]).with_usage(7, 3),  # ... and fake:fake-model answers
            Reply.text(["elsewhere"]).with_usage(11, 1),
        )
        async with running_daemon(tmp_path, fake, **tables(fake)) as dm:
            skey = await dm.conversation()
            finals: dict[str, dict] = {}
            parent = None
            for text, generation in (
                ("first", {}),
                ("second", {}),
                ("third", {"model": {"provider": "unpriced", "id": "down"}}),
            ):
                body = {"generation": generation, **({"parent": parent} if parent else {})}
                key, final = await answered(dm, skey, text, **body)
                finals[key] = final
                parent = key
            await answered(dm, await dm.conversation(), "another conversation")

            r = await dm.http.get(f"/api/conversations/{skey}/usage")
            assert r.status_code == 200, r.text
            replies = r.json()["replies"]
            assert set(replies) == set(finals)  # this conversation's replies, no other's
            first, second, third = (replies[k] for k in finals)
            assert {k: first[k] for k in ("steps", "inputTokens", "outputTokens", "cachedTokens")} == {
                "steps": 1, "inputTokens": 100, "outputTokens": 20, "cachedTokens": 40,
            }
            assert first["cost"] == pytest.approx(((100 - 40) * 2 + 40 * 1 + 20 * 10) / 1e6)
            assert (second["inputTokens"], second["outputTokens"]) == (300, 50)
            assert second["cost"] == pytest.approx((300 * 2 + 50 * 10) / 1e6)
            # The fallback: one step tried on two models (the failed call counts no tokens),
            # the priced one's cost.
            assert third["steps"] == 1 and (third["inputTokens"], third["outputTokens"]) == (7, 3)
            assert third["cost"] == pytest.approx((7 * 2 + 3 * 10) / 1e6)
            # Latency and first-token time: exactly what each reply's final status event said.
            for key, final in finals.items():
                assert replies[key]["latencyMs"] == final["latencyMs"]
                assert replies[key]["ttftMs"] == final["ttftMs"]
                assert replies[key]["cost"] == pytest.approx(final["cost"])
                assert replies[key]["outputTokens"] == final["usage"]["outputTokens"]
                assert 0 < replies[key]["durationMs"] <= final["latencyMs"]

            # Scoped like every conversation route: another account, a missing conversation,
            # no token, a malformed key.
            async with dm.client(BOB_TOKEN) as bob:
                refused = await bob.get(f"/api/conversations/{skey}/usage")
                assert refused.status_code == 404 and refused.json()["error"]
            missing = await dm.http.get("/api/conversations/3zzzzzzzzzzzz/usage")
            assert missing.status_code == 404
            async with dm.client(None) as anonymous:
                assert (await anonymous.get(f"/api/conversations/{skey}/usage")).status_code == 401
            bad = await dm.http.get("/api/conversations/not%20a%20key/usage")
            assert 400 <= bad.status_code < 500 and bad.json()["error"]
            # A conversation with no reply yet has none.
            empty = await dm.conversation()
            assert (await dm.http.get(f"/api/conversations/{empty}/usage")).json() == {"replies": {}}


async def test_a_reply_refused_by_its_quota_has_a_latency_and_no_steps(tmp_path: Path) -> None:
    with FakeModel() as fake:
        fake.push(Reply.text(["spent"]).with_usage(50, 60))
        async with running_daemon(
            tmp_path,
            fake,
            **tables(fake),
            accounts={
                "alice": {
                    "handle": "alice.test", "did": ALICE,
                    "password_env": "T_ALICE_PASSWORD", "token_env": "T_ALICE_TOKEN",
                    "quota": {"tokensPerDay": 100},
                },
            },
        ) as dm:
            skey = await dm.conversation()
            spent, _ = await answered(dm, skey, "spend it")
            refused, status = await answered(dm, skey, "one more", parent=spent)
            assert status["status"] == "error" and "quota exceeded" in status["error"]
            replies = (await dm.http.get(f"/api/conversations/{skey}/usage")).json()["replies"]
            assert replies[spent]["steps"] == 1 and replies[spent]["outputTokens"] == 60
            assert replies[refused]["steps"] == 0 and replies[refused]["inputTokens"] == 0
            assert "cost" not in replies[refused] and replies[refused]["latencyMs"] > 0
