"""Conversations that last (SPEC §15), measured: run from the repository root::

    python -m bench.conversations [--json] [--conversations 10000] [--runs 30] [--only-long]

1. The first page of 10,000 conversations: ``GET /api/conversations`` against a real
   ``turnd serve`` (local store), beside the unpaged listing it replaced (every
   conversationRef read through ``list_records``, 100 at a time, then sorted) on the
   same store file in the same run.
2. The prompt a 200-message conversation sends to a model with a 4,000-token context:
   messages and bytes, without a declared context, with it, and with summaries.
3. A 20 MB photo's bytes sent to the model before (the data URL of the original) and
   after (its derivative), and the peak RSS of a prompt that names that photo 8 times,
   in a fresh process.
4. turnd's CPU a turn in conversations of 20, 200 and 500 messages (``--only-long`` runs
   only this; ``TURND_BENCH_TURND`` runs another build, for a before and after).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from bench import client as c
from bench.procs import DID, FakeModelProc, TurndProc, cpu_seconds
from recordstore import CONVERSATION, CONVERSATION_REF, MESSAGE, SETTINGS_SPACE
from recordstore.cid import record_cid
from recordstore.keys import new_tid
from recordstore.stored_json import compact
from recordstore.vocabulary import PLAIN_CONTENT, TEXT_PART
from turns.tls import tls_context

ROOT = Path(__file__).resolve().parent.parent


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


# -- 1. the first page --------------------------------------------------------------------


def _seed_refs(store_file: Path, n: int) -> None:
    rows = []
    for i in range(n):
        skey = new_tid()
        value = {
            "$type": CONVERSATION_REF,
            "conversation": f"at://{DID}/space/{CONVERSATION}/{skey}",
            "title": f"Conversation number {i} about something",
            "updatedAt": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:00:00.{i % 1000:03d}Z",
        }
        rows.append(_row(SETTINGS_SPACE, CONVERSATION_REF, skey, value))
    _insert(store_file, rows)


def _row(space: str, collection: str, key: str, value: dict[str, Any]) -> tuple[Any, ...]:
    """A record's row as the store keeps it (its CID, its compact JSON)."""
    return (DID, space, collection, key, record_cid(value), compact(value))


def _insert(store_file: Path, rows: list[tuple[Any, ...]]) -> None:
    """``rows`` straight into the store file, past the daemon (its feed sees them)."""
    with sqlite3.connect(store_file, timeout=30) as db:
        db.executemany(
            "INSERT INTO records (did, space, collection, key, cid, value) VALUES (?,?,?,?,?,?)",
            rows,
        )


def _caught_up(turnd: TurndProc, timeout: float = 120) -> None:
    """Wait until the daemon's change feed has handled the seed (its saved cursor)."""
    deadline = time.monotonic() + timeout
    with sqlite3.connect(turnd.store_file, timeout=30) as store:
        (head,) = store.execute("SELECT seq FROM sqlite_sequence WHERE name = 'ops'").fetchone()
    while time.monotonic() < deadline:
        with sqlite3.connect(f"file:{turnd.state_file}?mode=ro", uri=True, timeout=30) as state:
            row = state.execute("SELECT value FROM cursor WHERE name = 'changes'").fetchone()
        if row and int(row[0]) >= head:
            return
        time.sleep(0.2)
    raise RuntimeError("the change feed did not catch up with the seeded conversations")


async def _unpaged(store_file: Path) -> tuple[float, int]:
    """The listing before SPEC §15: every ref through list_records, sorted, as JSON."""
    from recordstore.local import LocalStore

    async with LocalStore.open(store_file.parent) as store:
        started = time.perf_counter()
        refs = []
        cursor = None
        while True:
            page, cursor = await store.list_records(
                DID, SETTINGS_SPACE, CONVERSATION_REF, cursor=cursor, limit=100
            )
            refs += page
            if cursor is None:
                break
        out = sorted(
            ({"skey": r.key, "title": r.value.get("title"), "updatedAt": r.value.get("updatedAt")}
             for r in refs),
            key=lambda c: (c["updatedAt"] or "", c["skey"]),
            reverse=True,
        )
        body = json.dumps({"conversations": out})
        return time.perf_counter() - started, len(body)


def first_page(n: int, runs: int) -> dict[str, Any]:
    with FakeModelProc(tokens=5) as fake, TurndProc({"fake": fake.base_url}) as turnd:
        _seed_refs(turnd.store_file, n)
        _caught_up(turnd)
        headers = {"Authorization": f"Bearer {turnd.token}"}
        with httpx.Client(base_url=turnd.base_url, headers=headers, timeout=30, verify=tls_context()) as http:
            http.get("/api/conversations")  # warm: the feed has caught up with the seed
            times, size = [], 0
            for _ in range(runs):
                started = time.perf_counter()
                r = http.get("/api/conversations")
                times.append(time.perf_counter() - started)
                size = len(r.content)
                assert r.status_code == 200 and len(r.json()["conversations"]) == 50
            searched = []
            for _ in range(runs):
                started = time.perf_counter()
                r = http.get("/api/conversations", params={"q": "NUMBER 99"})
                searched.append(time.perf_counter() - started)
        unpaged = [anyio.run(_unpaged, turnd.store_file) for _ in range(max(3, runs // 10))]
    return {
        "conversations": n,
        "first_page_ms_p50": _ms(statistics.median(times)),
        "first_page_ms_max": _ms(max(times)),
        "first_page_bytes": size,
        "search_ms_p50": _ms(statistics.median(searched)),
        "unpaged_listing_ms_p50": _ms(statistics.median(t for t, _ in unpaged)),
        "unpaged_listing_bytes": unpaged[0][1],
    }


# -- 4. CPU per turn as a conversation grows ------------------------------------------------

LONG_LENGTHS = (20, 200, 500)


def _seed_messages(store_file: Path, skey: str, pairs: int) -> None:
    """``pairs`` questions and answers, ~700 bytes each, written straight into the store."""
    rows = []
    parent: str | None = None
    for i in range(pairs):
        user = new_tid()
        for key, role, text in ((user, "user", f"question {i} "), (f"{user}.r0", "assistant", "")):
            value: dict[str, Any] = {
                "$type": MESSAGE,
                "role": role,
                "content": {"$type": PLAIN_CONTENT,
                            "parts": [{"$type": TEXT_PART, "text": text + "word " * 130}]},
                "createdAt": "2026-01-01T00:00:00.000Z",
            }
            if role == "assistant":
                value["status"] = "complete"
            if parent is not None:
                value["parent"] = parent
            rows.append(_row(skey, MESSAGE, key, value))
            parent = key
    _insert(store_file, rows)


async def _turns_in(turnd: TurndProc, skey: str, turns: int) -> float:
    """turnd's CPU a turn over ``turns`` turns in ``skey``, one after the other."""
    async with c.api_client(turnd.base_url, turnd.token, 4) as http:
        await c.turnd_turn(http, skey)  # warm
        before = cpu_seconds(turnd.pid)
        for _ in range(turns):
            sample = await c.turnd_turn(http, skey)
            if sample.status is None or '"complete"' not in sample.status:
                raise RuntimeError(f"a turn did not complete: {sample.status}")
        return (cpu_seconds(turnd.pid) - before) / turns


def long_conversations(turns: int, rounds: int) -> dict[str, Any]:
    """turnd's CPU a turn in conversations of each of :data:`LONG_LENGTHS` messages.

    Each turn is a new first message (no parent), so its prompt stays one message long and
    the figure follows what grows with the conversation: reading it back every turn. Each
    round seeds new conversations of each length and makes ``turns`` turns in each (2
    messages a turn: the 20-message one ends below turns.message_cache.CACHED_FROM).
    """

    async def run() -> dict[str, Any]:
        with FakeModelProc(tokens=5, ttft_ms=0) as fake, TurndProc({"fake": fake.base_url}) as turnd:
            got: dict[int, list[float]] = {n: [] for n in LONG_LENGTHS}
            for _ in range(rounds):
                # New conversations each round: each turn adds two messages.
                async with c.api_client(turnd.base_url, turnd.token, 4) as http:
                    skeys = {n: await c.new_conversation(http) for n in LONG_LENGTHS}
                for n, skey in skeys.items():
                    _seed_messages(turnd.store_file, skey, n // 2)
                _caught_up(turnd)
                for n, skey in skeys.items():
                    got[n].append(await _turns_in(turnd, skey, turns))
        # CPU time comes in clock ticks (10 ms): the rounds' sum over their turns, not a
        # median of per-round figures a tick apart.
        return {str(n): _ms(sum(v) / len(v)) for n, v in got.items()}

    return {"turns_a_round": turns, "rounds": rounds, "cpu_ms_per_turn": anyio.run(run)}


# -- 2. prompt sizes ------------------------------------------------------------------------


async def _prompt_sizes(pairs: int, context: int | None, summarize: bool) -> dict[str, Any]:
    from plugins import PluginSet
    from recordstore.local import LocalStore
    from testbed.fakemodel import FakeModel, Reply
    from turns.engine import TurnEngine
    from turns.settings import Provider, TurnSettings
    from turns.state import StateDB

    def summariser(body: Any) -> Reply | None:
        if isinstance(body, dict) and not body.get("stream"):
            return Reply.text("The user asked 100 numbered questions and got numbered answers.")
        return None

    with tempfile.TemporaryDirectory(prefix="turnd-bench-") as tmp, FakeModel(
        responder=summariser
    ) as fake:
        provider = Provider(
            "fake", fake.base_url, "sk-bench", (), model_context={"fake-model": context} if context else {}
        )
        settings = TurnSettings(retries=0, summarize=summarize, title_model="")
        async with LocalStore.open(Path(tmp) / "data") as store:
            state = await StateDB.open(Path(tmp) / "state.sqlite3")
            engine = TurnEngine(
                store, state, lambda: settings, {"fake": provider}, "fake:fake-model", PluginSet()
            )
            async with engine:
                skey = await engine.create_conversation(DID, title="long")
                parent = None
                for i in range(pairs):
                    user = new_tid()
                    value = {
                        "$type": MESSAGE, "role": "user",
                        "content": {"$type": PLAIN_CONTENT, "parts": [
                            {"$type": TEXT_PART, "text": f"Question {i}: " + "tell me more " * 12}]},
                        "createdAt": "2026-12-01T00:00:00.000Z",
                    }
                    if parent:
                        value["parent"] = parent
                    await store.create_record(DID, skey, MESSAGE, user, value)
                    reply = {
                        "$type": MESSAGE, "role": "assistant", "parent": user,
                        "status": "complete", "model": {"provider": "fake", "id": "fake-model"},
                        "content": {"$type": PLAIN_CONTENT, "parts": [
                            {"$type": TEXT_PART, "text": f"Answer {i}: " + "here is more " * 12}]},
                        "createdAt": "2026-12-01T00:00:00.000Z",
                    }
                    await store.create_record(DID, skey, MESSAGE, f"{user}.r0", reply)
                    parent = f"{user}.r0"
                posted = await engine.post_message(
                    DID, skey, parent=parent,
                    parts=[{"$type": TEXT_PART, "text": "And the last question?"}],
                    generation={},
                )
                with anyio.fail_after(30):
                    while True:
                        rec = await store.get_record(DID, skey, MESSAGE, posted.reply_key or "")
                        if rec and rec.value.get("status") != "pending":
                            break
                        await anyio.sleep(0.01)
                await engine.shutdown(1)
            await state.aclose()
        request = [r for r in fake.chat_requests if r.json.get("stream")][-1]
        messages = request.json["messages"]
        text_bytes = sum(
            len((m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])).encode())
            for m in messages
        )
        return {
            "context": context,
            "summarize": summarize,
            "messages_sent": len(messages),
            "prompt_bytes": text_bytes,
            "estimated_tokens": text_bytes // 3,
            "request_body_bytes": len(request.body),
            "status": rec.value["status"],
        }


def prompt_sizes() -> list[dict[str, Any]]:
    return [
        anyio.run(_prompt_sizes, 100, None, False),
        anyio.run(_prompt_sizes, 100, 4000, False),
        anyio.run(_prompt_sizes, 100, 4000, True),
    ]


# -- 3. a 20 MB photo ----------------------------------------------------------------------------


def _photo() -> bytes:
    """A PNG just under the lexicon's 20 MB: noise does not compress, like a photo's grain."""
    from PIL import Image

    width, height = 2550, 2600
    image = Image.frombytes("RGB", (width, height), os.urandom(width * height * 3))
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)
    return out.getvalue()


async def _photo_probe(path: str, parts: int) -> dict[str, Any]:
    from recordstore.local import LocalStore
    from turns.attachments import Attachments
    from turns.prompt import chat_messages

    data = Path(path).read_bytes()  # noqa: ASYNC240 - once, before anything is measured
    with tempfile.TemporaryDirectory(prefix="turnd-bench-") as tmp:
        async with LocalStore.open(Path(tmp) / "data") as store:
            blob = await store.upload_blob(DID, data, "image/png")
            del data
            part = {"$type": "network.sharedcomputer.chat.defs#imagePart", "image": blob}
            chain = [{"role": "user", "content": {"$type": PLAIN_CONTENT, "parts": [dict(part) for _ in range(parts)]}}]
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            started = time.perf_counter()
            attachments = Attachments(store, DID, cache_dir=Path(tmp) / "derivatives")
            messages = await chat_messages(store, DID, chain, "", attachments)
            first = time.perf_counter() - started
            sent = sum(
                len(p["image_url"]["url"]) for m in messages for p in m["content"]
                if p.get("type") == "image_url"
            )
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            started = time.perf_counter()
            await chat_messages(store, DID, chain, "", Attachments(
                store, DID, cache_dir=Path(tmp) / "derivatives"))
            cached = time.perf_counter() - started
    return {
        "parts": parts,
        "sent_bytes_all_parts": sent,
        "held_bytes": attachments.held,
        "rss_before_mb": round(before / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "first_prompt_ms": _ms(first),
        "cached_prompt_ms": _ms(cached),
    }


def photo() -> dict[str, Any]:
    data = _photo()
    with tempfile.NamedTemporaryFile(suffix=".png") as f:
        f.write(data)
        f.flush()
        one = json.loads(subprocess.run(
            [sys.executable, "-m", "bench.conversations", "--probe", f.name, "1"],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout)
        eight = json.loads(subprocess.run(
            [sys.executable, "-m", "bench.conversations", "--probe", f.name, "8"],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout)
    original_url = len("data:image/png;base64,") + len(base64.b64encode(data))
    return {
        "photo_bytes": len(data),
        "sent_before_bytes": original_url,
        "sent_after_bytes": one["sent_bytes_all_parts"],
        "one_part": one,
        "eight_parts": eight,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conversations")
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--long-turns", type=int, default=20,
                        help="turns a round in each long conversation")
    parser.add_argument("--long-rounds", type=int, default=8)
    parser.add_argument("--only-long", action="store_true",
                        help="only the CPU a turn by conversation length")
    parser.add_argument("--probe", nargs=2, metavar=("PNG", "PARTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(anyio.run(_photo_probe, args.probe[0], int(args.probe[1]))))
        return 0
    if args.only_long:
        results: dict[str, Any] = {"long": long_conversations(args.long_turns, args.long_rounds)}
    else:
        results = {
            "first_page": first_page(args.conversations, args.runs),
            "prompts": prompt_sizes(),
            "photo": photo(),
            "long": long_conversations(args.long_turns, args.long_rounds),
        }
    if args.json:
        print(json.dumps(results))
    else:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
