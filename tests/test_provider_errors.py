"""Errors about a model provider name it — its config name and base URL — never its key
(SPEC §17), wherever they show: the `retry` and `fallback` events, the final `status`,
the reply record, the log, and `turnd send`'s "no title" line (whose `title-failed`
event also ends send's wait for a title). Real `turnd serve` processes, a real fake
model server, a port where nothing listens.

The keys are not shaped like an OpenAI key (``sk-…``), so only turnd's scrubbing of the
configured keys themselves can keep them out, not its key-shaped pattern.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from testbed.fakemodel import FakeModel, Reply
from testbed.ports import free_port
from tests.support.cli import clean_env, turnd, wait_healthy
from tests.support.sse import parse_events
from turns.provider_errors import name_provider, shown_url
from turns.tls import tls_context

TEXT = "network.sharedcomputer.chat.defs#textPart"
TOKEN = "tok-123456789"
DOWN_KEY = "kx9-Down-Provider-Secret-7781"
FAKE_KEY = "kx9-Fake-Provider-Secret-4410"


def test_the_provider_is_named_with_its_url_and_nothing_that_may_carry_a_key() -> None:
    assert shown_url("https://user:pw@api.example.com:8443/v1/?key=abc#x") == (
        "https://api.example.com:8443/v1"
    )
    assert shown_url("http://[::1]:8080/v1/") == "http://[::1]:8080/v1"
    url = "http://127.0.0.1:9/v1/"
    assert name_provider("could not reach the model provider", "local", url) == (
        'could not reach the model provider "local" at http://127.0.0.1:9/v1'
    )
    assert name_provider("the model provider answered 503: busy", "local", url) == (
        'the model provider "local" at http://127.0.0.1:9/v1 answered 503: busy'
    )
    assert name_provider("the model's stream was cut off", "local", url) == (
        "the model's stream was cut off (the model provider \"local\" at http://127.0.0.1:9/v1)"
    )
    # named once, and a retry's status line is left as the status line
    named = name_provider("could not reach the model provider", "local", url)
    assert name_provider(named, "local", url) == named
    assert name_provider("429 Too Many Requests", "local", url, always=False) == (
        "429 Too Many Requests"
    )


def _config(tmp_path: Path, port: int, body: str) -> tuple[Path, dict[str, str]]:
    conf = tmp_path / "turnd.toml"
    conf.write_text(
        f"""
[http]
listen = "127.0.0.1:{port}"
{body}
[accounts.me]
handle = "me.test"
password_env = "ME_PASSWORD"
token_env = "ME_TOKEN"
"""
    )
    env = clean_env(
        ME_PASSWORD="pw-123456789", ME_TOKEN=TOKEN, DOWN_KEY=DOWN_KEY, FAKE_KEY=FAKE_KEY,
        TURND_HTTP_LISTEN=f"127.0.0.1:{port}",
    )
    return conf, env


def _served(tmp_path: Path, serve: Any, body: str) -> tuple[Any, Path, dict[str, str]]:
    """``turnd serve`` on a free port with ``_config(body)``, serving and healthy; the
    process, its config file and its environment."""
    conf, env = _config(tmp_path, free_port(), body)
    daemon = serve(tmp_path, env, "--config", str(conf))
    daemon.wait_for(r"turnd: serving", timeout=30)
    wait_healthy(daemon.url, timeout=15)
    return daemon, conf, env


def _titled_by(provider: str, base_url: str, key_env: str, model: str) -> str:
    """Replies by the echo, titles by ``provider:model`` (no retries)."""
    return f"""[models]
default = "echo:echo"
[turns]
retries = 0
titleModel = "{provider}:{model}"
[providers.{provider}]
base_url = "{base_url}"
api_key_env = "{key_env}"
models = ["{model}"]
"""


def _turn(url: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Post one message; its reply's stream (read whole), its final record, the raw stream."""
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60, verify=tls_context())
    skey = api.post("/api/conversations", json={}).json()["skey"]
    posted = api.post(
        f"/api/conversations/{skey}/messages",
        json={"parts": [{"$type": TEXT, "text": "hi"}], "generation": {}},
    )
    assert posted.status_code == 201, posted.text
    reply = posted.json()["replyKey"]
    raw = api.get(f"/api/conversations/{skey}/messages/{reply}/stream").text
    messages = api.get(f"/api/conversations/{skey}").json()["messages"]
    record = next(m["value"] for m in messages if m["key"] == reply)
    return parse_events(raw), record, raw


def test_a_dead_provider_is_named_in_the_retry_the_status_the_record_and_the_log(
    tmp_path: Path, serve: Any
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    daemon, conf, env = _served(
        tmp_path, serve,
        f"""[models]
default = "down:m"
[turns]
retries = 1
titleModel = ""
[providers.down]
base_url = "{dead}"
api_key_env = "DOWN_KEY"
models = ["m"]
""",
    )
    events, record, raw = _turn(daemon.url)

    named = f'could not reach the model provider "down" at {dead}'
    retries = [e["data"] for e in events if e["event"] == "retry"]
    assert [r["reason"] for r in retries] == [named], events
    status = events[-1]
    assert status["event"] == "status" and status["data"]["status"] == "error"
    assert status["data"]["error"] == named
    assert record["status"] == "error" and record["error"] == named
    assert daemon.stop() == 0
    logs = daemon.stdout() + daemon.stderr()
    assert re.search(r"status=error|\"status\": ?\"error\"", logs), logs  # the turn's log line
    for where in (raw, json.dumps(record), logs):
        assert DOWN_KEY not in where


def test_a_provider_error_echoing_its_key_falls_back_named_and_scrubbed(
    tmp_path: Path, serve: Any
) -> None:
    # A provider whose error body repeats the key it was sent (some gateways do).
    echoing = Reply.error(401, f"Incorrect API key provided: {FAKE_KEY}", "invalid_request_error")
    with FakeModel(default=echoing) as fake:
        daemon, conf, env = _served(
            tmp_path, serve,
            f"""[models]
default = "fake:fake-model"
[models.fallbacks]
"fake:fake-model" = ["echo:echo"]
[turns]
retries = 0
titleModel = ""
[providers.fake]
base_url = "{fake.base_url}"
api_key_env = "FAKE_KEY"
models = ["fake-model"]
""",
        )
        events, record, raw = _turn(daemon.url)
        assert fake.request_count >= 1
    fallback = [e["data"] for e in events if e["event"] == "fallback"]
    assert len(fallback) == 1, events
    reason = fallback[0]["reason"]
    assert reason.startswith(f'the model provider "fake" at {fake.base_url.rstrip("/")} answered 401:')
    assert record["status"] == "complete" and record["model"]["provider"] == "echo"
    assert daemon.stop() == 0
    for where in (raw, json.dumps(record), daemon.stdout() + daemon.stderr()):
        assert FAKE_KEY not in where


def test_a_failing_title_model_is_named_and_send_does_not_wait_for_its_title(
    tmp_path: Path, serve: Any
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    daemon, conf, env = _served(tmp_path, serve, _titled_by("down", dead, "DOWN_KEY", "m"))
    sent = turnd("send", "--config", str(conf), "hello", cwd=tmp_path, env=env)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == "Echo: hello\n"
    # The daemon said the title will not come (a `title-failed` event), and send says why
    # instead of waiting out TITLE_WAIT for a title that never arrives.
    reason = f'could not reach the model provider "down" at {dead}'
    assert sent.stderr.endswith(f"turnd: no title: the title model down:m failed: {reason}\n"), (
        sent.stderr
    )
    skey = re.search(r"conversation (\S+)", sent.stderr).group(1)  # type: ignore[union-attr]
    with httpx.stream(
        "GET", f"{daemon.url}/api/conversations/{skey}/events",
        headers={"Authorization": f"Bearer {TOKEN}", "Last-Event-ID": "0"}, timeout=10, verify=tls_context(),
    ) as stream:
        failed, lines = None, stream.iter_lines()
        for line in lines:
            if line == "event: title-failed":
                failed = json.loads(next(lines).removeprefix("data: "))
                break
    assert failed == {"reason": f"the title model down:m failed: {reason}"}
    assert daemon.stop() == 0
    assert f"the title model down:m failed: {reason}" in daemon.stderr()
    assert DOWN_KEY not in daemon.stdout() + daemon.stderr() + sent.stdout + sent.stderr


def test_a_title_model_error_echoing_its_key_reaches_no_event_and_no_line(
    tmp_path: Path, serve: Any
) -> None:
    echoing = Reply.error(401, f"Incorrect API key provided: {FAKE_KEY}", "invalid_request_error")
    with FakeModel(default=echoing) as fake:
        daemon, conf, env = _served(
            tmp_path, serve, _titled_by("fake", fake.base_url, "FAKE_KEY", "titler")
        )
        sent = turnd("send", "--config", str(conf), "hello", cwd=tmp_path, env=env)
        assert fake.request_count >= 1  # the title model was asked, with its key
        assert fake.last_request.api_key == FAKE_KEY
    assert sent.returncode == 0, sent.stderr
    where = f'the model provider "fake" at {fake.base_url.rstrip("/")}'
    assert sent.stderr.endswith(
        f"turnd: no title: the title model fake:titler failed: {where} answered 401: "
        "Incorrect API key provided: [redacted]\n"
    ), sent.stderr
    assert daemon.stop() == 0
    assert FAKE_KEY not in sent.stderr + daemon.stdout() + daemon.stderr()
