"""The `turnd` console script end to end: real subprocesses on loopback, no mocks.

``turnd serve`` on embedded defaults and on an ``init``-written config, ``turnd send``
answered by the built-in echo, ``turnd check``, one log line per turn (text and JSON,
no secrets), SIGTERM draining a running turn, a second signal exiting at once.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from testbed.fakemodel import FakeModel, Reply
from testbed.ports import free_port
from tests.support.cli import (
    TURND,
    Served,
    clean_env,
    fake_config,
    turnd,
    wait_healthy,
)
from turns.tls import tls_context

TEXT = "network.sharedcomputer.chat.defs#textPart"
MESSAGE = "network.sharedcomputer.chat.message"


# -- the README's path: no config at all ------------------------------------------------------


def test_serve_on_embedded_defaults_then_send_hello(tmp_path: Path, serve: Any) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(TURND_HTTP_LISTEN=f"127.0.0.1:{free_port()}")
    daemon = serve(work, env)

    line = daemon.wait_for(r"turnd: serving .*\n").group(0)
    token = re.search(r"token (\S+?);", line)
    assert token, line
    assert daemon.url in line and 'turnd send "hello"' in line
    assert "echo (built-in test provider)" in line
    created = daemon.wait_for(r"created account me\.test .* password (\S+) token (\S+) ")
    assert created.group(2) == token.group(1)
    credentials = work / "turnd-data" / "credentials.json"
    assert credentials.stat().st_mode & 0o777 == 0o600
    wait_healthy(daemon.url)

    sent = turnd("send", "hello", cwd=work, env=env)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == "Echo: hello\n"
    skey = re.search(r"conversation (\S+)", sent.stderr).group(1)  # type: ignore[union-attr]
    # The title generated after the first reply (by the echo: the default title model is
    # the turn's own) is printed when it arrives.
    title = re.search(r"^turnd: title '(.+)'$", sent.stderr, re.M)
    assert title and title.group(1) == "Hello", sent.stderr  # the user's words, not "Echo: User: …"

    # a second message continues the branch: its parent is the first reply
    again = turnd("send", "--conversation", skey, "and again", cwd=work, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "Echo: and again\n"
    api = httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {token.group(1)}"}, verify=tls_context())
    messages = {
        m["key"]: m["value"] for m in api.get(f"/api/conversations/{skey}").json()["messages"]
    }
    users = sorted(k for k, v in messages.items() if v["role"] == "user")
    assert len(users) == 2 and messages[users[1]]["parent"] == f"{users[0]}.r0"
    assert messages[f"{users[1]}.r0"]["status"] == "complete"

    # an unknown provider is refused before anything is written (SPEC §17)
    failed = turnd("send", "--model", "nope:x", "hi", cwd=work, env=env)
    assert failed.returncode == 2
    assert failed.stderr == (
        "turnd: --model nope:x: no provider 'nope' in the config (known: echo)\n"
    )

    checked = turnd("check", cwd=work, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "embedded defaults" in checked.stdout
    assert re.search(r"^ok\s+store\s+local ", checked.stdout, re.M)
    assert re.search(
        r"^ok\s+provider\s+echo \[echo \(built-in test provider\)\]", checked.stdout, re.M
    )

    assert daemon.stop() == 0
    logs = daemon.stderr()
    assert "turnd.service stopped" in logs
    # one line per turn, with the fields the spec asks for
    turns = [ln for ln in logs.splitlines() if " turnd.turns turn " in ln]
    assert len(turns) == 2  # the third send (--model nope:x) was refused
    assert all(re.search(r"conversation=\S+ key=\S+\.r0 model=\S+ status=\w+", ln) for ln in turns)
    assert "status=complete" in turns[0] and "ttft_ms=" in turns[0] and "output_tokens=" in turns[0]
    # secrets are printed once on stdout, never in the logs
    assert token.group(1) not in logs and created.group(1) not in logs

    # a restart reuses the account and does not print its secrets again
    daemon2 = serve(work, env)
    line2 = daemon2.wait_for(r"turnd: serving .*\n").group(0)
    assert "token in " in line2 and token.group(1) not in daemon2.stdout()
    wait_healthy(daemon2.url)
    assert turnd("send", "hello again", cwd=work, env=env).stdout == "Echo: hello again\n"
    assert daemon2.stop() == 0


def test_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        env = clean_env(TURND_HTTP_LISTEN=f"127.0.0.1:{s.getsockname()[1]}")
        result = turnd("serve", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert re.fullmatch(r"turnd: cannot listen on 127\.0\.0\.1:\d+: .+\n", result.stderr)


# -- init, then serve on its config ---------------------------------------------------------


def test_init_then_serve_with_json_logs(tmp_path: Path, serve: Any) -> None:
    port = free_port()
    conf = tmp_path / "etc" / "turnd.toml"
    init = turnd(
        "init",
        "--config",
        str(conf),
        "--listen",
        f"127.0.0.1:{port}",
        cwd=tmp_path,
        env=clean_env(),
    )
    assert init.returncode == 0, init.stderr
    password = re.search(r"^\s*export TURND_ME_PASSWORD=(\S+)$", init.stdout, re.M)
    token = re.search(r"^\s*export TURND_ME_TOKEN=(\S+)$", init.stdout, re.M)
    assert password and token
    env_file = conf.with_name("turnd.env")
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_file.read_text() == (
        f"TURND_ME_PASSWORD={password.group(1)}\nTURND_ME_TOKEN={token.group(1)}\n"
    )
    text = conf.read_text()
    assert "password_env" in text and password.group(1) not in text and token.group(1) not in text
    assert (tmp_path / "etc" / "turnd-data").is_dir()  # the local account's store
    again = turnd("init", "--config", str(conf), cwd=tmp_path, env=clean_env())
    assert again.returncode == 1 and "already exists" in again.stderr

    # without the secrets exported, serve refuses in one line pointing at turnd.env
    refused = turnd("serve", "--config", str(conf), cwd=tmp_path, env=clean_env())
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert "accounts.me.password_env: environment variable TURND_ME_PASSWORD" in refused.stderr
    assert f"it is in {env_file}" in refused.stderr
    assert f"set -a; . {env_file}; set +a" in refused.stderr

    env = clean_env(TURND_ME_PASSWORD=password.group(1), TURND_ME_TOKEN=token.group(1))
    env["TURND_HTTP_LISTEN"] = f"127.0.0.1:{port}"
    daemon = serve(tmp_path, env, "--config", str(conf), "--log-format", "json")
    line = daemon.wait_for(r"turnd: serving .*\n").group(0)
    assert "token in $TURND_ME_TOKEN" in line and token.group(1) not in line
    wait_healthy(daemon.url)

    sent = turnd("send", "--config", str(conf), "hi there", cwd=tmp_path, env=env)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == "Echo: hi there\n"
    assert daemon.stop() == 0

    records = [json.loads(ln) for ln in daemon.stderr().splitlines() if ln.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    [turn] = [r for r in records if r["logger"] == "turnd.turns" and "status" in r]
    assert turn["status"] == "complete" and turn["model"] == "echo:echo"
    assert turn["key"].endswith(".r0") and turn["ttft_ms"] is not None
    assert password.group(1) not in daemon.stderr() and token.group(1) not in daemon.stderr()


# -- shutdown ---------------------------------------------------------------------------------


def _start_turn(url: str) -> tuple[httpx.Client, str, str]:
    api = httpx.Client(base_url=url, headers={"Authorization": "Bearer tok-123456789"}, timeout=10, verify=tls_context())
    skey = api.post("/api/conversations", json={}).json()["skey"]
    posted = api.post(
        f"/api/conversations/{skey}/messages",
        json={"parts": [{"$type": TEXT, "text": "slow please"}], "generation": {}},
    )
    assert posted.status_code == 201, posted.text
    assert posted.json()["turn"] == "claimed"
    return api, skey, posted.json()["replyKey"]


def _serving_a_turn(
    tmp_path: Path, serve: Any, fake: FakeModel
) -> tuple[Served, str, str, Callable[[], Served]]:
    """``turnd serve`` on ``fake``, with a turn started that the model has begun answering;
    the last item starts the same daemon again."""
    conf, env = fake_config(tmp_path, fake.base_url, free_port())

    def start() -> Served:
        served = serve(tmp_path, env, "--config", str(conf))
        served.wait_for(r"turnd: serving")
        return served

    daemon = start()
    _, skey, reply = _start_turn(daemon.url)
    fake.wait_for_requests(1, timeout=20)
    return daemon, skey, reply, start


async def _stored_reply(data_dir: Path, skey: str, reply: str) -> dict[str, Any]:
    from daemon.dids import account_did
    from recordstore.local import LocalStore

    async with LocalStore.open(data_dir) as store:
        record = await store.get_record(account_did(data_dir, "me.test"), skey, MESSAGE, reply)
    assert record is not None
    return record.value


def test_sigterm_lets_a_running_turn_finish(tmp_path: Path, serve: Any) -> None:
    slow = Reply.text(["one ", "two ", "three ", "four"]).delayed(chunk_delay=0.8)
    with FakeModel(default=slow) as fake:
        daemon, skey, reply, _ = _serving_a_turn(tmp_path, serve, fake)
        # Still streaming when the signal comes (about 3 s of chunks are left)...
        assert not fake.last_request.finished
        assert daemon.stop(signal.SIGTERM) == 0
    # ...and the daemon waited for it rather than cutting it off: the whole text.
    value = anyio.run(_stored_reply, tmp_path / "turnd-data", skey, reply)
    assert value["status"] == "complete"
    assert value["content"]["parts"][0]["text"] == "one two three four"
    assert "turnd.service stopped" in daemon.stderr()


def test_a_second_signal_exits_at_once_and_restart_marks_it_interrupted(
    tmp_path: Path, serve: Any
) -> None:
    stalled = Reply.text(["never ", "ends"]).delayed(ttft=120)
    with FakeModel(default=stalled) as fake:
        daemon, skey, reply, start_again = _serving_a_turn(tmp_path, serve, fake)
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait_for(r"stopping: no new turns", stderr=True)
        assert daemon.proc.poll() is None  # draining: the turn has up to 30 s
        daemon.proc.send_signal(signal.SIGINT)
        # Exits at once, not after the 30 s grace (a deadline on the wait, not a timing).
        daemon.proc.wait(10)
        assert "exiting now" in daemon.stderr()

        # the next start writes our interrupted claim as an error, not a retry
        restarted = start_again()
        value = anyio.run(_stored_reply, tmp_path / "turnd-data", skey, reply)
        assert value["status"] == "error" and value["error"] == "interrupted"
        assert fake.request_count == 1  # no second generation
        assert restarted.stop() == 0


def test_help_everywhere() -> None:
    for args in ([], ["init"], ["serve"], ["send"], ["check"]):
        result = subprocess.run(
            [TURND, *args, "--help"], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0 and "usage: turnd" in result.stdout
    assert (
        "--log-format"
        in subprocess.run(
            [TURND, "serve", "--help"], capture_output=True, text=True, timeout=30
        ).stdout
    )


# -- a real PDS as the store ----------------------------------------------------------------


@pytest.mark.pds
def test_serve_on_a_pds_store_then_send(
    tmp_path: Path, serve: Any, pds_account: Any, pds: Any
) -> None:
    port = free_port()
    conf = tmp_path / "turnd.toml"
    conf.write_text(
        f"""
[store]
kind = "pds"
service = "{pds.url}"
[http]
listen = "127.0.0.1:{port}"
[accounts.me]
handle = "{pds_account.handle}"
password_env = "ME_APP_PASSWORD"
token_env = "ME_TOKEN"
"""
    )
    env = clean_env(ME_APP_PASSWORD=pds_account.app_password, ME_TOKEN="tok-pds-123456789")
    env["TURND_HTTP_LISTEN"] = f"127.0.0.1:{port}"
    checked = turnd("check", "--config", str(conf), cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"^ok\s+store\s+pds ", checked.stdout, re.M)

    daemon = serve(tmp_path, env, "--config", str(conf))
    daemon.wait_for(r"turnd: serving", timeout=30)
    wait_healthy(daemon.url, timeout=60)
    # the direct write goes to the PDS with the stock SDK; turnd sees it on the firehose
    sent = turnd("send", "--config", str(conf), "hello pds", cwd=tmp_path, env=env)
    assert sent.returncode == 0, sent.stderr + daemon.stderr()
    assert sent.stdout == "Echo: hello pds\n"
    assert (tmp_path / "state.sqlite3").exists()  # beside the config with a pds store
    assert daemon.stop() == 0
    assert pds_account.app_password not in daemon.stderr()


# -- the service in-process: the change feed and its cursor -----------------------------------


@pytest.mark.anyio
async def test_a_direct_write_is_answered_and_the_feed_cursor_saved(tmp_path: Path) -> None:
    from daemon.accounts import local_did
    from recordstore import CONVERSATION, CONVERSATION_REF, INFO, SETTINGS_SPACE
    from recordstore.keys import new_tid
    from recordstore.local import LocalStore
    from tests.support.daemon import running_daemon
    from turns.state import StateDB

    alice = local_did("alice.test")
    with FakeModel(default=Reply.text(["di", "rect"])) as fake:
        async with running_daemon(tmp_path, fake) as daemon:
            assert daemon.service.feed_up
            # another writer on the same store files, as a second process would be
            async with LocalStore.open(tmp_path / "data") as other:
                skey, key = new_tid(), new_tid()
                now = "2030-01-01T00:00:00.000Z"
                await other.create_space(alice, CONVERSATION, skey)
                await other.create_record(alice, skey, INFO, "self", {"createdAt": now})
                message = {
                    "role": "user",
                    "content": {
                        "$type": "network.sharedcomputer.chat.defs#plainContent",
                        "parts": [{"$type": TEXT, "text": "hi"}],
                    },
                    "generation": {"attempt": 0},
                    "createdAt": datetime_now(),
                }
                await other.create_record(alice, skey, MESSAGE, key, message)
                with anyio.fail_after(10):
                    while True:
                        reply = await other.get_record(alice, skey, MESSAGE, f"{key}.r0")
                        if reply is not None and reply.value["status"] != "pending":
                            break
                        await anyio.sleep(0.05)
                assert reply.value["status"] == "complete"
                # turnd writes on after the reply (the conversationRef; a title, when one
                # is generated). The head is the store's newest op once turnd's own saved
                # cursor (flushed every second) has reached it: read earlier, the feed and
                # its cursor would move on past it.
                with anyio.fail_after(10):
                    while True:
                        ref = await other.get_record(alice, SETTINGS_SPACE, CONVERSATION_REF, skey)
                        if ref is not None:
                            break
                        await anyio.sleep(0.05)
                head = await _settled_head(tmp_path / "data")
                # The feed's newest change, read to the end (a deadline, not a fixed wait):
                # the local store's cursors are its op ids, so the end is the largest.
                last = None
                with anyio.fail_after(10):
                    async with other.changes(None) as feed:
                        async for change in feed:
                            last = change.cursor
                            if last == head:
                                break
        # stopped: the saved cursor is exactly the last change handled, not beyond
        state = await StateDB.open(tmp_path / "data" / "state.sqlite3")
        try:
            assert await state.get_cursor("changes") == last
        finally:
            await state.aclose()


async def _settled_head(data: Path) -> str:
    """The store's newest op id, once the daemon's saved feed cursor equals it (both read
    as another process would, again on each poll: the daemon may still be writing)."""
    with anyio.fail_after(10):
        while True:
            with sqlite3.connect(data / "store.sqlite3") as db:
                head = str(db.execute("SELECT max(id) FROM ops").fetchone()[0])
            with sqlite3.connect(data / "state.sqlite3") as db:
                row = db.execute("SELECT value FROM cursor WHERE name = 'changes'").fetchone()
            if row is not None and row[0] == head:
                return head
            await anyio.sleep(0.05)


def datetime_now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- the echo provider and the log formatters, in-process -----------------------------------


@pytest.mark.anyio
async def test_echo_speaks_openai_chat_completions() -> None:
    import openai
    from fastapi import FastAPI

    from daemon.echo import router

    app = FastAPI()
    app.include_router(router())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        client = openai.AsyncOpenAI(base_url="http://t/echo/v1", api_key="x", http_client=http)
        models = [m async for m in client.models.list()]
        assert [(m.id, m.owned_by) for m in models] == [("echo", "echo (built-in test provider)")]
        messages: Any = [
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "Echo: first"},
            {"role": "user", "content": [{"type": "text", "text": "one two three four five"}]},
        ]
        stream = await client.chat.completions.create(
            model="echo", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        assert "".join(deltas) == "Echo: one two three four five"
        assert len([d for d in deltas if d]) > 1  # streamed in pieces
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == len([d for d in deltas if d])
        plain = await client.chat.completions.create(model="echo", messages=messages)
        assert plain.choices[0].message.content == "Echo: one two three four five"
        bad = await http.post("http://t/echo/v1/chat/completions", json={"messages": []})
        assert bad.status_code == 422


def _turn_record(secret: str) -> Any:
    import logging

    return logging.LogRecord("turnd.turns", logging.INFO, __file__, 1, "turn %s", ("x",), None), {
        "conversation": "3abc",
        "key": "3def.r0",
        "model": "fake:m",
        "status": "error",
        "ttft_ms": 12.5,
        "input_tokens": 3,
        "output_tokens": None,
        "error": f"provider said: bad key {secret}",
    }


def test_text_and_json_log_lines_for_a_turn() -> None:
    from daemon.logs import JsonFormatter, RedactSecrets, TextFormatter

    secret = "sk-very-secret-key"
    record, turn = _turn_record(secret)
    record.turn = turn
    assert RedactSecrets([secret]).filter(record)
    text = TextFormatter().format(record)
    assert "\n" not in text
    assert text.endswith(
        "INFO turnd.turns turn conversation=3abc key=3def.r0 model=fake:m status=error "
        'ttft_ms=12.5 input_tokens=3 error="provider said: bad key [redacted]"'
    )
    body = json.loads(JsonFormatter().format(record))
    assert body["logger"] == "turnd.turns" and body["status"] == "error"
    assert body["ttft_ms"] == 12.5 and body["key"] == "3def.r0"
    assert secret not in json.dumps(body)


def test_redaction_covers_messages_args_and_tracebacks() -> None:
    import logging

    from daemon.logs import RedactSecrets, TextFormatter

    secret = "tok-abcdefgh123"
    try:
        raise RuntimeError(f"header Authorization: Bearer {secret}")
    except RuntimeError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed with %s", (secret,), sys.exc_info()
        )
    RedactSecrets([secret, "short"]).filter(record)
    line = TextFormatter().format(record)
    assert secret not in line and line.count("[redacted]") == 2


def test_check_reports_each_provider_and_fails_on_a_bad_one(tmp_path: Path) -> None:
    with (
        FakeModel(api_key="sk-right-key-123") as good,
        FakeModel(api_key="sk-right-key-123") as bad,
    ):
        conf = tmp_path / "turnd.toml"
        conf.write_text(
            f"""
[providers.good]
base_url = "{good.base_url}"
api_key_env = "GOOD_KEY"
models = ["fake-model", "not-there"]
[providers.bad]
base_url = "{bad.base_url}"
api_key_env = "BAD_KEY"
[providers.down]
base_url = "http://127.0.0.1:{free_port()}/v1"
"""
        )
        env = clean_env(GOOD_KEY="sk-right-key-123", BAD_KEY="sk-wrong-key-456")
        result = turnd("check", "--config", str(conf), cwd=tmp_path, env=env)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"ok    config    {conf}"
    assert re.search(
        r"^ok\s+provider\s+good .*: 1 model; not listed: not-there$", result.stdout, re.M
    )
    assert re.search(r"^FAIL\s+provider\s+bad .*AuthenticationError", result.stdout, re.M)
    assert re.search(r"^FAIL\s+provider\s+down .*APIConnectionError", result.stdout, re.M)
    assert re.search(
        r"^ok\s+provider\s+echo \[echo \(built-in test provider\)\]", result.stdout, re.M
    )
    assert "sk-wrong-key-456" not in result.stdout + result.stderr
    assert "sk-right-key-123" not in result.stdout + result.stderr
