"""The page's trace lines, generated titles and event streams (SPEC §16, §17), in Chromium.

Same harness as ``tests/test_web_browser.py`` (a real ``turnd serve`` subprocess, the
fake model server, Debian's Chromium through Playwright; each test fails on a console
error, a CSP violation or an HTTP status >= 400), with a daemon that retries (the fake
answers 429 first), generates titles (the fake answers the title request) and has a
small context window on one model. Screenshots go to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.fakemodel import FakeModel, Reply
from tests.support.browser import browser as browser  # noqa: F401 - the shared fixture
from tests.support.browser import (
    current_skey,
    last_user_text,
    open_page,
    reply_to,
    send,
    shot,
    turnd_serve,
    wait_status,
)

pytestmark = pytest.mark.browser

TITLE = "Trip to Oslo"
LONG = " ".join(["lorem ipsum dolor"] * 50)  # ~900 bytes: two of these overflow the small window
# Counts every fetch the page starts and every event its event streams deliver (test
# instrumentation, injected before the page's own script): a poll would show up as a
# fetch that no event came before.
COUNT_FETCHES = """
(() => {
  const real = window.fetch;
  window.__fetches = [];
  window.__events = 0;
  window.fetch = async (input, init) => {
    const url = String(input && input.url ? input.url : input);
    window.__fetches.push(url);
    const res = await real(input, init);
    if (!url.includes('/events') || !res.body) return res;
    const [mine, theirs] = res.body.tee();
    (async () => {
      const reader = theirs.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        window.__events += (value.match(/^event:/gm) || []).length;
      }
    })().catch(() => {});
    return new Response(mine, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
})();
"""


class Script:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def __call__(self, request: dict[str, Any]) -> Reply:
        messages = request.get("messages", [])
        first = messages[0] if messages else {}
        if first.get("role") == "system" and str(first.get("content", "")).startswith(
            "Write a short title"
        ):
            # turnd's title request (SPEC §15); Markdown the page must not show raw.
            return Reply.text([f"**{TITLE}**"])
        text = last_user_text(messages)
        with self.lock:
            n = self.counts[text] = self.counts.get(text, 0) + 1
        if text.startswith("retry") and n == 1:
            return Reply.error(429, "slow down", type="rate_limit_error",
                               headers={"retry-after-ms": "300"})
        if text.startswith("context"):
            return Reply.text(["Fitted ", "answer."]).delayed(ttft=0.3)
        return Reply.text([f"Answer {n} ", f"to {text.split(' ')[0]}."]).delayed(ttft=0.2)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The small window is on fake-large only; titles and retries are the daemon's.
    extra = """
[providers.fake.model."fake-large"]
context = 450
"""
    turns = {"retries": 1, "replyReserveTokens": 0, "titleModel": None}  # None: the default
    with (
        FakeModel(responder=Script()) as fake,
        turnd_serve(tmp_path_factory.mktemp("traces"), fake, extra=extra, turns=turns) as url,
    ):
        yield url


@pytest.fixture
def page(browser: Any, daemon: str) -> Iterator[Any]:  # noqa: F811
    with open_page(browser, daemon) as pg:
        yield pg


def trace(reply: Any, kind: str) -> Any:
    return reply.locator(f"details.trace-{kind}")


def test_a_retry_is_a_collapsed_trace_line(page: Any) -> None:
    send(page, "retry this one")
    reply = reply_to(page, "retry this one")
    wait_status(reply, "complete")
    line = trace(reply, "retry")
    line.wait_for()
    summary = line.locator("summary").inner_text()
    assert "Retry 1 of step 1" in summary and "429" in summary and "0.3 s" in summary
    assert line.get_attribute("open") is None  # collapsed until asked
    line.locator("summary").click()
    detail = line.locator("pre").inner_text()
    assert '"attempt": 1' in detail and '"waitSeconds": 0.3' in detail
    assert trace(reply, "step").count() == 1  # one step, retried inside
    assert reply.locator(".markdown").inner_text().strip() == "Answer 2 to retry."
    shot(page, "40-trace-retry")
    # The events were the stream's; this tab kept them, so a reload still shows the lines.
    key = reply.get_attribute("data-key")
    page.reload()
    kept = page.locator(f'li.reply[data-key="{key}"]')
    trace(kept, "retry").wait_for()
    assert "Retry 1 of step 1" in trace(kept, "retry").locator("summary").inner_text()
    assert trace(kept, "step").count() == 1


def test_a_fitted_context_is_a_trace_line(page: Any) -> None:
    page.locator("#model").select_option("fake:fake-large")  # the model with a small window
    send(page, f"context one {LONG}")
    first = reply_to(page, f"context one {LONG}")
    wait_status(first, "complete")
    assert trace(first, "context").count() == 0  # the first message alone fits
    send(page, f"context two {LONG}")
    reply = reply_to(page, f"context two {LONG}")
    wait_status(reply, "complete")
    line = trace(reply, "context")
    line.wait_for()
    # The first question was left out (its short answer fits); the newest message never is.
    assert line.locator("summary").inner_text() == (
        "Context: 1 earlier message left out to fit the model's window"
    )
    line.locator("summary").click()
    assert '"dropped": 1' in line.locator("pre").inner_text()
    assert '"summarized": false' in line.locator("pre").inner_text()
    shot(page, "41-trace-context")
    page.set_viewport_size({"width": 390, "height": 844})
    line.scroll_into_view_if_needed()
    shot(page, "42-phone-trace-context")


def test_a_generated_title_arrives_on_the_account_stream_without_polling(
    page: Any, browser: Any, daemon: str
) -> None:
    # A fake clock and a fetch counter, from the first script on: time can then be run
    # ahead to show that nothing asks the server again on its own.
    page.context.clock.install()
    page.context.add_init_script(COUNT_FETCHES)
    page.reload()
    page.locator("#app").wait_for(state="visible")
    marker = page.evaluate("() => (window.__loadedOnce = performance.timeOrigin)")
    send(page, "plan a trip to Oslo")
    wait_status(reply_to(page, "plan a trip to Oslo"), "complete")
    skey = current_skey(page)
    item = page.locator(f'.conversation[data-skey="{skey}"] .title')
    from playwright.sync_api import expect

    # The title appears in the list and the header: no reload, no Markdown stars.
    expect(item).to_have_text(TITLE)
    expect(page.locator("#conv-title")).to_have_text(TITLE)
    assert page.evaluate("() => window.__loadedOnce") == marker  # the same document
    fetches = page.evaluate("() => window.__fetches")
    assert any(u.endswith("/api/events") for u in fetches), fetches
    assert any(u.endswith(f"/api/conversations/{skey}/events") for u in fetches), fetches
    shot(page, "43-generated-title")

    # Quiet now: ten minutes of page time pass and the page starts no request at all.
    # First a few seconds of page time let the reads that events already asked for run
    # (they wait 60-150 ms to coalesce a burst); an event still arriving meanwhile (the
    # list's touch after the title) starts the round again, a few times at most.
    for _ in range(5):
        events = page.evaluate("() => window.__events")
        page.clock.run_for(5000)
        before = page.evaluate("() => window.__fetches.length")
        page.clock.run_for(10 * 60 * 1000)
        page.evaluate("() => new Promise((resolve) => setTimeout(resolve, 0))")
        after = page.evaluate("(n) => window.__fetches.slice(n)", before)
        if page.evaluate("() => window.__events") == events:
            break
    assert after == [], after
    page.set_viewport_size({"width": 390, "height": 844})
    page.get_by_role("button", name="Conversations").click()
    shot(page, "44-phone-generated-title")
    page.keyboard.press("Escape")
