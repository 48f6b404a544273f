"""End to end on both backends: real ``turnd serve`` processes, direct writes with the
stock ``atproto`` SDK, and a fake model server, on a local store and on an account of the
reference PDS (``testbed/pds.py``, fixtures in ``tests/support/fixtures.py``).

Each test is parametrized over the backend (the ``pds`` cases carry the ``pds`` marker):

- ``local``: the daemon's own SQLite store; direct clients write through the daemon's
  XRPC (``http://127.0.0.1:<port>``), which the stock SDK talks to unchanged;
- ``pds``: ``[store] kind = "pds"`` on a fresh PDS account (app password); direct clients
  write into that account's repo on the PDS, and turnd sees them on the firehose.

Records are read back the same way on both (``com.atproto.repo.getRecord`` /
``listRecords`` over HTTP), in the classic-repo layout ``<skey>:<key>``.

CIDs: ``test_vector_cids_through_a_running_daemon`` writes the records of
``tests/vectors/cids.json`` into both backends with the SDK and gets the reference PDS's
CIDs back (``tests/test_cid.py`` checks turnd's encoder against them, and
``tests/test_pds_fixture.py`` that the reference PDS still returns them); every other
record these tests write or read — the SDK's and turnd's — is checked to have the CID
turnd computes for its value, on both backends.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from atproto import Client

from recordstore.cid import record_cid
from recordstore.keys import new_tid, parse_reply_key
from recordstore.lexicon import validate_record
from recordstore.local import DB_NAME
from testbed.fakemodel import FakeModel, Reply
from testbed.pds import PdsServer
from tests.support.accounts import ALICE, ALICE_PASSWORD, ALICE_TOKEN
from tests.support.records import INFO, MESSAGE, TEXT, now_iso, reply_text, user_message
from tests.support.reliability import FakeProc, Turnd, wait_until, write_config
from turns.tls import tls_context

PLAIN = "network.sharedcomputer.chat.defs#plainContent"
APP_PASSWORD_ENV = "T_PDS_APP_PASSWORD"
RACE_MESSAGES = 100
RACE_CONVERSATIONS = 5


@dataclass
class PdsTurnd(Turnd):
    """``turnd serve`` on a PDS account (alice's token; the app password in the env)."""

    service: str = ""
    handle: str = ""
    did: str = ""

    def write_config(self) -> None:
        write_config(
            self.config, data=self.data, state=self.state, port=self.port,
            model_url=self.model_url, turns=self.turns, extra=self.extra,
            store=f'kind = "pds"\nservice = "{self.service}"',
            accounts=f"""
[accounts.alice]
handle = "{self.handle}"
did = "{self.did}"
password_env = "{APP_PASSWORD_ENV}"
token_env = "T_ALICE_TOKEN"
""",
        )


@dataclass
class Backend:
    """One backend's daemons, its direct-write client and its records, seen alike."""

    kind: str  # "local" or "pds"
    work: Path
    did: str
    pds: PdsServer | None = None
    handle: str = "alice.test"
    password: str = ALICE_PASSWORD  # what the direct client logs in with

    @property
    def data(self) -> Path:
        return self.work / "data"

    def daemon(self, name: str, model_url: str, **turns: Any) -> Turnd:
        if self.pds is None:
            return Turnd(self.work, name, self.data, model_url, turns=turns)
        return PdsTurnd(
            self.work, name, self.data, model_url, turns=turns,
            service=self.pds.url, handle=self.handle, did=self.did,
        )

    def service_url(self, daemon: Turnd) -> str:
        """Where direct clients write and read: the PDS, or the daemon's own XRPC."""
        return self.pds.url if self.pds is not None else daemon.url

    def client(self, daemon: Turnd) -> Client:
        """The stock SDK, logged in as the account (the main password, not turnd's)."""
        client = Client(self.service_url(daemon))
        client.login(self.handle, self.password, fetch_bsky_profile=False)
        return client

    @property
    def read_headers(self) -> dict[str, str]:
        # The local store's reads are private (SPEC §12): the /api token opens them.
        return {"Authorization": f"Bearer {ALICE_TOKEN}"} if self.pds is None else {}

    def get(self, daemon: Turnd, skey: str, key: str) -> tuple[str, dict[str, Any]] | None:
        r = httpx.get(
            f"{self.service_url(daemon)}/xrpc/com.atproto.repo.getRecord",
            params={"repo": self.did, "collection": MESSAGE, "rkey": f"{skey}:{key}"},
            headers=self.read_headers,
            timeout=30, verify=tls_context(),
        )
        if r.status_code == 400 and r.json().get("error") == "RecordNotFound":
            return None
        assert r.status_code == 200, r.text
        return r.json()["cid"], r.json()["value"]

    def conversation(self, daemon: Turnd, skey: str) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every message of a conversation by key: ``(cid, value)``."""
        out: dict[str, tuple[str, dict[str, Any]]] = {}
        cursor = f"{skey}:"
        while True:
            r = httpx.get(
                f"{self.service_url(daemon)}/xrpc/com.atproto.repo.listRecords",
                params={"repo": self.did, "collection": MESSAGE, "reverse": "true",
                        "cursor": cursor, "limit": 100},
                headers=self.read_headers,
                timeout=30, verify=tls_context(),
            )
            assert r.status_code == 200, r.text
            page = r.json()["records"]
            for item in page:
                rkey = item["uri"].rsplit("/", 1)[1]
                if not rkey.startswith(f"{skey}:"):
                    return out
                out[rkey.split(":", 1)[1]] = (item["cid"], item["value"])
            if len(page) < 100 or not r.json().get("cursor"):
                return out
            cursor = r.json()["cursor"]

    def final(self, daemon: Turnd, skey: str, key: str, timeout: float = 60) -> dict[str, Any]:
        """The reply once it is no longer pending (its CID checked against its value)."""

        def done() -> dict[str, Any] | None:
            got = self.get(daemon, skey, key)
            if got is None or got[1].get("status") in (None, "pending"):
                return None
            # Loose on purpose: on the local backend the store computed that CID with record_cid, so
            # this only holds the pds backend (the PDS's own CID) to account; the fixed vectors in
            # tests/test_cid.py are what anchor record_cid itself.
            assert got[0] == record_cid(got[1]), (key, got)
            return got[1]

        return wait_until(done, timeout, f"the reply {key}", interval=0.2)


@pytest.fixture(params=["local", pytest.param("pds", marks=pytest.mark.pds)])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Backend:
    if request.param == "local":
        return Backend("local", tmp_path, ALICE)
    pds: PdsServer = request.getfixturevalue("pds")
    account = pds.create_account()
    monkeypatch.setenv(APP_PASSWORD_ENV, account.app_password)  # the daemons' env
    return Backend(
        "pds", tmp_path, account.did, pds=pds, handle=account.handle, password=account.password
    )


@pytest.fixture
def running(backend: Backend) -> Iterator[Callable[..., Turnd]]:
    """Start daemons; every one is killed at the end, whatever happened."""
    started: list[Turnd] = []

    def start(name: str, model_url: str, **turns: Any) -> Turnd:
        d = backend.daemon(name, model_url, **turns)
        started.append(d)
        return d.start(timeout=60)

    yield start
    for d in started:
        d.kill()


def _write(client: Client, did: str, skey: str, key: str, value: dict[str, Any]) -> str:
    """A direct createRecord with the stock SDK (``validate`` unset); returns the CID."""
    out = client.com.atproto.repo.create_record(
        {"repo": did, "collection": MESSAGE, "rkey": f"{skey}:{key}", "record": value}
    )
    assert out.uri == f"at://{did}/{MESSAGE}/{skey}:{key}"
    return out.cid


def _info(client: Client, did: str, skey: str, title: str) -> None:
    client.com.atproto.repo.create_record(
        {"repo": did, "collection": INFO, "rkey": f"{skey}:self",
         "record": {"$type": INFO, "title": title, "createdAt": now_iso()}}
    )


def _prompt(request: dict[str, Any]) -> str:
    content = request["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


# -- a direct write is answered in that repo; regenerate -------------------------------------


def test_direct_write_answered_then_regenerated(backend: Backend, running: Any) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        return Reply.text(["answer to ", _prompt(request)])

    with FakeModel(responder=respond) as fake:
        d = running("d", fake.base_url)
        client = backend.client(d)
        skey, key = new_tid(), new_tid()
        _info(client, backend.did, skey, "direct")
        value = user_message("hello direct")
        cid = _write(client, backend.did, skey, key, value)
        assert cid == record_cid(value)  # the SDK's CID is the one turnd computes

        r0 = backend.final(d, skey, f"{key}.r0")
        assert r0["status"] == "complete", r0
        assert reply_text(r0) == "answer to hello direct"
        assert r0["role"] == "assistant" and r0["parent"] == key  # a key within the space
        assert "claim" not in r0  # the placeholder's token is gone from the final record
        r0_cid = backend.get(d, skey, f"{key}.r0")[0]  # type: ignore[index]

        # Regenerate: a direct put raising generation.attempt, swapping on our CID.
        regen = {**value, "generation": {"attempt": 1}}
        client.com.atproto.repo.put_record(
            {"repo": backend.did, "collection": MESSAGE, "rkey": f"{skey}:{key}",
             "record": regen, "swapRecord": cid}
        )
        r1 = backend.final(d, skey, f"{key}.r1")
        assert r1["status"] == "complete" and r1["parent"] == key
        assert reply_text(r1) == "answer to hello direct"
        time.sleep(1)
        records = backend.conversation(d, skey)
        assert sorted(records) == sorted([key, f"{key}.r0", f"{key}.r1"])
        assert records[f"{key}.r0"][0] == r0_cid  # .r0 kept, unchanged
        assert records[key][0] == record_cid(regen)
        # Loose on purpose: on the local backend the store computed that CID with record_cid, so
        # this only holds the pds backend (the PDS's own CID) to account; the fixed vectors in
        # tests/test_cid.py are what anchor record_cid itself.
        for k, (c, v) in records.items():
            assert c == record_cid(v), k
        assert fake.request_count == 2  # one generation per attempt
        assert d.stop() == 0, d.logs()[-3000:]


# -- an invalid record gets an error reply ----------------------------------------------------


def test_invalid_record_gets_an_error_reply(backend: Backend, running: Any) -> None:
    with FakeModel(default=Reply.text(["never"])) as fake:
        d = running("d", fake.base_url)
        client = backend.client(d)
        skey, key = new_tid(), new_tid()
        bad = user_message("x")
        bad["content"] = {"$type": PLAIN, "parts": [{"$type": TEXT}]}  # a text part, no text
        with pytest.raises(Exception) as invalid:
            validate_record(MESSAGE, bad)
        expected = str(invalid.value)
        if backend.pds is not None:
            # The PDS takes it: the direct client writes with validate unset, as turnd does.
            _write(client, backend.did, skey, key, bad)
        else:
            # The local store's XRPC refuses it; only a write straight into its file gets
            # an invalid record into the local store.
            _info(client, backend.did, skey, "invalid")
            with pytest.raises(Exception, match="InvalidRecord|text"):
                _write(client, backend.did, skey, key, bad)
            with sqlite3.connect(backend.data / DB_NAME) as db:
                db.execute(
                    "INSERT INTO records (did, space, collection, key, cid, value)"
                    " VALUES (?,?,?,?,?,?)",
                    (backend.did, skey, MESSAGE, key, record_cid(bad), json.dumps(bad)),
                )
        reply = backend.final(d, skey, f"{key}.r0")
        assert reply["status"] == "error", reply
        assert expected in reply["error"], (expected, reply["error"])
        assert fake.request_count == 0  # no generation for it
        assert d.stop() == 0


# -- kill -9 mid-turn, restart ------------------------------------------------------------------


@pytest.mark.reliability
def test_kill_mid_turn_then_restart(backend: Backend, running: Any) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        if _prompt(request).startswith("stall"):
            return Reply.text(["Hel", "lo ", "never"]).stall(2)  # until the client goes
        return Reply.text(["fine"])

    with FakeModel(responder=respond) as fake:
        d = running("d", fake.base_url)
        client = backend.client(d)
        skey, key = new_tid(), new_tid()
        _info(client, backend.did, skey, "crash")
        _write(client, backend.did, skey, key, user_message("stall please"))
        fake.wait_for_requests(1, timeout=60)
        pending = backend.get(d, skey, f"{key}.r0")
        assert pending is not None and pending[1]["status"] == "pending", pending
        time.sleep(1.5)  # the feed cursor is flushed every second
        d.kill()
        if backend.pds is not None:  # nobody left to finish it
            time.sleep(1)
            still = backend.get(d, skey, f"{key}.r0")
            assert still is not None and still[1]["status"] == "pending"

        d.start(timeout=60)
        reply = backend.final(d, skey, f"{key}.r0")
        assert reply["status"] == "error" and reply["error"] == "interrupted", reply
        # A new message after the restart is answered; nothing stays pending.
        client = backend.client(d)
        after = new_tid()
        _write(client, backend.did, skey, after, user_message("after the crash", parent=key))
        assert backend.final(d, skey, f"{after}.r0")["status"] == "complete"
        time.sleep(1)
        records = backend.conversation(d, skey)
        assert not [k for k, (_, v) in records.items() if v.get("status") == "pending"]
        assert sorted(records) == sorted([key, f"{key}.r0", after, f"{after}.r0"])
        assert fake.request_count == 2  # the interrupted turn was not run again
        with sqlite3.connect(d.state) as db:
            assert db.execute("SELECT count(*) FROM turn_claim").fetchone()[0] == 0
        assert d.stop() == 0


# -- two daemons race on 100 messages -------------------------------------------------------------


@pytest.mark.reliability
def test_two_daemons_race_one_generation_each(backend: Backend, running: Any) -> None:
    fake = FakeProc(backend.work, tokens=5)
    try:
        daemons = [running(f"d{i}", fake.base_url) for i in range(2)]
        setup = backend.client(daemons[0])
        skeys = [new_tid() for _ in range(RACE_CONVERSATIONS)]
        for i, skey in enumerate(skeys):
            _info(setup, backend.did, skey, f"race {i}")
        texts: dict[tuple[str, str], str] = {}  # (skey, user key) -> its unique prompt
        how: Counter[str] = Counter()

        def writer(lane: int) -> None:
            client = backend.client(daemons[lane % 2])
            api = daemons[lane % 2].client()
            for i in range(lane, RACE_MESSAGES, 8):
                skey, text = skeys[i % RACE_CONVERSATIONS], f"race-{i}"
                if i % 4 == 3:  # through one daemon's HTTP route, racing the other's feed
                    r = api.post(
                        f"/api/conversations/{skey}/messages",
                        json={"parts": [{"$type": TEXT, "text": text}], "generation": {}},
                    )
                    assert r.status_code == 201, r.text
                    key = r.json()["userKey"]
                    how["http"] += 1
                else:  # a direct write with the SDK, seen by both daemons' feeds
                    key = new_tid()
                    _write(client, backend.did, skey, key, user_message(text))
                    how["direct"] += 1
                texts[(skey, key)] = text

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(writer, range(8)))
        assert len(texts) == RACE_MESSAGES

        def answered() -> dict[str, dict[str, tuple[str, dict[str, Any]]]] | None:
            convs = {s: backend.conversation(daemons[0], s) for s in skeys}
            for skey, key in texts:
                got = convs[skey].get(f"{key}.r0")
                if got is None or got[1].get("status") in (None, "pending"):
                    return None
            return convs

        convs = wait_until(answered, 240, "100 replies", interval=1.0)
        elapsed = time.monotonic() - t0
        time.sleep(3)  # a loser still reading back its failed claim would show by now
        convs = {s: backend.conversation(daemons[0], s) for s in skeys}
        prompts = fake.prompts()
        replies: Counter[str] = Counter()
        for skey, records in convs.items():
            for k, (cid, value) in records.items():
                # Loose on purpose: on the local backend the store computed that CID with record_cid, so
                # this only holds the pds backend (the PDS's own CID) to account; the fixed vectors in
                # tests/test_cid.py are what anchor record_cid itself.
                assert cid == record_cid(value), k
                parsed = parse_reply_key(k)
                if parsed is None:
                    continue
                assert value["status"] == "complete", (k, value)
                assert parsed[1] == 0, k  # no second attempt anywhere
                replies[texts[(skey, parsed[0])]] += 1
        all_texts = sorted(texts.values())
        assert [prompts[t] for t in all_texts] == [1] * RACE_MESSAGES, prompts
        assert [replies[t] for t in all_texts] == [1] * RACE_MESSAGES, replies
        assert sum(prompts.values()) == RACE_MESSAGES
        logged = Counter((ln["conversation"], ln["key"]) for d in daemons for ln in d.turn_lines())
        assert sum(logged.values()) == RACE_MESSAGES and set(logged.values()) == {1}
        by_daemon = {d.name: len(d.turn_lines()) for d in daemons}
        for d in daemons:
            assert d.stop() == 0, d.logs()[-3000:]
            with sqlite3.connect(d.state) as db:
                assert db.execute("SELECT count(*) FROM turn_claim").fetchone()[0] == 0
        print(
            f"\n{backend.kind}: 2 daemons, {RACE_MESSAGES} messages ({dict(how)}): "
            f"{sum(prompts.values())} generations, 0 duplicates, won by {by_daemon}, "
            f"all answered in {elapsed:.1f}s"
        )
    finally:
        fake.stop()


# -- the same CIDs on both backends -------------------------------------------------------------


def test_vector_cids_through_a_running_daemon(backend: Backend, running: Any) -> None:
    """The records of tests/vectors/cids.json, written with the SDK into each backend,
    get the reference PDS's CIDs (test_cid.py: turnd's encoder; test_pds_fixture.py: the
    PDS itself)."""
    vectors = json.loads((Path(__file__).parent / "vectors" / "cids.json").read_text())
    with FakeModel() as fake:
        d = running("d", fake.base_url)
        client = backend.client(d)
        skey = new_tid()
        for i, vector in enumerate(vectors["vectors"]):
            assert _write(client, backend.did, skey, f"v{i}", vector["record"]) == vector["cid"]
            assert backend.get(d, skey, f"v{i}") == (vector["cid"], vector["record"])
        assert d.stop() == 0
