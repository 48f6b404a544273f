"""``python -m bench.mutants``: break each core behaviour on purpose; the tests must notice.

Each :class:`Mutation` names one behaviour the seed or the spec promises, the code that
does it (a snippet of the source, found by text, not by line number, so it survives code
moving around) and what the snippet becomes, plus the tests that are meant to pin it.
For each mutation the run copies the checkout to a temporary directory once, applies the
change there, runs those tests, and puts the file back. A mutation is **caught** when at
least one of its tests fails, **survived** when they all pass: then the suite claims more
than it checks. A snippet that is no longer found (or found more than once) is reported as
**moved**: the mutation must be updated, it says nothing about the tests.

Before the mutations, the same tests run once unmutated (``--no-baseline`` skips it): a
test that already fails would "catch" everything.

    python -m bench.mutants               # every mutation, then the table
    python -m bench.mutants --list        # the mutations and their tests
    python -m bench.mutants claim-put     # only the named ones

Not part of ``.ci/run`` (several minutes). Exit status 1 when a mutation survived or moved.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TURNS = "tests/test_turns.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    behaviour: str
    path: str
    find: str  # must occur exactly once in `path`
    replace: str  # `{indent}`: the indentation of the line `find` starts on
    tests: tuple[str, ...]  # pytest node ids or files


def _t(name: str, file: str = TURNS) -> str:
    return f"{file}::{name}"


MUTATIONS: list[Mutation] = [
    Mutation(
        "claim-put",
        "the claim is a create-only write (two runners cannot both claim a reply)",
        "turns/turn.py",
        "claimed = await s.store.create_record(a.did, a.skey, MESSAGE, a.reply, self.placeholder)",
        "claimed = await s.store.put_record(a.did, a.skey, MESSAGE, a.reply, self.placeholder)",
        (_t("test_when_web_ui_and_sync_both_notice_a_message_exactly_one_generation_runs"),),
    ),
    Mutation(
        "resume-ignored",
        "Last-Event-ID: a subscriber resumes after the id it last saw",
        "turns/streams.py",
        "index = max(after, 0)",
        "index = 0",
        ("tests/test_streams.py",
         _t("test_the_stream_replays_buffered_events_to_a_late_subscriber_then_sends_live_ones"),
         "tests/test_sse.py::test_resume_with_last_event_id"),
    ),
    Mutation(
        "resume-off-by-one",
        "Last-Event-ID: the event with that id is not sent again",
        "turns/streams.py",
        "index = max(after, 0)",
        "index = max(after - 1, 0)",
        ("tests/test_streams.py",
         _t("test_the_stream_replays_buffered_events_to_a_late_subscriber_then_sends_live_ones")),
    ),
    Mutation(
        "backfill-window-ignored",
        "the backfill window: old unanswered messages start no turn",
        "turns/triggers.py",
        "return age <= backfill_minutes * 60",
        "return True",
        ("tests/test_triggers.py",
         _t("test_old_unanswered_message_seen_during_backfill_does_not_start_a_turn"),
         _t("test_backfill_starts_turns_for_unanswered_messages_newer_than_the_window_not_older")),
    ),
    Mutation(
        "live-must-be-recent",
        "a change seen live starts a turn whatever its createdAt",
        "turns/triggers.py",
        "if not change.live and not _recent(",
        "if not _recent(",
        ("tests/test_triggers.py",
         _t("test_direct_write_with_generation_seen_through_live_sync_starts_a_turn")),
    ),
    Mutation(
        "not-owner-only",
        "only a message by the space's owner (a DID turnd serves) starts a turn",
        "turns/triggers.py",
        'if change.collection != MESSAGE or change.op == "delete" or change.did not in owners:',
        'if change.collection != MESSAGE or change.op == "delete":',
        ("tests/test_triggers.py",
         _t("test_message_authored_by_someone_other_than_the_owner_does_not_start_a_turn")),
    ),
    Mutation(
        "invalid-write-generates",
        "an invalid direct write gets an error reply quoting the validator, no generation",
        "turns/triggers.py",
        "if change.error is not None:",
        "if False:",
        ("tests/test_triggers.py",
         _t("test_an_invalid_direct_write_message_with_a_generation_request_gets_an_error_reply_quoting_the_validation_error")),
    ),
    Mutation(
        "restart-window-ignored",
        "on start-up, only requests younger than the backfill window run again",
        "turns/engine.py",
        "if time.time() - request.requested_at <= window:",
        "if True:",
        (_t("test_on_startup_requested_but_unclaimed_turns_newer_than_the_window_are_retried_older_dropped"),),
    ),
    Mutation(
        "not-interrupted-on-restart",
        "on start-up, our pending replies become error/interrupted",
        "turns/upkeep.py",
        'if record is not None and record.value.get("status") == "pending" and self._mine(record.value):',
        "if False:",
        (_t("test_on_startup_pending_replies_this_server_claimed_are_marked_interrupted_others_left_alone"),),
    ),
    Mutation(
        "others-not-left-alone",
        "on start-up, another daemon's pending placeholder is left alone",
        "turns/upkeep.py",
        'return not isinstance(claim, str) or claim.startswith(self._state.instance_id + ":")',
        "return True",
        (_t("test_on_startup_pending_replies_this_server_claimed_are_marked_interrupted_others_left_alone"),),
    ),
    Mutation(
        "scrub-no-key-pattern",
        "errors lose anything key-shaped (sk-..., Bearer ...), configured or not",
        "turns/generate.py",
        'message = _SECRETISH.sub("[redacted]", message)',
        "pass",
        ("tests/test_generate.py",),
    ),
    Mutation(
        "scrub-no-configured-secret",
        "errors lose every configured provider key, whatever its shape",
        "turns/generate.py",
        'message = message.replace(secret, "[redacted]")',
        "pass",
        ("tests/test_generate.py",),
    ),
    Mutation(
        "provider-errors-keep-keys",
        "a provider's error loses the keys it repeats before a fallback event, span or title event",
        "turns/provider_errors.py",
        'text = text.replace(key, "[redacted]")',
        "pass",
        ("tests/test_provider_errors.py",),
    ),
    Mutation(
        "provider-errors-unnamed",
        "errors about a model provider name it and its base URL (SPEC §17)",
        "turns/provider_errors.py",
        'return text.replace(GENERIC, f"{GENERIC} {where}", 1)',
        "return text",
        ("tests/test_provider_errors.py",),
    ),
    Mutation(
        "send-waits-for-a-failed-title",
        "turnd send stops waiting for a title the daemon says will not come (title-failed)",
        "daemon/send.py",
        'return "title-failed", str(data.get("reason", ""))',
        "pass",
        ("tests/test_provider_errors.py::test_a_failing_title_model_is_named_and_send_does_not_wait_for_its_title",),
    ),
    Mutation(
        "fit-smallest-first",
        "the 900 KB rule moves the largest tool outputs first",
        "turns/fit.py",
        "reverse=True,",
        "reverse=False,",
        ("tests/test_fit.py",
         _t("test_a_final_record_over_900_kb_moves_the_largest_tool_outputs_into_output_blobs")),
    ),
    Mutation(
        "fit-limit-raised",
        "the 900 KB rule applies at 900 KB",
        "turns/fit.py",
        "RECORD_LIMIT = 900_000",
        "RECORD_LIMIT = 2_000_000",
        ("tests/test_fit.py",
         _t("test_a_final_record_over_900_kb_moves_the_largest_tool_outputs_into_output_blobs")),
    ),
    Mutation(
        "prompt-date-in-utc",
        "{{date}} and {{time}} are in the user's zone",
        "turns/prompt.py",
        "local = datetime.fromtimestamp(minute * 60, zone)",
        "local = datetime.fromtimestamp(minute * 60, UTC)",
        ("tests/test_prompt.py",
         _t("test_instructions_start_with_the_base_prompt_with_the_date_in_the_users_zone_falling_back_to_utc")),
    ),
    Mutation(
        "model-from-any-reply",
        "model resolution takes the last *complete* reply up the branch",
        "turns/models.py",
        'if value.get("role") == "assistant" and value.get("status") == "complete":',
        'if value.get("role") == "assistant":',
        ("tests/test_models.py",
         _t("test_model_resolution_follows_request_then_last_completed_reply_then_preferences_then_admin")),
    ),
    Mutation(
        "prompt-whole-tree",
        "the prompt holds only the branch from the root to the message",
        "turns/prompt.py",
        "    chain.reverse()\n    return chain",
        "    return list(messages.values())",
        ("tests/test_prompt.py",
         _t("test_prompt_contains_only_the_branch_with_custom_instructions_and_system_prompt_as_instructions")),
    ),
    Mutation(
        "prompt-keeps-failed-replies",
        "error and pending replies are left out of the prompt",
        "turns/prompt.py",
        'elif role == "assistant" and value.get("status") in ("complete", "cancelled"):',
        'elif role == "assistant":',
        (_t("test_error_and_pending_replies_are_left_out_of_the_prompt_and_cancelled_keep_partial_text"),),
    ),
    Mutation(
        "content-in-state-file",
        "no content server-side: the state file holds references only",
        "turns/turn.py",
        # After the final record, as a "last turn" cache would: only a look at the state
        # file once the turn has finished sees it.
        "record = await self._reply.final(record)",
        "record = await self._reply.final(record)\n"
        "{indent}await s.state.set_cursor('last-turn', str(self.user_message) + str(self.conversation.info))",
        (_t("test_a_turn_reads_the_conversation_from_the_record_store_and_stores_no_content_server_side"),),
    ),
    Mutation(
        "kept-messages-not-refreshed",
        "a long conversation's kept messages are read again where anyone wrote since",
        "turns/message_cache.py",
        "keys, kept.cursor = changed",
        "keys, kept.cursor = set(), changed[1]",
        ("tests/test_message_cache.py",),
    ),
    Mutation(
        "rate-limit-ignored",
        "past the rate limit a turn waits, unclaimed",
        "turns/ratelimit.py",
        "if len(starts) < per_minute and not self._line.held(user):",
        "if True:",
        ("tests/test_ratelimit.py",
         _t("test_past_the_rate_limit_the_turn_waits_unclaimed_and_starts_once_the_limit_allows")),
    ),
    Mutation(
        "platform-headers-sent",
        "a chat call tells the provider nothing of the machine (no SDK platform headers)",
        "turns/models.py",
        "default_headers=NO_PLATFORM_HEADERS,",
        "default_headers=None,",
        (_t("test_a_chat_call_tells_the_provider_nothing_of_the_machine", "tests/test_models.py"),),
    ),
    Mutation(
        "cid-link-taken-as-plain",
        "a record's $link is encoded as a CID link, also on the quick path to its CID",
        "recordstore/cid.py",
        'if len(v) == 1 and ("$link" in v or "$bytes" in v):',
        'if len(v) == 1 and "$bytes" in v:',
        ("tests/test_cid.py",),
    ),
]


# --------------------------------------------------------------------------- running


@dataclass
class Outcome:
    mutation: Mutation
    verdict: str  # caught | SURVIVED | MOVED | ERROR
    failed: list[str]
    seconds: float
    note: str = ""


def _copy_checkout(dest: Path) -> None:
    """The working tree as it is (tracked and untracked files, not ignored ones)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _env(copy: Path) -> dict[str, str]:
    # The copy first on the path: ahead of the editable install's finder (which points at
    # the real checkout), for this process's tests and for the `turnd` they start.
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _pytest(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
           "-o", "addopts=", *tests]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=_env(copy), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -1, out + f"\n[timed out after {timeout:.0f} s]"
    return proc.returncode, proc.stdout + proc.stderr


def _failed(output: str) -> list[str]:
    return sorted({m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", output, re.M)})


def _run_one(copy: Path, m: Mutation, timeout: float) -> Outcome:
    started = time.monotonic()
    path = copy / m.path
    if not path.is_file():
        return Outcome(m, "MOVED", [], 0.0, f"{m.path} no longer exists")
    original = path.read_text()
    count = original.count(m.find)
    if count != 1:
        where = "not found" if count == 0 else f"found {count} times"
        return Outcome(m, "MOVED", [], 0.0, f"snippet {where} in {m.path}: {m.find!r}")
    # `{indent}` in a replacement is the indentation of the line the snippet starts on, so
    # an added line stays valid wherever the code has moved to.
    at = original.index(m.find)
    line_start = original.rfind("\n", 0, at) + 1
    indent = original[line_start:at] if not original[line_start:at].strip() else ""
    path.write_text(original.replace(m.find, m.replace.replace("{indent}", indent)))
    try:
        code, output = _pytest(copy, m.tests, timeout)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - started
    failed = _failed(output)
    if code == 0:
        return Outcome(m, "SURVIVED", [], seconds)
    if failed:
        return Outcome(m, "caught", failed, seconds)
    if code == -1:
        return Outcome(m, "caught", [], seconds, "the tests hung past the timeout")
    tail = output.strip().splitlines()[-3:]
    return Outcome(m, "ERROR", [], seconds, " | ".join(tail))


def _table(outcomes: list[Outcome]) -> str:
    lines = ["| mutation | behaviour | verdict | caught by |", "|---|---|---|---|"]
    for o in outcomes:
        by = ", ".join(f.split("::")[-1] if "::" in f else f for f in o.failed) or o.note
        lines.append(f"| {o.mutation.name} | {o.mutation.behaviour} | {o.verdict} | {by} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mutants", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="run only these mutations")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    p.add_argument("--timeout", type=float, default=600, help="seconds per pytest run")
    args = p.parse_args(argv)

    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        p.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.behaviour}\n    {m.path}: {m.find!r}\n    tests: {' '.join(m.tests)}")
        return 0

    with tempfile.TemporaryDirectory(prefix="turnd-mutants-") as tmp:
        copy = Path(tmp)
        _copy_checkout(copy)
        where = subprocess.run([sys.executable, "-c", "import turns; print(turns.__file__)"],
                               cwd=copy, env=_env(copy), capture_output=True, text=True).stdout
        if not where.startswith(str(copy)):
            print(f"mutants: the copy's code is not the one imported ({where.strip()})")
            return 2
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            print(f"baseline: {len(tests)} test targets, unmutated ...", flush=True)
            code, output = _pytest(copy, tests, args.timeout * 2)
            if code != 0:
                print(output[-4000:])
                print("mutants: the tests fail without any mutation; fix them first")
                return 2
        outcomes = []
        for m in chosen:
            print(f"{m.name} ...", end=" ", flush=True)
            outcome = _run_one(copy, m, args.timeout)
            print(f"{outcome.verdict} ({outcome.seconds:.0f} s)", flush=True)
            outcomes.append(outcome)
    print()
    print(_table(outcomes))
    bad = [o for o in outcomes if o.verdict != "caught"]
    print(f"\n{len(outcomes) - len(bad)} of {len(outcomes)} mutations caught"
          + (f"; not caught: {', '.join(o.mutation.name + ' (' + o.verdict + ')' for o in bad)}"
             if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
