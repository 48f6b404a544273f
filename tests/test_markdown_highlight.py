"""Server-side code highlighting in the page's Markdown (SPEC §17): Pygments, no script."""

from __future__ import annotations

from pathlib import Path

from daemon.highlight_css import stylesheet
from daemon.markdown import MAX_HIGHLIGHT_CHARS, render_markdown

WEB = Path(__file__).resolve().parents[1] / "daemon" / "web"


def test_a_known_language_is_highlighted_as_token_spans() -> None:
    html = render_markdown('```python\ndef f():\n    return "<b>"\n```\n')
    assert html.startswith('<pre><code class="language-python">')
    assert '<span class="k">def</span>' in html
    assert "&lt;b&gt;" in html and "<b>" not in html  # still escaped
    assert "style=" not in html  # classes only: the page's CSP has no unsafe-inline


def test_unknown_or_missing_language_stays_plain_and_escaped() -> None:
    for fence in ("```nosuchlanguage\n<i>x</i>\n```\n", "```\n<i>x</i>\n```\n"):
        html = render_markdown(fence)
        assert "<span" not in html and "&lt;i&gt;x&lt;/i&gt;" in html


def test_a_huge_block_is_not_highlighted() -> None:
    code = "x = 1\n" * (MAX_HIGHLIGHT_CHARS // 6 + 10)
    html = render_markdown(f"```python\n{code}```\n")
    assert "<span" not in html and html.count("x = 1") == code.count("x = 1")


def test_the_checked_in_stylesheet_is_what_pygments_writes() -> None:
    assert (WEB / "highlight.css").read_text() == stylesheet()
    assert '<link rel="stylesheet" href="highlight.css">' in (WEB / "index.html").read_text()
