"""turns.generate: what reaches a record of a failure (scrub)."""

from __future__ import annotations

from turns.generate import MAX_ERROR, scrub

# Neither shaped like an OpenAI key nor like a bearer header: only the configured-secret
# path can remove it.
CONFIGURED = "key-SeCrEt-7f3a9b2c4d5e6f708192a3b4"


def test_configured_secrets_are_removed_whatever_their_shape() -> None:
    text = scrub(f"upstream said: key={CONFIGURED} denied", [CONFIGURED])
    assert CONFIGURED not in text and text == "upstream said: key=[redacted] denied"


def test_key_shaped_strings_are_removed_even_when_not_configured() -> None:
    # A key of another provider, or one the config does not know: no configured secret.
    text = scrub("bad key sk-proj-AbC123xyz_-99 and Authorization: Bearer abc.def.ghi used", [])
    assert "sk-proj" not in text and "abc.def.ghi" not in text
    assert text == "bad key [redacted] and Authorization: [redacted] used"


def test_both_at_once_and_empty_secrets_ignored() -> None:
    text = scrub(f"{CONFIGURED} then sk-live-0123456789", ["", CONFIGURED])
    assert text == "[redacted] then [redacted]"


def test_plain_text_is_kept_and_long_text_cut() -> None:
    assert scrub("429 Too Many Requests", ["x" * 20]) == "429 Too Many Requests"
    long = scrub("e" * 5000, [])
    assert len(long) == MAX_ERROR and long.endswith("…")
