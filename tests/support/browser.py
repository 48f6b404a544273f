"""The web page in a real browser: what the browser test modules share.

Playwright for Python drives Debian's Chromium (``/usr/bin/chromium``, the ``browser``
fixture, one a module) against a real ``turnd serve`` subprocess (``turnd_serve``, the
account ``me`` with ``TOKEN``); the helpers act on the page as a user would and read the
records the daemon wrote. Screenshots go to ``test-artifacts/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from recordstore.keys import new_tid
from testbed.fakemodel import FakeModel
from testbed.ports import free_port
from testbed.processes import stop
from tests.support.cli import TURND, clean_env, me_config, wait_healthy
from turns.tls import tls_context

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
TOKEN = "web-test-token-0123456789"
PASSWORD = "web-test-password-0123"
HANDLE = "me.test"
TEXT = "network.sharedcomputer.chat.defs#textPart"
MESSAGE = "network.sharedcomputer.chat.message"


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


@contextmanager
def turnd_serve(
    work: Path,
    fake: FakeModel,
    rate: int = 1000,
    extra: str = "",
    turns: dict[str, Any] | None = None,
) -> Iterator[str]:
    """A real ``turnd serve`` subprocess on a free port; yields its URL. ``extra`` is TOML
    appended to the config (new tables only); ``turns`` overrides ``[turns]`` keys (None:
    leave the key out, for its default)."""
    port = free_port()
    # No retries and no titles unless a test asks: they would take the fake's replies.
    turn_keys = {"ratePerMinute": rate, "retries": 0, "titleModel": "", **(turns or {})}
    turns_toml = "\n".join(
        f"{k} = {json.dumps(v)}" for k, v in turn_keys.items() if v is not None
    )
    providers = f"""[providers.fake]
base_url = "{fake.base_url}"
api_key_env = "FAKE_KEY"
models = ["fake-model", "fake-large"]
[plugins]
enabled = ["plugins.clock:plugin"]  # by module path: works without installed entry points
"""
    conf = me_config(
        work, port, default="fake:fake-model", providers=providers, turns=f"[turns]\n{turns_toml}"
    )
    conf.write_text(conf.read_text() + extra)
    env = clean_env(FAKE_KEY="sk-fake-123456", ME_PASSWORD=PASSWORD, ME_TOKEN=TOKEN)
    with (work / "serve.out").open("wb") as out, (work / "serve.err").open("wb") as err:
        proc = subprocess.Popen(
            [TURND, "serve", "--config", str(conf)], cwd=work, env=env, stdout=out, stderr=err
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=60)  # a deadline: a loaded machine starts it slowly
        yield url
    finally:
        stop(proc, 40)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium "
            "(apt-get install -y chromium chromium-driver), as .ci/run does"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[test]'")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def open_page(browser: Any, url: str) -> Iterator[Any]:
    context = browser.new_context(
        base_url=url, viewport={"width": 1200, "height": 800}, reduced_motion="reduce"
    )
    context.set_default_timeout(10_000)
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(str(e)))
    pg.on(
        "response",
        lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    pg.problems = problems
    pg.goto("/")
    sign_in(pg)
    yield pg
    context.close()
    # No CSP violation, no script error, no failed request.
    assert not problems, problems


@pytest.fixture
def api(daemon: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=daemon, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10, verify=tls_context()
    ) as client:
        yield client


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def sign_in(page: Any) -> None:
    page.get_by_label("API token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#app").wait_for(state="visible")


def send(page: Any, text: str) -> None:
    box = page.get_by_label("Message", exact=True)
    box.fill(text)
    box.press("Enter")


def reply_to(page: Any, text: str) -> Any:
    """The reply shown right after the user message whose text is exactly ``text``."""
    exact = re.compile(f"^{re.escape(text)}$")
    user = page.locator("li.message.user", has=page.locator(".plain", has_text=exact))
    user.wait_for()
    return user.locator("xpath=following-sibling::li[1]")


def direct_write(url: str, skey: str, parent: str, text: str, **generation: Any) -> str:
    """A user message written through XRPC, as a stock atproto client would; its key."""
    with httpx.Client(base_url=url, timeout=10, verify=tls_context()) as xrpc:
        session = xrpc.post(
            "/xrpc/com.atproto.server.createSession",
            json={"identifier": HANDLE, "password": PASSWORD},
        ).json()
        key = new_tid()
        created = xrpc.post(
            "/xrpc/com.atproto.repo.createRecord",
            headers={"Authorization": f"Bearer {session['accessJwt']}"},
            json={
                "repo": session["did"],
                "collection": MESSAGE,
                "rkey": f"{skey}:{key}",
                "record": {
                    "$type": MESSAGE,
                    "role": "user",
                    "parent": parent,
                    "content": {
                        "$type": "network.sharedcomputer.chat.defs#plainContent",
                        "parts": [{"$type": TEXT, "text": text}],
                    },
                    "generation": generation,
                    "createdAt": "2025-01-01T00:00:00.000Z",
                },
            },
        )
        assert created.status_code == 200, created.text
    return key


def replies(page: Any) -> Any:
    return page.locator("li.message.reply")


def last_reply(page: Any) -> Any:
    return replies(page).last


def wait_status(reply: Any, status: str, timeout: float = 15_000) -> None:
    from playwright.sync_api import expect

    expect(reply).to_have_attribute("data-status", status, timeout=timeout)


def current_skey(page: Any) -> str:
    found = re.search(r"#c=(\w+)", page.url)
    assert found, page.url
    return found.group(1)


def record(api: httpx.Client, skey: str, key: str) -> dict[str, Any]:
    messages = api.get(f"/api/conversations/{skey}").json()["messages"]
    return next(m["value"] for m in messages if m["key"] == key)


def reply_text(value: dict[str, Any]) -> str:
    return "".join(p["text"] for p in value["content"]["parts"] if p["$type"] == TEXT)
