"""SPEC §12 ``POST /api/render`` (probe 4 of issue 12) and safe links in the page.

The probe: ``{"texts": ["[" * 500000, ...]}`` (976 KB) took 13.1 s on the event loop
and ``/healthz`` waited with it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from daemon.markdown import render_markdown, safe_url
from testbed.fakemodel import FakeModel
from tests.support.daemon import running_daemon

pytestmark = pytest.mark.anyio


async def test_a_pathological_render_neither_freezes_nor_runs_on(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        order: list[str] = []
        answers: dict[str, object] = {}

        async def render() -> None:
            texts = ["[" * 500_000, "[" * 400_000]
            r = await dm.http.post("/api/render", json={"texts": texts}, timeout=60)
            answers["render"] = (r.status_code, r.json())
            order.append("render")

        async def health() -> None:
            # Asked once the render is surely under way: it must not wait for it.
            await anyio.sleep(0.3)
            r = await dm.http.get("/healthz", timeout=60)
            answers["health"] = r.status_code
            order.append("health")

        async with anyio.create_task_group() as tg:
            tg.start_soon(render)
            tg.start_soon(health)
        assert answers["health"] == 200
        assert order == ["health", "render"]
        status, body = answers["render"]  # type: ignore[misc]
        assert status == 422, body
        assert body["error"] == "TooComplex"  # type: ignore[index]

        # The workers are not stuck on the old request: ordinary renders go on.
        r = await dm.http.post("/api/render", json={"texts": ["**bold** [x](https://a.b)"]})
        assert r.status_code == 200
        assert "<strong>bold</strong>" in r.json()["html"][0]

        # More than 1 MiB of text in all is refused before any rendering.
        r = await dm.http.post("/api/render", json={"texts": ["a" * 600_000, "b" * 600_000]})
        assert r.status_code == 413, r.text


def test_markdown_links_open_only_http_https_mailto() -> None:
    unsafe = [
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "vbscript:x",
        "file:///etc/passwd",
        "ftp://example.com/x",
        "//evil.example/x",
    ]
    for url in unsafe:
        html = render_markdown(f"[a]({url}) ![i]({url})")
        assert "href" not in html, (url, html)
        assert not safe_url(url)
    for url in ("https://example.com/x", "http://example.com", "mailto:a@example.com"):
        assert f'href="{url}"' in render_markdown(f"[a]({url})")
