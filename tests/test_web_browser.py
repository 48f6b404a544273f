"""The built-in web chat page in a real browser (issue 8).

Playwright for Python drives Debian's Chromium (``/usr/bin/chromium``) against a real
``turnd serve`` subprocess whose only provider is the fake model server, all on
loopback. Each test chats through the page as a user would and checks what it shows
against the records the daemon wrote. Screenshots of the main states go to
``test-artifacts/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.fakemodel import FakeModel, Reply, ToolCall
from tests.support.browser import (
    TOKEN,
    current_skey,
    direct_write,
    last_reply,
    last_user_text,
    open_page,
    record,
    reply_text,
    reply_to,
    send,
    shot,
    sign_in,
    turnd_serve,
    wait_status,
)
from tests.support.browser import api as api  # noqa: F401 - the shared fixture
from tests.support.browser import browser as browser  # noqa: F401 - the shared fixture
from turns.tls import tls_context

pytestmark = pytest.mark.browser

SLOW_WORDS = [f"w{i:02d} " for i in range(40)]


# -- the fake model's script: the last user message picks the reply ---------------------------


class Script:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Reply:
        text = last_user_text(request.get("messages", []))
        with self.lock:
            n = self.counts[text] = self.counts.get(text, 0) + 1
        if text.startswith("slow"):
            return Reply.text(SLOW_WORDS).delayed(chunk_delay=0.12)
        if text.startswith("stall"):
            return Reply.text(["Starting to ", "answer", " and never ending"]).stall(2)
        if text.startswith("flaky") and n == 1:
            return Reply.error(500, "upstream exploded")
        if text.startswith("what time"):
            if not any(m.get("role") == "tool" for m in request.get("messages", [])):
                return Reply.tool_calls(ToolCall("clock", {"timezone": "UTC"}, id="call_1"))
            return Reply.text(["It is ", "late."])
        if text.startswith("think"):
            return Reply.reasoning(["Let me ", "think."], ["The **answer** ", "is 42."])
        if text.startswith("sources"):
            # SPEC §12: sourceParts whose URLs must not become links, next to one that may.
            cites = [
                {"type": "url_citation", "url_citation": {"url": url, "title": title}}
                for url, title in (
                    ("javascript:alert(document.domain)", "script"),
                    ("data:text/html,<script>alert(1)</script>", "data"),
                    ("https://example.invalid/ok", "fine"),
                )
            ]
            return Reply.text(["See [bad](javascript:alert(1)) and the sources."]).with_extra(
                delta={"annotations": cites}
            )
        if text.startswith("markdown"):
            return Reply.text(
                ["# Title\n\nSome *emphasis*, `code`, <b>raw</b>, ",
                 "![a cat](http://example.invalid/cat.png) and [a link](https://example.invalid)."]
            )
        return Reply.text([f"Answer {n} ", f"to {text}."]).delayed(chunk_delay=0.05)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(responder=Script()) as model:
        yield model


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, fake: FakeModel) -> Iterator[str]:
    with turnd_serve(tmp_path_factory.mktemp("web"), fake) as url:
        yield url


@pytest.fixture
def page(browser: Any, daemon: str) -> Iterator[Any]:
    with open_page(browser, daemon) as pg:
        yield pg


# -- tests ------------------------------------------------------------------------------------


def test_page_headers_and_sign_in(daemon: str, browser: Any) -> None:
    r = httpx.get(f"{daemon}/", verify=tls_context())
    assert r.status_code == 200 and "<title>turnd</title>" in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "connect-src 'self'" in csp and "img-src 'self' data: blob:" in csp
    assert "unsafe-inline" not in csp
    assert httpx.get(f"{daemon}/app.js", verify=tls_context()).headers["content-security-policy"] == csp
    assert httpx.get(f"{daemon}/api/models", verify=tls_context()).status_code == 401

    context = browser.new_context(base_url=daemon)
    page = context.new_page()
    page.goto("/")
    page.get_by_label("API token").fill("wrong-token")
    page.get_by_role("button", name="Sign in").click()
    from playwright.sync_api import expect

    expect(page.locator("#signin-error")).to_contain_text("not valid")
    shot(page, "01-sign-in")
    sign_in(page)
    # The token is in local storage, never in the URL; a reload stays signed in.
    assert TOKEN not in page.url
    assert page.evaluate("localStorage.getItem('turnd.token')") == TOKEN
    page.reload()
    page.locator("#app").wait_for(state="visible")
    options = page.locator("#model option").all_text_contents()
    assert any("echo (built-in test provider)" in o for o in options)
    assert any("fake-large" in o for o in options)
    context.close()


def test_send_and_stream_with_markdown(page: Any, api: httpx.Client) -> None:
    send(page, "hello there")
    reply = reply_to(page, "hello there")
    wait_status(reply, "complete")
    assert reply.locator(".markdown").inner_text().strip() == "Answer 1 to hello there."
    assert "fake:fake-model" in reply.locator(".meta").inner_text()
    assert "tokens" in reply.locator(".meta").inner_text()
    # The conversation list shows it, newest first.
    skey = current_skey(page)
    assert page.locator(".conversation").first.get_attribute("data-skey") == skey

    send(page, "markdown please")
    reply = reply_to(page, "markdown please")
    wait_status(reply, "complete")
    md = reply.locator(".markdown")
    md.locator("h1").wait_for()
    assert md.locator("h1").inner_text() == "Title"
    assert md.locator("em").inner_text() == "emphasis"
    assert md.locator("b").count() == 0 and "<b>raw</b>" in md.inner_text()
    assert md.locator("img").count() == 0  # images only on click: a link
    image = md.locator("a.md-image")
    assert image.get_attribute("href") == "http://example.invalid/cat.png"

    send(page, "think about it")
    reply = reply_to(page, "think about it")
    wait_status(reply, "complete")
    reasoning = reply.locator("details.reasoning")
    assert reasoning.get_attribute("open") is None  # collapsed
    reasoning.locator("summary").click()
    assert reasoning.locator(".plain").inner_text() == "Let me think."
    assert reply.locator(".markdown strong").inner_text() == "answer"
    shot(page, "02-conversation")

    page.emulate_media(color_scheme="dark")
    shot(page, "03-conversation-dark")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "04-phone")
    page.get_by_role("button", name="Conversations").click()
    shot(page, "05-phone-menu")
    page.keyboard.press("Escape")


def test_links_open_only_http_https_mailto(page: Any) -> None:
    send(page, "sources please")
    reply = reply_to(page, "sources please")
    wait_status(reply, "complete")
    reply.locator("a", has_text="fine").wait_for()
    hrefs = [a.get_attribute("href") or "" for a in reply.locator("a").all()]
    assert "https://example.invalid/ok" in hrefs
    assert not [h for h in hrefs if not h.startswith(("http:", "https:", "mailto:"))], hrefs
    # The refused ones are still shown, as text.
    assert reply.locator(".source-unsafe").count() == 2
    assert "javascript:alert(1)" in reply.locator(".markdown").inner_text()


def test_reload_mid_stream_resumes_without_gap_or_repeat(page: Any, api: httpx.Client) -> None:
    resumed_from: list[str] = []
    page.on(
        "request",
        lambda r: resumed_from.append(r.headers.get("last-event-id", ""))
        if r.url.endswith("/stream")
        else None,
    )
    send(page, "slow story")
    reply = reply_to(page, "slow story")
    # Wait for a few words, then reload in the middle of the stream.
    page.wait_for_function(
        "() => (document.querySelector('li.reply .plain')?.textContent || '').length > 20"
    )
    shot(page, "06-streaming")
    page.reload()
    page.locator("#app").wait_for(state="visible")
    reply = last_reply(page)
    final_text = "".join(SLOW_WORDS)
    samples = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # Status and text read in one step: read one after the other, the reply could
        # finish in between, its plain text replaced by the rendered Markdown, and the
        # text read then waited 10 s for a `.plain` that was gone.
        status, text = reply.evaluate(
            "li => [li.dataset.status, li.querySelector('.plain')?.textContent ?? null]"
        )
        if status == "complete":
            break
        if status == "pending" and text is not None:
            samples.append(text)
        time.sleep(0.05)
    wait_status(reply, "complete")
    # Every text shown while streaming was a prefix of the final text: nothing repeated,
    # nothing skipped; and the streamed text is exactly the record's.
    assert samples, "saw no streamed text after the reload"
    assert all(final_text.startswith(s) for s in samples), samples
    skey = current_skey(page)
    key = reply.get_attribute("data-key")
    value = record(api, skey, key)
    assert reply_text(value) == final_text
    assert reply.get_attribute("data-stream-text") == final_text
    assert reply.locator(".markdown").inner_text().strip() == final_text.strip()
    # The reloaded page resumed after the events it had seen, not from the start.
    assert any(v not in ("", "0") for v in resumed_from), resumed_from
    # The step line seen before the reload is still there, once (kept by the tab, not re-sent).
    assert reply.locator("details.trace-step").count() == 1


def test_regenerate_and_switch_attempts(page: Any, api: httpx.Client) -> None:
    send(page, "pick a number")
    reply = reply_to(page, "pick a number")
    wait_status(reply, "complete")
    first = reply.locator(".markdown").inner_text().strip()
    assert first.startswith("Answer ")
    reply.get_by_role("button", name="Regenerate").click()
    page.locator("li.reply .nav .count", has_text="2/2").wait_for()
    reply = last_reply(page)
    wait_status(reply, "complete")
    second = reply.locator(".markdown").inner_text().strip()
    assert second != first and reply.get_attribute("data-key").endswith(".r1")
    shot(page, "07-regenerated")
    reply.get_by_role("button", name="Previous attempt").click()
    page.locator("li.reply .nav .count", has_text="1/2").wait_for()
    assert last_reply(page).locator(".markdown").inner_text().strip() == first
    assert last_reply(page).get_attribute("data-key").endswith(".r0")
    # Keyboard: focus stays on the switcher, so Enter on "next" goes back.
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.locator("li.reply .nav .count", has_text="2/2").wait_for()
    assert last_reply(page).locator(".markdown").inner_text().strip() == second


def test_edit_makes_a_switchable_branch(page: Any, api: httpx.Client) -> None:
    send(page, "first question")
    wait_status(reply_to(page, "first question"), "complete")
    send(page, "follow up")
    wait_status(reply_to(page, "follow up"), "complete")
    user = page.locator("li.message.user").last
    user.get_by_role("button", name="Edit").click()
    editor = page.get_by_label("Edit message")
    editor.fill("follow up, edited")
    editor.press("Enter")
    page.locator("li.user .nav .count", has_text="2/2").wait_for()
    wait_status(reply_to(page, "follow up, edited"), "complete")
    assert "follow up, edited" in page.locator("li.message.user").last.inner_text()
    assert "to follow up, edited." in last_reply(page).inner_text()
    assert page.locator("li.message").count() == 4  # root -> reply -> edited -> reply
    shot(page, "08-edited-branch")
    page.get_by_role("button", name="Previous version").click()
    page.locator("li.user .nav .count", has_text="1/2").wait_for()
    assert "to follow up." in last_reply(page).inner_text()
    # Both branches share the root; the records say so.
    skey = current_skey(page)
    messages = api.get(f"/api/conversations/{skey}").json()["messages"]
    users = [m for m in messages if m["value"]["role"] == "user"]
    assert len(users) == 3 and users[1]["value"]["parent"] == users[2]["value"]["parent"]


def test_cancel_while_streaming(page: Any, api: httpx.Client) -> None:
    send(page, "stall forever")
    reply = reply_to(page, "stall forever")
    reply.locator(".plain", has_text="Starting to").wait_for()
    assert page.locator("#send").is_disabled()
    shot(page, "09-before-cancel")
    page.keyboard.press("Escape")  # Escape cancels the running reply
    wait_status(reply, "cancelled")
    assert "Starting to" in reply.inner_text()
    value = record(api, current_skey(page), reply.get_attribute("data-key"))
    assert value["status"] == "cancelled"
    assert page.locator("#send").is_enabled()
    shot(page, "10-cancelled")


def test_error_reply_and_retry(page: Any, api: httpx.Client) -> None:
    send(page, "flaky request")
    reply = reply_to(page, "flaky request")
    wait_status(reply, "error")
    alert = reply.get_by_role("alert")
    assert "Error" in alert.inner_text()
    # One way to ask again: Retry, no Regenerate beside it.
    assert reply.get_by_role("button", name="Regenerate").count() == 0
    shot(page, "11-error")
    alert.get_by_role("button", name="Retry").click()
    page.locator("li.reply .nav .count", has_text="2/2").wait_for()
    reply = last_reply(page)
    wait_status(reply, "complete")
    assert "to flaky request." in reply.inner_text()
    assert record(api, current_skey(page), reply.get_attribute("data-key"))["status"] == "complete"


def test_direct_write_reply_appears_live(page: Any, api: httpx.Client, daemon: str) -> None:
    send(page, "start here")
    wait_status(reply_to(page, "start here"), "complete")
    skey = current_skey(page)
    parent = last_reply(page).get_attribute("data-key")
    # Another client writes a user message through XRPC, as a stock atproto client would.
    key = direct_write(daemon, skey, parent, "slow from another client")
    # No reload: the page picks it up and follows the reply's stream.
    page.locator("li.message.user", has_text="slow from another client").wait_for()
    reply = page.locator(f'li.reply[data-key="{key}.r0"]')
    reply.wait_for()
    wait_status(reply, "complete", timeout=20_000)
    assert reply_text(record(api, skey, f"{key}.r0")) == "".join(SLOW_WORDS)
    assert reply.locator(".markdown").inner_text().strip() == "".join(SLOW_WORDS).strip()
    shot(page, "12-direct-write")


def test_attachment_and_keyboard_newline(page: Any, tmp_path: Path) -> None:
    note = tmp_path / "notes.txt"
    note.write_text("remember the milk")
    page.locator("#file").set_input_files(str(note))
    page.locator("#attachments li", has_text="notes.txt").wait_for()
    box = page.get_by_label("Message", exact=True)
    box.fill("line one")
    box.press("Shift+Enter")
    box.type("line two")
    assert box.input_value() == "line one\nline two"
    box.press("Enter")
    user = page.locator("li.message.user").last
    user.locator(".chip", has_text="notes.txt").wait_for()
    assert "line one\nline two" in user.inner_text()
    wait_status(last_reply(page), "complete")
    assert page.locator("#attachments li").count() == 0
    shot(page, "13-attachment")


def test_tool_call_and_result_cards(page: Any, daemon: str) -> None:
    send(page, "warm up")
    wait_status(reply_to(page, "warm up"), "complete")
    skey = current_skey(page)
    parent = last_reply(page).get_attribute("data-key")
    # The page has no tool picker: a direct client asks for the clock tool.
    key = direct_write(daemon, skey, parent, "what time is it?", tools=["clock"])
    reply = page.locator(f'li.reply[data-key="{key}.r0"]')
    wait_status(reply, "complete", timeout=20_000)
    call = reply.locator("details.tool-call")
    result = reply.locator("details.tool-result")
    assert call.get_attribute("open") is None and result.get_attribute("open") is None
    assert "clock" in call.locator("summary").inner_text()
    call.locator("summary").click()
    assert '"timezone": "UTC"' in call.locator("pre").inner_text()
    result.locator("summary").click()
    assert '"timezone"' in result.locator("pre").inner_text()
    assert reply.locator(".markdown").inner_text().strip() == "It is late."
    shot(page, "14-tool-cards")


def test_queued_while_rate_limited_then_cancelled(
    browser: Any, fake: FakeModel, tmp_path: Path
) -> None:
    with turnd_serve(tmp_path, fake, rate=1) as url, open_page(browser, url) as page:
        send(page, "hello once")
        wait_status(reply_to(page, "hello once"), "complete")
        send(page, "hello twice")  # over one turn a minute: it waits, unclaimed
        reply = reply_to(page, "hello twice")
        wait_status(reply, "queued")
        assert "Queued" in reply.inner_text()
        shot(page, "15-queued")
        from playwright.sync_api import expect

        cancel = page.get_by_role("button", name="Cancel")
        expect(cancel).to_have_count(1)  # one Cancel on the screen: the composer's
        assert not page.locator("#send").is_visible()  # it stands where Send was
        cancel.click()
        wait_status(reply, "cancelled")


def test_second_tab_follows_the_same_stream(page: Any, api: httpx.Client) -> None:
    send(page, "warm up too")
    wait_status(reply_to(page, "warm up too"), "complete")
    other = page.context.new_page()  # same browser profile: same token, another tab
    other.goto(f"/#c={current_skey(page)}")
    reply_to(other, "warm up too").wait_for()
    send(page, "slow for two tabs")
    first, second = reply_to(page, "slow for two tabs"), reply_to(other, "slow for two tabs")
    second.locator(".plain").first.wait_for()  # streaming there too, before it is done
    assert second.get_attribute("data-status") == "pending"
    wait_status(first, "complete")
    wait_status(second, "complete")
    final_text = "".join(SLOW_WORDS)
    assert first.get_attribute("data-stream-text") == final_text
    assert second.get_attribute("data-stream-text") == final_text
    other.close()
