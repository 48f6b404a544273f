"""What a new user meets at the command line (SPEC §17), end to end: real ``turnd``
subprocesses, a real fake model server on loopback, no mocks.

``--version`` and a bare ``turnd``; ``turnd send`` refusing in one line (no daemon, no such
conversation, no such provider) without writing anything, and noticing a daemon that died
mid-reply; a provider without a ``models`` list offering what its ``/models`` answers (the
page's ``/api/models`` and ``turnd check``); errors naming the provider; ``serve`` warning
about an unreachable default provider and printing the page's URL; "did you mean" for a
misspelt key; unknown ``TURND_*`` variables; a second Ctrl-C to the whole process group
(as a terminal sends it) exiting without a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from testbed.fakemodel import FakeModel, Reply
from testbed.ports import free_port
from tests.support.cli import (
    ME_PASSWORD,
    ME_TOKEN,
    TURND,
    clean_env,
    fake_config,
    me_config,
    turnd,
    wait_healthy,
)
from turns.tls import tls_context

TEXT = "network.sharedcomputer.chat.defs#textPart"


def test_version_and_a_bare_turnd_prints_its_help() -> None:
    from importlib.metadata import version

    shown = subprocess.run([TURND, "--version"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and shown.stdout == f"turnd {version('turnd')}\n"
    bare = subprocess.run([TURND], capture_output=True, text=True, timeout=30)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.startswith("usage: turnd") and bare.stderr == ""
    for command in ("init", "serve", "send", "check", "usage"):
        assert re.search(rf"^\s+{command}\s", bare.stdout, re.M), bare.stdout


def _store_files(data: Path) -> set[str]:
    return {p.name for p in data.iterdir()} if data.exists() else set()


def test_send_without_a_daemon_fails_fast_in_one_line(tmp_path: Path) -> None:
    with FakeModel() as fake:
        port = free_port()  # nothing listens there
        conf, env = fake_config(tmp_path, fake.base_url, port)
        sent = turnd("send", "--config", str(conf), "hello", cwd=tmp_path, env=env)
        assert fake.request_count == 0
    assert sent.returncode == 1
    assert sent.stderr == (
        f"turnd: cannot reach turnd at http://127.0.0.1:{port} — is `turnd serve` running?\n"
    )
    assert sent.stdout == ""
    assert "store.sqlite3" not in _store_files(tmp_path / "turnd-data")


def test_send_refuses_a_missing_conversation_or_provider_or_an_empty_message_and_writes_nothing(
    tmp_path: Path, serve: Any
) -> None:
    with FakeModel() as fake:
        conf, env = fake_config(tmp_path, fake.base_url, free_port())
        daemon = serve(tmp_path, env, "--config", str(conf))
        daemon.wait_for(r"turnd: serving", timeout=30)
        wait_healthy(daemon.url, timeout=15)

        nosuch = turnd(
            "send", "--config", str(conf), "--conversation", "3aaaaaaaaaaaa", "hi",
            cwd=tmp_path, env=env,
        )
        assert nosuch.returncode == 2
        assert nosuch.stderr == (
            "turnd: --conversation 3aaaaaaaaaaaa: no such conversation "
            "(see GET /api/conversations)\n"
        )
        bad_key = turnd(
            "send", "--config", str(conf), "--conversation", "a:b", "hi", cwd=tmp_path, env=env
        )
        assert bad_key.returncode == 2 and bad_key.stderr.count("\n") == 1
        assert bad_key.stderr.startswith("turnd: --conversation a:b: ")
        nope = turnd("send", "--config", str(conf), "--model", "nope:x", "hi", cwd=tmp_path, env=env)
        assert nope.returncode == 2
        assert nope.stderr == (
            "turnd: --model nope:x: no provider 'nope' in the config (known: echo, fake)\n"
        )
        for blank in ("", "  \n"):
            empty = turnd("send", "--config", str(conf), blank, cwd=tmp_path, env=env)
            assert empty.returncode == 2
            assert empty.stderr == "turnd: nothing to send: the message is empty\n"
        api = httpx.Client(
            base_url=daemon.url, headers={"Authorization": "Bearer tok-123456789"}, timeout=10, verify=tls_context()
        )
        assert api.get("/api/conversations").json()["conversations"] == []
        assert fake.request_count == 0

        # and a conversation that exists is continued
        first = turnd("send", "--config", str(conf), "one", cwd=tmp_path, env=env)
        assert first.returncode == 0, first.stderr
        skey = re.search(r"conversation (\S+)", first.stderr).group(1)  # type: ignore[union-attr]
        again = turnd(
            "send", "--config", str(conf), "--conversation", skey, "two", cwd=tmp_path, env=env
        )
        assert again.returncode == 0, again.stderr
        assert daemon.stop() == 0


def test_send_notices_a_daemon_that_died_mid_reply(tmp_path: Path, serve: Any) -> None:
    slow = Reply.text(["one ", "two ", "three ", "four"]).delayed(chunk_delay=30)
    with FakeModel(default=slow) as fake:
        conf, env = fake_config(tmp_path, fake.base_url, free_port())
        daemon = serve(tmp_path, env, "--config", str(conf))
        daemon.wait_for(r"turnd: serving", timeout=30)
        wait_healthy(daemon.url, timeout=15)
        out = tmp_path / "send.out"
        with out.open("wb") as o:
            sender = subprocess.Popen(
                [TURND, "send", "--config", str(conf), "hello"],
                cwd=tmp_path, env=env, stdout=o, stderr=subprocess.PIPE, text=True,
            )
        try:
            fake.wait_for_requests(1, timeout=30)
            daemon.proc.kill()  # gone without a word, mid-reply
            daemon.proc.wait(10)
            # SPEC §17: noticed within 10 s (a deadline on the wait, not a timing).
            _, err = sender.communicate(timeout=10)
        finally:
            if sender.poll() is None:
                sender.kill()
                sender.wait(10)
    assert sender.returncode == 1
    assert err.endswith(
        f"turnd: lost turnd at {daemon.url} mid-reply — is `turnd serve` still running?\n"
    ), err


def _provider_config(
    tmp_path: Path, providers: str, default: str, **secrets: str
) -> tuple[Path, dict[str, str]]:
    """A config on ``providers`` listening on a free port, and its environment (the
    account's secrets and ``secrets``)."""
    port = free_port()
    turns = '[turns]\nretries = 0\ntitleModel = ""'
    conf = me_config(tmp_path, port, default=default, providers=providers, turns=turns)
    env = clean_env(ME_PASSWORD=ME_PASSWORD, ME_TOKEN=ME_TOKEN, TURND_HTTP_LISTEN=f"127.0.0.1:{port}", **secrets)
    return conf, env


def test_a_provider_without_a_models_list_offers_what_its_models_answers(
    tmp_path: Path, serve: Any
) -> None:
    with FakeModel(models=["alpha-1", "beta-2"], api_key="sk-listing-key-1") as fake:
        conf, env = _provider_config(
            tmp_path,
            f'[providers.lister]\nbase_url = "{fake.base_url}"\napi_key_env = "LISTER_KEY"\n',
            "echo:echo",
            LISTER_KEY="sk-listing-key-1",
        )
        checked = turnd("check", "--config", str(conf), cwd=tmp_path, env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert re.search(r"^ok\s+provider\s+lister .*: 2 models \(alpha-1, beta-2\)$",
                         checked.stdout, re.M), checked.stdout

        daemon = serve(tmp_path, env, "--config", str(conf))
        daemon.wait_for(r"turnd: serving", timeout=30)
        wait_healthy(daemon.url, timeout=15)
        api = httpx.Client(
            base_url=daemon.url, headers={"Authorization": "Bearer tok-123456789"}, timeout=10, verify=tls_context()
        )
        listings_before = _listings(fake)
        for _ in range(3):
            got = api.get("/api/models")
            assert got.status_code == 200, got.text
            offered = [(m["provider"], m["id"]) for m in got.json()["models"]]
            assert offered == [("echo", "echo"), ("lister", "alpha-1"), ("lister", "beta-2")]
        # asked once, then answered from the cache
        assert _listings(fake) == listings_before + 1
        assert "sk-listing-key-1" not in daemon.stderr() + daemon.stdout()
        assert daemon.stop() == 0


def _listings(fake: FakeModel) -> int:
    return len([r for r in fake.requests if r.method == "GET" and r.path.endswith("/models")])


def test_serve_warns_about_an_unreachable_default_and_errors_name_the_provider(
    tmp_path: Path, serve: Any
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    conf, env = _provider_config(
        tmp_path,
        f'[providers.down]\nbase_url = "{dead}"\napi_key_env = "DOWN_KEY"\nmodels = ["m"]\n',
        "down:m",
        DOWN_KEY="sk-secret-down-key",
    )
    daemon = serve(tmp_path, env, "--config", str(conf))
    daemon.wait_for(r"turnd: serving", timeout=30)
    warned = daemon.wait_for(
        r"turnd: warning: the default model's provider cannot be reached: down .*\n",
        timeout=30, stderr=True,
    ).group(0)
    assert dead in warned and "APIConnectionError" in warned
    assert daemon.stdout().count(f"the chat page: {daemon.url}/") == 1

    sent = turnd("send", "--config", str(conf), "hi", cwd=tmp_path, env=env)
    assert sent.returncode == 1
    assert 'could not reach the model provider "down"' in sent.stderr, sent.stderr
    everything = daemon.stdout() + daemon.stderr() + sent.stdout + sent.stderr
    assert "sk-secret-down-key" not in everything
    assert daemon.stop() == 0


def test_config_errors_suggest_the_nearest_key(tmp_path: Path) -> None:
    conf = tmp_path / "turnd.toml"
    for table, wrong, right in (
        ("[http]", 'lisen = "127.0.0.1:1"', "listen"),
        ("[turns]", "maxStep = 3", "maxSteps"),
        ("[htp]", 'listen = "127.0.0.1:1"', "http"),
        ('[providers.p]\nbase_url = "http://127.0.0.1:1/v1"', "api_key_evn = 'X'", "api_key_env"),
    ):
        conf.write_text(f"{table}\n{wrong}\n")
        refused = turnd("serve", "--config", str(conf), cwd=tmp_path, env=clean_env())
        assert refused.returncode == 2
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.endswith(f"(did you mean `{right}`?)\n"), refused.stderr


def test_unknown_turnd_variables_are_warned_about(tmp_path: Path, serve: Any) -> None:
    port = free_port()
    env = clean_env(
        TURND_HTTP_LISTEN=f"127.0.0.1:{port}",
        TURND_HTTP_LISTN="127.0.0.1:1",  # a typo: would otherwise be silently ignored
        TURND_ME_TOKEN="set-from-the-readme",  # the README's export line: not warned about
    )
    checked = turnd("check", cwd=tmp_path, env=env)
    assert re.search(
        r"^warn\s+config\s+unknown variable TURND_HTTP_LISTN, ignored "
        r"\(did you mean `TURND_HTTP_LISTEN`\?\)$", checked.stdout, re.M,
    ), checked.stdout
    daemon = serve(tmp_path, env)
    daemon.wait_for(r"turnd: serving", timeout=30)
    warnings = [ln for ln in daemon.stderr().splitlines() if "warning: unknown variable" in ln]
    assert warnings == [
        "turnd: warning: unknown variable TURND_HTTP_LISTN, ignored "
        "(did you mean `TURND_HTTP_LISTEN`?)"
    ]
    assert daemon.stop() == 0


def test_a_second_ctrl_c_to_the_process_group_exits_without_tracebacks(
    tmp_path: Path,
) -> None:
    stalled = Reply.text(["never ", "ends"]).delayed(ttft=120)
    with FakeModel(default=stalled) as fake:
        conf, env = fake_config(tmp_path, fake.base_url, free_port())
        out, err = tmp_path / "serve.out", tmp_path / "serve.err"
        with out.open("wb") as o, err.open("wb") as e:
            # Its own session: a terminal's Ctrl-C goes to the whole foreground group,
            # the render workers included; so do these.
            proc = subprocess.Popen(
                [TURND, "serve", "--config", str(conf)], cwd=tmp_path, env=env,
                stdout=o, stderr=e, start_new_session=True,
            )
        try:
            url = env["TURND_HTTP_LISTEN"]
            _wait_for(out, "turnd: serving", proc)
            wait_healthy(f"http://{url}", timeout=15)
            api = httpx.Client(
                base_url=f"http://{url}", headers={"Authorization": "Bearer tok-123456789"},
                timeout=10, verify=tls_context(),
            )
            # a render worker process, as the page starts one
            assert api.post("/api/render", json={"texts": ["# hi"]}).status_code == 200
            skey = api.post("/api/conversations", json={}).json()["skey"]
            api.post(f"/api/conversations/{skey}/messages",
                     json={"parts": [{"$type": TEXT, "text": "x"}], "generation": {}})
            fake.wait_for_requests(1, timeout=30)
            os.killpg(proc.pid, signal.SIGINT)
            _wait_for(err, "stopping: no new turns", proc)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    logs = err.read_text()
    assert "exiting now" in logs
    assert "Traceback" not in logs, logs
    assert proc.returncode in (0, 130)


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"turnd exited {proc.returncode}")
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in {path}")
