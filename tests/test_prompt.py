"""turns.prompt: the branch, and the instructions with the date in the user's zone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from turns.prompt import branch, instructions, user_zone
from turns.settings import TurnSettings


def msg(role: str, parent: str | None = None, text: str = "") -> dict[str, Any]:
    value: dict[str, Any] = {"role": role, "text": text}
    if parent:
        value["parent"] = parent
    return value


def test_the_branch_runs_from_the_root_to_the_message_without_siblings() -> None:
    messages = {
        "u1": msg("user", text="q1"),
        "u1.r0": msg("assistant", "u1", "r1"),
        "u2": msg("user", "u1.r0", "q2"),
        "u2b": msg("user", "u1.r0", "q2 edited"),  # a sibling (an edit)
        "u3": msg("user", None, "another root"),
        "u2b.r0": msg("assistant", "u2b", "edited answer"),
    }
    assert [m["text"] for m in branch(messages, "u2")] == ["q1", "r1", "q2"]
    assert [m["text"] for m in branch(messages, "u2b.r0")] == ["q1", "r1", "q2 edited", "edited answer"]
    assert [m["text"] for m in branch(messages, "u3")] == ["another root"]


def test_a_parent_loop_or_a_missing_parent_ends_the_branch() -> None:
    loop = {"a": msg("user", "b", "a"), "b": msg("user", "a", "b")}
    assert [m["text"] for m in branch(loop, "a")] == ["b", "a"]
    assert [m["text"] for m in branch({"a": msg("user", "gone", "a")}, "a")] == ["a"]
    assert branch({}, "missing") == []


SETTINGS = TurnSettings(system_prompt="{{appName}} | {{date}} | {{time}} | {{timezone}}")
# 11:30 UTC on a Sunday: already Monday 01:30 in Kiritimati (UTC+14), still Sunday in UTC.
NOW = datetime(2026, 3, 1, 11, 30, tzinfo=UTC)


def test_date_and_time_are_in_the_users_zone() -> None:
    text = instructions(SETTINGS, {"timezone": "Pacific/Kiritimati"}, None, now=NOW)
    assert text == "turnd | Monday, 02 March 2026 | 01:30 | Pacific/Kiritimati"


def test_the_time_is_filled_in_to_the_minute() -> None:
    # Filled once a minute and zone (turns.prompt._filled): the last second of a minute
    # still shows it, the next minute's first shows the next.
    late = NOW.replace(second=59, microsecond=999_999)
    assert instructions(SETTINGS, None, None, now=late).split(" | ")[2] == "11:30"
    next_minute = NOW.replace(minute=31)
    assert instructions(SETTINGS, None, None, now=next_minute).split(" | ")[2] == "11:31"
    midnight = datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)
    assert instructions(SETTINGS, None, None, now=midnight).split(" | ")[1] == "Sunday, 01 March 2026"
    after = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
    assert instructions(SETTINGS, None, None, now=after).split(" | ")[1] == "Monday, 02 March 2026"


@pytest.mark.parametrize("prefs", [None, {}, {"timezone": "Not/AZone"}, {"timezone": ""}])
def test_an_unknown_or_missing_zone_falls_back_to_utc(prefs: dict[str, Any] | None) -> None:
    assert instructions(SETTINGS, prefs, None, now=NOW) == "turnd | Sunday, 01 March 2026 | 11:30 | UTC"
    assert user_zone(prefs).key == "UTC"


def test_base_prompt_then_custom_instructions_then_the_conversations_prompt() -> None:
    settings = TurnSettings(system_prompt="BASE")
    text = instructions(settings, {"customInstructions": "CUSTOM"}, {"systemPrompt": "CONV"}, now=NOW)
    assert text == "BASE\n\nCUSTOM\n\nCONV"
    # Blank pieces are left out, not joined as empty paragraphs.
    assert instructions(settings, {"customInstructions": "  "}, {}, now=NOW) == "BASE"
