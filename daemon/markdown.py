"""Markdown -> safe HTML for the page (markdown-it-py), importable on its own.

The render runs in worker processes (:mod:`daemon.render`), which import this
module and nothing of the server. Fenced code with a language Pygments knows is
highlighted here, on the server, as ``<span class="...">`` tokens that the page's
``highlight.css`` colours (no inline styles: the page's CSP has no ``unsafe-inline``),
so the page needs no JavaScript highlighter. Raw HTML is off, images are never loaded (each
becomes a link to open on purpose), and a link opens only ``http:``, ``https:``
or ``mailto:`` (SPEC §12); anything else is shown as text.
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

__all__ = ["SAFE_SCHEMES", "highlight_code", "render_markdown", "render_many", "safe_url"]

SAFE_SCHEMES = frozenset({"http", "https", "mailto"})


def safe_url(url: str) -> bool:
    """An absolute http(s)/mailto URL, or a relative one (which stays on this origin)."""
    try:
        scheme = urlsplit(url.strip()).scheme.lower()
    except ValueError:
        return False
    return scheme in SAFE_SCHEMES or (scheme == "" and not url.strip().startswith("//"))


_FORMATTER = HtmlFormatter(nowrap=True)  # spans only: markdown-it writes the <pre><code>
MAX_HIGHLIGHT_CHARS = 200_000  # a bigger block is shown plain (Pygments' time grows with it)


def highlight_code(code: str, lang: str, attrs: str = "") -> str:
    """Pygments' token spans for ``code`` in ``lang``; "" (plain, escaped by markdown-it)
    for an unknown language or none: guessing a language costs more than it shows."""
    name = lang.strip().split()[0] if lang.strip() else ""
    if not name or len(code) > MAX_HIGHLIGHT_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(name)
    except ClassNotFound:
        return ""
    return pygments_highlight(code, lexer, _FORMATTER)


def _markdown() -> MarkdownIt:
    md = MarkdownIt(
        "commonmark",
        {"html": False, "linkify": False, "typographer": False, "highlight": highlight_code},
    )
    md.enable(["table", "strikethrough"])
    md.validateLink = lambda url: safe_url(url)  # type: ignore[method-assign]

    def image(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        # Never fetched by the page: a link the reader may open on purpose.
        token = tokens[idx]
        src = md.normalizeLink(token.attrGet("src") or "")
        alt = "".join(child.content for child in token.children or ()) or "image"
        if not safe_url(src):
            return escape(f"[image: {alt}]")
        return (
            f'<a class="md-image" href="{escape(src)}" target="_blank" '
            f'rel="noopener noreferrer nofollow">{escape(f"Image: {alt}")} (open)</a>'
        )

    def link_open(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("target", "_blank")
        tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
        return renderer.renderToken(tokens, idx, options, env)

    md.add_render_rule("image", image)
    md.add_render_rule("link_open", link_open)
    return md


_MD = _markdown()


def render_markdown(text: str) -> str:
    """Safe HTML for one text part: no raw HTML, no auto-loaded images, safe links only."""
    return _MD.render(text)


def render_many(texts: list[str]) -> list[str]:
    """The worker's entry point: one call per request."""
    return [_MD.render(t) for t in texts]
