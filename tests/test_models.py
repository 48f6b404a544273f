"""turns.models: which model and effort a turn uses."""

from __future__ import annotations

from typing import Any

import pytest

from turns.models import choose_effort, choose_model, parse_model, reasoning_effort

DEFAULT = "admin:default-model"


def reply(model_id: str, status: str = "complete") -> dict[str, Any]:
    return {"role": "assistant", "status": status, "model": {"provider": "p", "id": model_id}}


USER = {"role": "user"}


def test_the_request_wins() -> None:
    asked = {"model": {"provider": "p", "id": "asked"}}
    prefs = {"defaultModel": {"provider": "p", "id": "pref"}}
    assert choose_model(asked, [USER, reply("earlier")], prefs, DEFAULT)["id"] == "asked"


def test_then_the_nearest_complete_reply_up_the_branch() -> None:
    branch = [USER, reply("first"), USER, reply("second"), USER]
    assert choose_model({}, branch, None, DEFAULT) == {"provider": "p", "id": "second"}


@pytest.mark.parametrize("status", ["error", "pending", "cancelled"])
def test_replies_that_did_not_complete_are_skipped(status: str) -> None:
    branch = [USER, reply("completed"), USER, reply("failed", status), USER]
    assert choose_model({}, branch, None, DEFAULT)["id"] == "completed"
    # And with no complete reply at all, preferences then the admin default.
    only_failed = [USER, reply("failed", status), USER]
    prefs = {"defaultModel": {"provider": "p", "id": "pref"}}
    assert choose_model({}, only_failed, prefs, DEFAULT)["id"] == "pref"
    assert choose_model({}, only_failed, None, DEFAULT) == {"provider": "admin", "id": "default-model"}


def test_then_preferences_then_the_admin_default() -> None:
    prefs = {"defaultModel": {"provider": "p", "id": "pref"}}
    assert choose_model({}, [USER], prefs, DEFAULT)["id"] == "pref"
    assert choose_model({}, [USER], {}, DEFAULT) == {"provider": "admin", "id": "default-model"}


def test_malformed_model_refs_are_passed_over() -> None:
    bad = {"model": {"provider": "p"}}
    assert choose_model(bad, [USER], {"defaultModel": "p:x"}, DEFAULT)["id"] == "default-model"


def test_parse_model_keeps_colons_in_the_id() -> None:
    assert parse_model("ollama:llama3:8b") == {"provider": "ollama", "id": "llama3:8b"}
    with pytest.raises(ValueError):
        parse_model("no-provider")


def test_effort_request_then_preferences() -> None:
    assert choose_effort({"effort": "high"}, {"defaultEffort": "low"}) == "high"
    assert choose_effort({}, {"defaultEffort": "low"}) == "low"
    assert choose_effort({}, None) is None
    assert reasoning_effort("max") == "high" and reasoning_effort(None) is None
