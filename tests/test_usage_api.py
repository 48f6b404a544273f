"""SPEC §16 through the daemon: GET /api/usage, /metrics, quotas, config, `turnd usage`.

The real ``turnd`` service (uvicorn, local store, state file) in front of the fake
model server, whose reported tokens are what the sums must equal.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from daemon.config_file import ConfigError
from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE, BOB
from tests.support.daemon import _ENV, daemon_config, running_daemon
from tests.support.sse import read_events

pytestmark = pytest.mark.anyio

TURND = str(Path(sys.executable).parent / "turnd")
PRICES = {"fake-model": {"inputPrice": 2.0, "outputPrice": 10.0, "cachedInputPrice": 1.0}}


def tables(fake: FakeModel, quota: dict[str, Any] | None = None) -> dict[str, Any]:
    alice: dict[str, Any] = {
        "handle": "alice.test", "did": ALICE, "password_env": "T_ALICE_PASSWORD",
        "token_env": "T_ALICE_TOKEN",
    }
    if quota is not None:
        alice["quota"] = quota
    return {
        "providers": {
            "fake": {"base_url": fake.base_url, "api_key_env": "T_FAKE_KEY", "model": PRICES},
            "other": {"base_url": fake.base_url, "api_key_env": "T_FAKE_KEY"},
        },
        "accounts": {
            "alice": alice,
            "bob": {"handle": "bob.test", "did": BOB, "password_env": "T_BOB_PASSWORD",
                    "token_env": "T_BOB_TOKEN"},
        },
    }


async def answered(dm: Any, skey: str, text: str, **generation: Any) -> tuple[dict, dict]:
    posted = await dm.post(skey, text, generation=generation)
    assert posted["turn"] == "claimed"
    url = f"/api/conversations/{skey}/messages/{posted['replyKey']}/stream"
    async with dm.http.stream("GET", url) as r:
        events = await read_events(r)
    return await dm.final(skey, posted["replyKey"]), events[-1]["data"]


async def test_usage_sums_equal_the_tokens_the_model_reported(tmp_path: Path) -> None:
    with FakeModel() as fake:
        fake.push(
            Reply.text(["one"]).with_usage(100, 20, cached_tokens=40),
            Reply.text(["two"]).with_usage(300, 50),
            Reply.text(["three"]).with_usage(7, 3),
        )
        async with running_daemon(tmp_path, fake, **tables(fake)) as dm:
            a = await dm.conversation()
            b = await dm.conversation()
            await answered(dm, a, "first")
            await answered(dm, a, "second")
            _, status = await answered(dm, b, "third", model={"provider": "other", "id": "x"})
            assert "cost" not in status  # no price for other:x

            r = await dm.http.get("/api/usage")
            assert r.status_code == 200, r.text
            body = r.json()
            today = datetime.now(UTC).date()
            assert body["from"] == today.replace(day=1).isoformat()
            assert body["to"] >= today.isoformat() and body["group"] == "day"
            assert "quota" not in body
            [day] = body["rows"]
            cost = ((100 - 40) * 2 + 40 * 1 + 20 * 10 + 300 * 2 + 50 * 10) / 1e6
            assert day == {
                "key": today.isoformat(), "turns": 3, "steps": 3, "inputTokens": 407,
                "outputTokens": 73, "reasoningTokens": 0, "cachedTokens": 40,
                "cost": pytest.approx(cost),
            }

            by_model = (await dm.http.get("/api/usage?group=model")).json()["rows"]
            assert {r["key"]: (r["turns"], r["inputTokens"]) for r in by_model} == {
                "fake:fake-model": (2, 400), "other:x": (1, 7)
            }
            by_conv = (await dm.http.get(
                f"/api/usage?group=conversation&from={today}&to={today}"
            )).json()["rows"]
            assert {r["key"]: r["outputTokens"] for r in by_conv} == {a: 70, b: 3}

            # Another account's usage is its own.
            async with dm.client("bob-api-token-0123456789") as bob:
                assert (await bob.get("/api/usage")).json()["rows"] == []

            past = (await dm.http.get("/api/usage?from=2020-01-01&to=2020-01-31")).json()
            assert past["rows"] == [] and past["from"] == "2020-01-01"
            ends = (await dm.http.get("/api/usage?from=0001-01-01&to=9999-12-31")).json()
            assert [r["inputTokens"] for r in ends["rows"]] == [407]  # all of time, no overflow

            metrics = (await dm.http.get("/metrics")).text
            assert 'turnd_tokens_total{kind="input",model="fake:fake-model"} 400.0' in metrics
            assert 'turnd_tokens_total{kind="output",model="other:x"} 3.0' in metrics
            assert 'turnd_tokens_total{kind="cached",model="fake:fake-model"} 40.0' in metrics
            line = next(
                x for x in metrics.splitlines()
                if x.startswith('turnd_cost_usd_total{model="fake:fake-model"}')
            )
            assert float(line.split()[-1]) == pytest.approx(cost)


@pytest.mark.parametrize(
    "query",
    ["from=2026-13-01", "to=yesterday", "from=2026-1-1", "from=2026-12-10&to=2026-12-01",
     "group=week"],
)
async def test_a_bad_usage_query_is_422_naming_it(tmp_path: Path, query: str) -> None:
    with FakeModel() as fake:
        async with running_daemon(tmp_path, fake) as dm:
            r = await dm.http.get(f"/api/usage?{query}")
            assert r.status_code == 422, r.text
            body = r.json()
            assert body["error"] == "InvalidRequest"
            assert query.split("=")[0] in body["message"]
            assert (await dm.client(None).get("/api/usage")).status_code == 401


async def test_past_the_quota_a_post_is_claimed_and_the_reply_says_which_and_when(
    tmp_path: Path,
) -> None:
    with FakeModel() as fake:
        fake.default = Reply.text(["x"]).with_usage(60, 50)
        quota = {"tokensPerDay": 100, "costPerMonth": 5}
        async with running_daemon(tmp_path, fake, **tables(fake, quota)) as dm:
            skey = await dm.conversation()
            first, _ = await answered(dm, skey, "spend")
            assert first["status"] == "complete"
            body = (await dm.http.get("/api/usage")).json()
            tomorrow = datetime.now(UTC).date().toordinal() + 1
            resets = datetime.fromordinal(tomorrow).strftime("%Y-%m-%dT00:00:00Z")
            assert body["quota"]["tokensPerDay"] == {"used": 110, "limit": 100, "resetsAt": resets}
            assert body["quota"]["costPerMonth"]["limit"] == 5
            assert body["quota"]["costPerMonth"]["used"] == pytest.approx((60 * 2 + 50 * 10) / 1e6)

            refused, status = await answered(dm, skey, "more")  # answered() checks "claimed"
            assert refused["status"] == "error" and status["status"] == "error"
            assert refused["error"].startswith("quota exceeded: tokensPerDay")
            assert f"resets at {resets}" in refused["error"]
            assert fake.request_count == 1

            # bob has no quota
            async with dm.client("bob-api-token-0123456789") as bob:
                assert "quota" not in (await bob.get("/api/usage")).json()


@pytest.mark.parametrize(
    ("where", "value", "key"),
    [
        ("price", -1, 'providers.fake.model."fake-model".inputPrice'),
        ("price", "cheap", 'providers.fake.model."fake-model".inputPrice'),
        ("price", True, 'providers.fake.model."fake-model".inputPrice'),
        ("quota", -5, "accounts.alice.quota.tokensPerDay"),
        ("quota", "lots", "accounts.alice.quota.tokensPerDay"),
        ("quota", float("nan"), "accounts.alice.quota.tokensPerDay"),
    ],
)
def test_a_negative_or_non_number_price_or_quota_is_a_config_error_naming_it(
    tmp_path: Path, where: str, value: Any, key: str
) -> None:
    with FakeModel() as fake:
        t = tables(fake, {"tokensPerDay": value} if where == "quota" else None)
        if where == "price":
            t["providers"]["fake"]["model"] = {"fake-model": {"inputPrice": value}}
        with pytest.raises(ConfigError) as err:
            daemon_config(tmp_path, fake, **t)
        assert str(err.value).startswith(key)


def test_fallbacks_must_name_known_providers(tmp_path: Path) -> None:
    with FakeModel() as fake:
        with pytest.raises(ConfigError, match="models.fallbacks.*unknown provider 'nope'"):
            daemon_config(
                tmp_path, fake,
                models={"default": "fake:fake-model",
                        "fallbacks": {"fake:fake-model": ["nope:x"]}},
            )


async def test_turnd_usage_prints_today_and_this_month(tmp_path: Path) -> None:
    with FakeModel() as fake:
        fake.default = Reply.text(["x"]).with_usage(1234, 56)
        async with running_daemon(tmp_path, fake, **tables(fake, {"tokensPerDay": 100000})) as dm:
            skey = await dm.conversation()
            await answered(dm, skey, "a")
            await answered(dm, skey, "b")
        config = tmp_path / "turnd.toml"
        config.write_text(
            f'[store]\npath = "{tmp_path / "data"}"\n'
            f'[providers.fake]\nbase_url = "{fake.base_url}"\napi_key_env = "T_FAKE_KEY"\n'
            '[providers.fake.model."fake-model"]\ninputPrice = 2.0\noutputPrice = 10.0\n'
            '[models]\ndefault = "fake:fake-model"\n'
            f'[accounts.alice]\nhandle = "alice.test"\ndid = "{ALICE}"\n'
            'password_env = "T_ALICE_PASSWORD"\n'
            'token_env = "T_ALICE_TOKEN"\nquota = { tokensPerDay = 100000 }\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURND_")} | _ENV
        out = await anyio.run_process(
            [TURND, "usage", "--config", str(config)], env=env, check=False
        )
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("usage of alice (alice.test)")
    assert lines[1].split() == ["period", "turns", "steps", "input", "output", "reasoning",
                                "cached", "cost", "USD"]
    cost = f"{(2 * 1234 * 2 + 2 * 56 * 10) / 1e6:.4f}"
    for line in lines[2:4]:
        assert line.split()[2:] == ["2", "2", "2468", "112", "0", "0", cost]
    assert lines[2].startswith("today ") and lines[3].startswith("month ")
    assert lines[4].startswith("quota tokensPerDay: 2580 of 100000 tokens, resets at ")
