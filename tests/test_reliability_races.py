"""Races: three ``turnd serve`` processes on one local store, each with its own state
file and port, one fake model server in its own process.

500 user messages are written three ways at once — posted through a daemon's HTTP
route, written through a daemon's XRPC ``createRecord``, and written straight into the
store by this process — so each daemon's change feed and the posting route race for
every reply key. Exactly one generation per (message, attempt) is counted at the fake
model (one request per unique prompt text), in the reply records, and in the daemons'
one-line-per-turn logs. Then the same with regenerations: every daemon's regenerate
route and a direct put raising ``generation.attempt`` race on the same messages.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from recordstore import InvalidSwap
from recordstore.keys import new_tid, parse_reply_key
from recordstore.local import LocalStore
from tests.support.accounts import ALICE, ALICE_PASSWORD
from tests.support.records import MESSAGE, TEXT, user_message
from tests.support.reliability import FakeProc, Turnd

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]

MESSAGES = 500
CONVERSATIONS = 25
REGENERATED = 150  # messages whose attempt is raised, twice, by racing writers


async def _session(http: httpx.AsyncClient) -> str:
    r = await http.post(
        "/xrpc/com.atproto.server.createSession",
        json={"identifier": "alice.test", "password": ALICE_PASSWORD},
    )
    assert r.status_code == 200, r.text
    return r.json()["accessJwt"]


async def _replies(store: LocalStore, skeys: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Every message record of the conversations, by (skey, key)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for skey in skeys:
        cursor = None
        while True:
            page, cursor = await store.list_records(ALICE, skey, MESSAGE, cursor=cursor, limit=100)
            for rec in page:
                out[(skey, rec.key)] = rec.value
            if cursor is None:
                break
    return out


async def _wait_answered(
    store: LocalStore, skeys: list[str], wanted: set[tuple[str, str]], seconds: float
) -> dict[tuple[str, str], dict[str, Any]]:
    """Wait until every (skey, reply key) in ``wanted`` has a finished reply."""
    with anyio.fail_after(seconds):
        while True:
            records = await _replies(store, skeys)
            missing = [
                w for w in wanted
                if records.get(w, {}).get("status") in (None, "pending")
            ]
            if not missing:
                return records
            await anyio.sleep(0.5)


async def _turn_lines(daemons: list[Turnd], at_least: int) -> list[dict[str, Any]]:
    """The daemons' finished-turn log lines, once ``at_least`` are written (or 10 s passed):
    a runner writes its line just after the final record the store already shows."""
    with anyio.move_on_after(10):
        while True:
            if sum(len(d.turn_lines()) for d in daemons) >= at_least:
                break
            await anyio.sleep(0.1)
    return [line for d in daemons for line in d.turn_lines()]


async def _check_once(
    fake: FakeProc, daemons: list[Turnd], records: dict[tuple[str, str], dict[str, Any]],
    texts: dict[tuple[str, str], str],
) -> dict[str, Any]:
    """Generations counted three ways must agree: one per generated reply key."""
    generated: Counter[tuple[str, str]] = Counter()  # (skey, user key) -> complete replies
    for (skey, key), value in records.items():
        parsed = parse_reply_key(key)
        if parsed is not None and value.get("role") == "assistant":
            assert value.get("status") == "complete", (key, value)
            generated[(skey, parsed[0])] += 1
    lines = await _turn_lines(daemons, sum(generated.values()))
    prompts = fake.prompts()
    per_prompt_dupes = {
        texts[m]: (prompts[texts[m]], generated[m])
        for m in texts
        if prompts[texts[m]] != generated[m]
    }
    logged = Counter((line["conversation"], line["key"]) for line in lines)
    log_dupes = {k: n for k, n in logged.items() if n != 1}
    winners = {d.name: len(d.turn_lines()) for d in daemons}
    assert not per_prompt_dupes, f"model requests != replies: {list(per_prompt_dupes.items())[:10]}"
    assert not log_dupes, f"reply keys generated more than once: {log_dupes}"
    assert sum(generated.values()) == sum(logged.values()) == sum(prompts.values())
    return {"generations": sum(generated.values()), "by_daemon": winners}


@pytest.mark.parametrize("cluster", [False, True], ids=["alone", "cluster"])
async def test_one_generation_per_message_and_attempt(
    tmp_path: Path, cluster: bool, request: pytest.FixtureRequest
) -> None:
    """Also with [cluster] on (SPEC §18): Redis shares streams and limits, never the claim."""
    data = tmp_path / "data"
    fake = FakeProc(tmp_path, tokens=5)
    shared: dict[str, Any] = {}
    if cluster:
        redis = request.getfixturevalue("redis_server")
        shared = {
            "extra": '\n[cluster]\nredis_url_env = "T_REDIS_URL"\n',
            "env": {"T_REDIS_URL": redis.url},
        }
    daemons = [Turnd(tmp_path, f"d{i}", data, fake.base_url, **shared) for i in range(3)]
    try:
        for d in daemons:
            await anyio.to_thread.run_sync(d.start)
        async with LocalStore.open(data, poll_interval=0.05) as store:
            clients = [d.aclient(limits=httpx.Limits(max_connections=50, keepalive_expiry=2.0)) for d in daemons]
            try:
                await _race(store, daemons, clients, fake)
            finally:
                for c in clients:
                    await c.aclose()
        for d in daemons:
            assert await anyio.to_thread.run_sync(d.stop) == 0, d.logs()[-3000:]
        for d in daemons:
            assert " ERROR " not in d.logs() and '"level": "ERROR"' not in d.logs(), d.logs()
    finally:
        for d in daemons:
            d.kill()
        fake.stop()


async def _race(
    store: LocalStore, daemons: list[Turnd], clients: list[httpx.AsyncClient], fake: FakeProc
) -> None:
    skeys = []
    for i in range(CONVERSATIONS):
        r = await clients[i % 3].post("/api/conversations", json={"title": f"race {i}"})
        assert r.status_code == 201, r.text
        skeys.append(r.json()["skey"])
    jwts = [await _session(c) for c in clients]
    texts: dict[tuple[str, str], str] = {}  # (skey, user key) -> its unique prompt
    how: Counter[str] = Counter()
    limit = anyio.Semaphore(24)

    async def write(i: int) -> None:
        skey = skeys[i % CONVERSATIONS]
        text = f"race-{i}"
        client = clients[(i // 3) % 3]
        async with limit:
            if i % 3 == 0:  # the HTTP route of one of the daemons
                r = await client.post(
                    f"/api/conversations/{skey}/messages",
                    json={"parts": [{"$type": TEXT, "text": text}], "generation": {}},
                )
                assert r.status_code == 201, r.text
                assert r.json()["turn"] in ("claimed", "answered"), r.text
                key = r.json()["userKey"]
                how["http"] += 1
            elif i % 3 == 1:  # a direct write through a daemon's XRPC
                key = new_tid()
                r = await client.post(
                    "/xrpc/com.atproto.repo.createRecord",
                    headers={"Authorization": f"Bearer {jwts[(i // 3) % 3]}"},
                    json={
                        "repo": ALICE,
                        "collection": MESSAGE,
                        "rkey": f"{skey}:{key}",
                        "record": user_message(text),
                    },
                )
                assert r.status_code == 200, r.text
                how["xrpc"] += 1
            else:  # straight into the store files, as another process
                key = new_tid()
                await store.create_record(ALICE, skey, MESSAGE, key, user_message(text))
                how["store"] += 1
            texts[(skey, key)] = text

    order = list(range(MESSAGES))
    random.Random(7).shuffle(order)
    async with anyio.create_task_group() as tg:
        for i in order:
            tg.start_soon(write, i)
    assert sum(how.values()) == MESSAGES
    wanted = {(s, f"{k}.r0") for (s, k) in texts}
    records = await _wait_answered(store, skeys, wanted, seconds=240)
    first = await _check_once(fake, daemons, records, texts)
    assert first["generations"] == MESSAGES
    print(f"\nraces: {MESSAGES} messages ({dict(how)}), 0 duplicates, won by {first['by_daemon']}")

    # Regenerations racing: each daemon's route and a direct put raise the attempt.
    chosen = random.Random(11).sample(sorted(texts), REGENERATED)
    outcomes: Counter[str] = Counter()

    async def regenerate(client: httpx.AsyncClient, skey: str, key: str) -> None:
        async with limit:
            r = await client.post(f"/api/conversations/{skey}/messages/{key}/regenerate", json={})
        assert r.status_code in (200, 409), r.text  # 409: another writer moved it first
        outcomes[f"route {r.status_code}"] += 1

    async def direct_put(skey: str, key: str) -> None:
        async with limit:
            rec = await store.get_record(ALICE, skey, MESSAGE, key)
            assert rec is not None
            attempt = rec.value["generation"].get("attempt", 0) + 1
            value = {**rec.value, "generation": {**rec.value["generation"], "attempt": attempt}}
            try:
                await store.put_record(ALICE, skey, MESSAGE, key, value, swap_cid=rec.cid)
                outcomes["put ok"] += 1
            except InvalidSwap:
                outcomes["put lost"] += 1

    for _round in range(2):
        async with anyio.create_task_group() as tg:
            for skey, key in chosen:
                for client in clients:
                    tg.start_soon(regenerate, client, skey, key)
                tg.start_soon(direct_put, skey, key)
        # Every message's latest attempt gets its reply before the next round.
        latest = {}
        for skey, key in chosen:
            rec = await store.get_record(ALICE, skey, MESSAGE, key)
            assert rec is not None
            latest[(skey, key)] = rec.value["generation"]["attempt"]
        wanted = {(s, f"{k}.r{a}") for (s, k), a in latest.items()}
        records = await _wait_answered(store, skeys, wanted, seconds=240)
    # Settle: a daemon may still be starting a superseded attempt it saw in the feed.
    await anyio.sleep(3)
    records = await _wait_answered(store, skeys, set(), seconds=60)
    pending = [k for k, v in records.items() if v.get("status") == "pending"]
    assert not pending, pending
    second = await _check_once(fake, daemons, records, texts)
    regenerated = second["generations"] - first["generations"]
    assert regenerated >= 2 * REGENERATED
    print(
        f"regeneration races: {REGENERATED} messages x 2 rounds x 4 writers "
        f"({dict(outcomes)}), {regenerated} attempts generated, 0 duplicates; "
        f"total races {second['generations']}, won by {second['by_daemon']}"
    )
