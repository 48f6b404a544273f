"""Tools without code (SPEC §14): MCP servers over stdio and streamable HTTP, HTTP tools,
and approval — end to end through the real daemon, against real servers on loopback:
``mcp-server-time`` (PyPI, stdio), ``@modelcontextprotocol/server-everything`` (npm,
streamable HTTP), ``testbed/mcp_test_server.py`` (the SDK's own server, misbehaving on cue)
and ``tests/support/http_tools.py``. The model is the fake OpenAI-compatible server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

# The imports a daemon's start makes lazily (seconds on a busy machine, with an MCP server
# starting beside it) are paid here, not inside the first test daemon's start-up deadline.
import daemon.http  # noqa: F401
import plugins.sources.mcp  # noqa: F401
import recordstore.local  # noqa: F401
import turns.engine  # noqa: F401
import turns.state  # noqa: F401
from testbed.fakemodel import FakeModel, Reply, ToolCall
from testbed.ports import free_port
from tests.support.accounts import ALICE, BOB, BOB_TOKEN
from tests.support.daemon import Daemon, running_daemon
from tests.support.http_tools import HttpToolServer
from tests.support.reliability import Turnd, wait_until

HERE = Path(__file__).resolve().parent
TOOL_CALL = "network.sharedcomputer.chat.defs#toolCallPart"
TOOL_RESULT = "network.sharedcomputer.chat.defs#toolResultPart"
APPROVAL = "network.sharedcomputer.chat.approval"
TIME_SERVER = shutil.which("mcp-server-time", path=str(Path(sys.executable).parent))

pytestmark = pytest.mark.anyio


@pytest.fixture
def http_tools() -> Iterator[HttpToolServer]:
    with HttpToolServer() as server:
        yield server


@pytest.fixture(scope="module")
def everything() -> Iterator[str]:
    """server-everything over streamable HTTP on a free port; yields its /mcp URL."""
    installed = subprocess.run(
        ["bash", str(HERE / "pds" / "install-everything.sh")],
        check=True, capture_output=True, text=True, timeout=600,
    )
    entry = installed.stdout.strip().splitlines()[-1]
    port = free_port()
    proc = subprocess.Popen(
        ["node", entry, "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(_wait_for_port, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


async def _wait_for_port(port: int) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stream.aclose()
                return
            except OSError:
                await anyio.sleep(0.05)


def _time_source() -> dict[str, Any]:
    assert TIME_SERVER, "mcp-server-time is a test extra: pip install -e '.[test]'"
    return {"kind": "mcp", "command": TIME_SERVER, "args": ["--local-timezone", "UTC"]}


def _test_server(log: Path, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "mcp",
        "command": sys.executable,
        "args": [str(HERE.parent / "testbed" / "mcp_test_server.py")],
        "env": {"MCP_TEST_LOG": str(log)},
        **extra,
    }


def _parts(record: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in record["content"]["parts"] if p["$type"] == kind]


def _tool_messages(fake: FakeModel, request: int) -> list[dict[str, Any]]:
    return [m for m in fake.chat_requests[request].json["messages"] if m["role"] == "tool"]


async def _until(predicate: Any, what: str, within: float = 30) -> Any:
    """Poll ``predicate`` until it answers something true (``what``, for the failure)."""
    with anyio.fail_after(within):
        while True:
            value = await predicate()
            if value:
                return value
            await anyio.sleep(0.05)


async def _log_has(log: Path, line: str) -> bool:
    path = anyio.Path(log)
    return await path.exists() and line in (await path.read_text()).splitlines()


# -- MCP over stdio, MCP over HTTP, HTTP tools: end to end -------------------------------


async def test_a_stdio_mcp_tool_call_end_to_end(tmp_path: Path, fake: FakeModel) -> None:
    fake.push(
        Reply.tool_calls([ToolCall("time_get_current_time", {"timezone": "UTC"}, id="c1")]),
        Reply.text("It is noon."),
    )
    async with running_daemon(tmp_path, fake, tools={"time": _time_source()}) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "what time is it?", generation={"tools": ["time"]})
        final = await d.final(skey, posted["replyKey"], wait=40)
        assert final["status"] == "complete", final
        (call,) = _parts(final, TOOL_CALL)
        assert (call["tool"], json.loads(call["input"])) == ("time_get_current_time", {"timezone": "UTC"})
        assert "approval" not in call
        (result,) = _parts(final, TOOL_RESULT)
        assert not result.get("isError")
        answer = json.loads(result["output"])  # the server's own answer, as it wrote it
        assert answer["timezone"] == "UTC" and answer["datetime"].endswith("+00:00")
        # The model was offered the source's tools and saw the real output next step.
        offered = [t["function"]["name"] for t in fake.chat_requests[0].json["tools"]]
        assert offered == ["time_get_current_time", "time_convert_time"]
        assert _tool_messages(fake, 1) == [
            {"role": "tool", "tool_call_id": "c1", "content": result["output"]}
        ]
        r = await d.http.get("/api/tools")
        assert r.status_code == 200, r.text
        listed = r.json()["tools"]
        time_tools = {t["name"]: t for t in listed if t["source"] == "time"}
        assert time_tools["time_convert_time"] == {
            "name": "time_convert_time",
            "description": time_tools["time_convert_time"]["description"],
            "source": "time",
            "kind": "mcp",
            "needsApproval": False,
            "available": True,
        }
        metrics = (await d.http.get("/metrics")).text
        assert 'turnd_tool_calls_total{outcome="ok",source="time"} 1.0' in metrics
        health = (await d.http.get("/healthz")).json()
        assert health["tools"]["time"]["state"] == "connected"
        assert health["tools"]["time"]["tools"] == 2 and health["degraded"] == []


async def test_an_http_mcp_tool_call_end_to_end(tmp_path: Path, fake: FakeModel, everything: str) -> None:
    fake.push(
        Reply.tool_calls([
            ToolCall("everything_echo", {"message": "hello MCP"}, id="c1"),
            ToolCall("everything_get-tiny-image", {}, id="c2"),
            ToolCall("everything_get-sum", {"a": "one"}, id="c3"),
        ]),
        Reply.text("done"),
    )
    tools = {"everything": {"kind": "mcp", "url": everything}}
    async with running_daemon(tmp_path, fake, tools=tools) as d:
        # Nothing connects to an HTTP source until something wants its tools.
        assert (await d.http.get("/healthz")).json()["tools"]["everything"]["state"] == "idle"
        skey = await d.conversation()
        posted = await d.post(skey, "echo", generation={"tools": ["everything_*"]})
        final = await d.final(skey, posted["replyKey"], wait=40)
        assert final["status"] == "complete", final
        echo, image, total = _parts(final, TOOL_RESULT)
        assert (echo["output"], echo.get("isError")) == ("Echo: hello MCP", None)
        # An image is summarised in text (type, size), never inlined.
        assert "[image image/png, " in image["output"] and " bytes]" in image["output"]
        assert not image.get("isError")
        # A call the server refuses (bad arguments) stays an error the model reads.
        assert total["isError"] is True and "expected number" in total["output"]
        assert [m["content"] for m in _tool_messages(fake, 1)] == [
            echo["output"], image["output"], total["output"]
        ]
        assert (await d.http.get("/healthz")).json()["tools"]["everything"]["state"] == "connected"


async def test_an_http_tool_gets_the_seed_request_and_its_answer_is_the_result(
    tmp_path: Path, fake: FakeModel, http_tools: HttpToolServer
) -> None:
    fake.push(
        Reply.tool_calls([
            ToolCall("weather", {"city": "Paris"}, id="call_w"),
            ToolCall("nowhere", {"city": "Atlantis"}, id="call_f"),
            ToolCall("garbled", {}, id="call_g"),
            ToolCall("broken", {}, id="call_b"),
            ToolCall("weather", '{"city": "Par', id="call_j"),  # not valid JSON
            ToolCall("not_offered", {}, id="call_n"),
        ]),
        Reply.text("ok"),
    )
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = {
        "weather": {"kind": "http", "url": http_tools.url("/weather"),
                    "description": "Current weather for a city", "parameters": params},
        "nowhere": {"kind": "http", "url": http_tools.url("/fail")},
        "garbled": {"kind": "http", "url": http_tools.url("/notjson")},
        "broken": {"kind": "http", "url": http_tools.url("/500")},
    }
    async with running_daemon(tmp_path, fake, tools=tools) as d:
        skey = await d.conversation()
        posted = await d.post(
            skey, "weather?", generation={"tools": ["weather", "nowhere", "garbled", "broken"]}
        )
        final = await d.final(skey, posted["replyKey"], wait=20)
        assert final["status"] == "complete", final
        weather, nowhere, garbled, broken, bad_json, not_offered = _parts(final, TOOL_RESULT)
        # Arguments that are not JSON, or a tool that was not offered: an error the model reads.
        assert bad_json["isError"] is True and "not valid JSON" in bad_json["output"]
        assert (not_offered["output"], not_offered["isError"]) == ("unknown tool 'not_offered'", True)
        assert len(http_tools.requests) == 4
        assert json.loads(weather["output"]) == {"city": "Paris", "sky": "clear", "celsius": 21}
        assert not weather.get("isError")
        assert (nowhere["output"], nowhere["isError"]) == ("no such city", True)
        assert garbled["isError"] is True and "not JSON" in garbled["output"]
        assert (broken["output"], broken["isError"]) == ("the tool answered HTTP 500", True)
        first = next(r for r in http_tools.requests if r["call_id"] == "call_w")
        assert first == {
            "call_id": "call_w",
            "name": "weather",
            "arguments": {"city": "Paris"},
            "conversation": f"at://{ALICE}/space/network.sharedcomputer.chat.conversation/{skey}",
            "user": ALICE,
        }
        spec = next(t for t in fake.chat_requests[0].json["tools"] if t["function"]["name"] == "weather")
        assert spec["function"] == {
            "name": "weather", "description": "Current weather for a city", "parameters": params
        }
        assert _tool_messages(fake, 1)[0]["content"] == weather["output"]


async def test_parallel_calls_run_at_most_max_parallel_tools_at_once(
    tmp_path: Path, fake: FakeModel, http_tools: HttpToolServer
) -> None:
    calls = [ToolCall("slow", {"seconds": 0.4, "n": i}, id=f"c{i}") for i in range(5)]
    fake.push(Reply.tool_calls(calls), Reply.text("rested"))
    tools = {"slow": {"kind": "http", "url": http_tools.url("/slow")}}
    async with running_daemon(tmp_path, fake, tools=tools, turns={"maxParallelTools": 2}) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "rest", generation={"tools": ["slow"]})
        final = await d.final(skey, posted["replyKey"], wait=20)
    assert [r["output"] for r in _parts(final, TOOL_RESULT)] == ["rested"] * 5
    assert len(http_tools.requests) == 5
    assert http_tools.max_in_flight == 2


# -- lifecycle: crash and restart, never starts, timeout, cancel --------------------------


async def test_a_server_that_crashes_mid_call_is_restarted(tmp_path: Path, fake: FakeModel) -> None:
    log = tmp_path / "server.log"
    fake.push(
        Reply.tool_calls([ToolCall("t_pid", {}, id="p1")]),
        Reply.text("first"),
        Reply.tool_calls([ToolCall("t_crash", {}, id="x1")]),
        Reply.text("second"),
        Reply.tool_calls([ToolCall("t_pid", {}, id="p2")]),
        Reply.text("third"),
    )
    async with running_daemon(tmp_path, fake, tools={"t": _test_server(log)}) as d:
        skey = await d.conversation()
        first = await d.final(skey, (await d.post(skey, "pid", generation={"tools": ["t"]}))["replyKey"], wait=40)
        (before,) = _parts(first, TOOL_RESULT)
        crashed = await d.final(skey, (await d.post(skey, "crash", generation={"tools": ["t"]}))["replyKey"], wait=40)
        # The turn goes on: the call that died with the server is an error result.
        assert crashed["status"] == "complete"
        (result,) = _parts(crashed, TOOL_RESULT)
        assert result["isError"] is True and "went away" in result["output"]
        assert await _log_has(log, "crash")

        async def restarted() -> bool:
            health = (await d.http.get("/healthz")).json()
            return health["tools"]["t"]["state"] == "connected" and health["status"] == "ok"

        await _until(restarted, "the server restarted")
        again = await d.final(skey, (await d.post(skey, "pid", generation={"tools": ["t"]}))["replyKey"], wait=40)
        (after,) = _parts(again, TOOL_RESULT)
        assert not after.get("isError") and after["output"].isdigit()
        assert after["output"] != before["output"]  # a new process
        metrics = (await d.http.get("/metrics")).text
        assert 'turnd_tool_calls_total{outcome="error",source="t"} 1.0' in metrics
        assert 'turnd_tool_calls_total{outcome="ok",source="t"} 2.0' in metrics


async def test_a_source_that_never_starts_is_degraded_and_fails_nothing(
    tmp_path: Path, fake: FakeModel
) -> None:
    never = {"kind": "mcp", "command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}
    fake.push(Reply.tool_calls([ToolCall("never_anything", {}, id="c1")]), Reply.text("fine"))
    async with running_daemon(tmp_path, fake, tools={"never": never}) as d:

        async def degraded() -> dict[str, Any] | None:
            r = await d.http.get("/healthz")
            body = r.json()
            return body if body["degraded"] == ["never"] else None

        body = await _until(degraded, "the source degraded")
        assert body["status"] == "ok" and body["tools"]["never"]["state"] == "degraded"
        assert body["tools"]["never"]["error"]
        assert (await d.http.get("/healthz")).status_code == 200
        skey = await d.conversation()
        posted = await d.post(skey, "try", generation={"tools": ["never"]})
        final = await d.final(skey, posted["replyKey"], wait=30)
        assert final["status"] == "complete"
        (result,) = _parts(final, TOOL_RESULT)
        assert result["isError"] is True
        assert "tools" not in fake.chat_requests[0].json  # nothing to offer
        assert (await d.http.get("/api/tools")).json() == {"tools": []}


async def test_a_tool_that_times_out_is_cancelled_at_the_server(tmp_path: Path, fake: FakeModel) -> None:
    log = tmp_path / "server.log"
    fake.push(
        Reply.tool_calls([ToolCall("t_sleep", {"seconds": 60, "label": "slow"}, id="c1")]),
        Reply.text("gave up"),
    )
    tools = {"t": _test_server(log, timeoutSeconds=1)}
    async with running_daemon(tmp_path, fake, tools=tools, turns={"toolTimeoutSeconds": 120}) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "sleep", generation={"tools": ["t"]})
        final = await d.final(skey, posted["replyKey"], wait=40)
        assert final["status"] == "complete"
        (result,) = _parts(final, TOOL_RESULT)
        # The source's timeoutSeconds (1) won over the turn's toolTimeoutSeconds (120).
        assert (result["output"], result["isError"]) == ("the tool timed out after 1 s", True)
        await _until(lambda: _log_has(log, "cancelled slow"), "the server saw the cancellation")
        metrics = (await d.http.get("/metrics")).text
        assert 'turnd_tool_calls_total{outcome="timeout",source="t"} 1.0' in metrics


async def test_cancel_during_a_long_mcp_call_reaches_the_server(tmp_path: Path, fake: FakeModel) -> None:
    log = tmp_path / "server.log"
    fake.push(Reply.tool_calls([ToolCall("t_sleep", {"seconds": 120, "label": "long"}, id="c1")]))
    async with running_daemon(tmp_path, fake, tools={"t": _test_server(log)}) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "sleep", generation={"tools": ["t"]})
        await _until(lambda: _log_has(log, "start long"), "the call started", within=40)
        cancel = f"/api/conversations/{skey}/messages/{posted['replyKey']}/cancel"
        assert (await d.http.post(cancel)).json() == {"cancelled": True}
        final = await d.final(skey, posted["replyKey"], wait=20)
        assert final["status"] == "cancelled"
        await _until(lambda: _log_has(log, "cancelled long"), "the server saw the cancellation")
        assert not await _log_has(log, "done long")


# -- approval ---------------------------------------------------------------------------


def _weather(http_tools: HttpToolServer, approval: Any = "always") -> dict[str, Any]:
    return {"weather": {"kind": "http", "url": http_tools.url("/weather"), "approval": approval}}


async def _pending(d: Daemon, skey: str, reply: str) -> dict[str, Any]:
    async def waiting() -> dict[str, Any] | None:
        value = await d.record(skey, reply)
        calls = _parts(value, TOOL_CALL) if value else []
        return value if calls and calls[-1].get("approval") == "pending" else None

    return await _until(waiting, "the call waits for approval")


async def _events(d: Daemon, skey: str, reply: str) -> list[tuple[str, Any]]:
    r = await d.http.get(f"/api/conversations/{skey}/messages/{reply}/stream")
    out = []
    event = None
    for line in r.text.splitlines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event:
            out.append((event, json.loads(line[5:])))
    return out


async def test_approval_by_the_route_approved_then_denied(
    tmp_path: Path, fake: FakeModel, http_tools: HttpToolServer
) -> None:
    fake.push(
        Reply.tool_calls([ToolCall("weather", {"city": "Oslo"}, id="a1")], text="Let me check."),
        Reply.text("Sunny."),
        Reply.tool_calls([ToolCall("weather", {"city": "Rome"}, id="d1")]),
        Reply.text("I may not."),
    )
    turns = {"approvalTimeoutSeconds": 60, "timeoutSeconds": 3}
    async with running_daemon(tmp_path, fake, tools=_weather(http_tools), turns=turns) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "Oslo?", generation={"tools": ["weather"]})
        reply = posted["replyKey"]
        pending = await _pending(d, skey, reply)
        # Rewritten once with the parts so far; still pending, the tool not yet called.
        assert pending["status"] == "pending"
        assert [p["$type"].rsplit("#")[-1] for p in pending["content"]["parts"]] == ["textPart", "toolCallPart"]
        assert http_tools.requests == []
        route = f"/api/conversations/{skey}/messages/{reply}/approvals/a1"
        r = await d.http.post(f"/api/conversations/{skey}/messages/{reply}/approvals/nope", json={"approve": True})
        assert r.status_code == 409 and r.json()["error"] == "Conflict"
        # The wait is not counted against the turn's timeoutSeconds (3 s).
        await anyio.sleep(3.5)
        assert (await d.http.post(route, json={"approve": True})).json() == {"decided": True}
        final = await d.final(skey, reply)
        assert final["status"] == "complete", final
        (call,) = _parts(final, TOOL_CALL)
        assert call["approval"] == "approved"
        (result,) = _parts(final, TOOL_RESULT)
        assert json.loads(result["output"])["city"] == "Oslo" and not result.get("isError")
        assert (await d.http.post(route, json={"approve": False})).status_code == 409
        events = await _events(d, skey, reply)
        approval = [data for name, data in events if name == "approval"]
        assert approval == [{"index": 1, "callId": "a1", "tool": "weather", "input": '{"city": "Oslo"}'}]
        names = [name for name, _ in events]
        assert names.index("part") < names.index("approval")  # the call part is out first

        posted = await d.post(skey, "Rome?", parent=reply, generation={"tools": ["weather"]})
        await _pending(d, skey, posted["replyKey"])
        route = f"/api/conversations/{skey}/messages/{posted['replyKey']}/approvals/d1"
        assert (await d.http.post(route, json={"approve": False})).json() == {"decided": True}
        final = await d.final(skey, posted["replyKey"])
        (call,) = _parts(final, TOOL_CALL)
        (result,) = _parts(final, TOOL_RESULT)
        assert call["approval"] == "denied"
        assert (result["output"], result["isError"]) == ("not approved by the user", True)
        assert _tool_messages(fake, 3)[-1]["content"] == "not approved by the user"

        assert [r["arguments"]["city"] for r in http_tools.requests] == ["Oslo"]
        metrics = (await d.http.get("/metrics")).text
        assert 'turnd_tool_calls_total{outcome="denied",source="weather"} 1.0' in metrics
        listed = (await d.http.get("/api/tools")).json()["tools"]
        assert [(t["name"], t["needsApproval"], t["kind"]) for t in listed] == [("weather", True, "http")]


async def test_no_decision_within_approval_timeout_seconds_is_an_error_result(
    tmp_path: Path, fake: FakeModel, http_tools: HttpToolServer
) -> None:
    fake.push(Reply.tool_calls([ToolCall("weather", {"city": "Lima"}, id="t1")]), Reply.text("No answer."))
    turns = {"approvalTimeoutSeconds": 1}
    async with running_daemon(tmp_path, fake, tools=_weather(http_tools), turns=turns) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "Lima?", generation={"tools": ["weather"]})
        final = await d.final(skey, posted["replyKey"], wait=20)
        (call,) = _parts(final, TOOL_CALL)
        (result,) = _parts(final, TOOL_RESULT)
        assert final["status"] == "complete"
        assert call["approval"] == "timedout"
        assert (result["output"], result["isError"]) == ("approval timed out", True)
        assert _tool_messages(fake, 1)[-1]["content"] == "approval timed out"
        assert http_tools.requests == []
        route = f"/api/conversations/{skey}/messages/{posted['replyKey']}/approvals/t1"
        assert (await d.http.post(route, json={"approve": True})).status_code == 409
        metrics = (await d.http.get("/metrics")).text
        assert 'turnd_tool_calls_total{outcome="approval_timeout",source="weather"} 1.0' in metrics


async def _session(d: Daemon, handle: str, password: str) -> str:
    r = await d.http.post(
        "/xrpc/com.atproto.server.createSession",
        json={"identifier": handle, "password": password},
    )
    assert r.status_code == 200, r.text
    return r.json()["accessJwt"]


async def _write_approval(
    d: Daemon, jwt: str, repo: str, skey: str, reply: str, index: int, call_id: str, approve: bool
) -> httpx.Response:
    record = {
        "$type": APPROVAL, "reply": reply, "callId": call_id, "approve": approve,
        "createdAt": "2026-12-01T09:00:00.000Z",
    }
    return await d.http.post(
        "/xrpc/com.atproto.repo.createRecord",
        headers={"Authorization": f"Bearer {jwt}"},
        json={"repo": repo, "collection": APPROVAL, "rkey": f"{skey}:{reply}.a{index}", "record": record},
    )


async def test_approval_by_a_direct_write_record_of_the_owner_only(
    tmp_path: Path, fake: FakeModel, everything: str
) -> None:
    from tests.support.accounts import ALICE_PASSWORD, BOB_PASSWORD

    fake.push(
        Reply.tool_calls([ToolCall("everything_echo", {"message": "approved by record"}, id="e1")]),
        Reply.text("echoed"),
        Reply.tool_calls([ToolCall("everything_echo", {"message": "denied by record"}, id="e2")]),
        Reply.text("not echoed"),
    )
    tools = {"everything": {"kind": "mcp", "url": everything, "approval": ["everything_echo"]}}
    async with running_daemon(tmp_path, fake, tools=tools, turns={"approvalTimeoutSeconds": 30}) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "echo", generation={"tools": ["everything_echo"]})
        reply = posted["replyKey"]
        pending = await _pending(d, skey, reply)
        index = next(i for i, p in enumerate(pending["content"]["parts"]) if p["$type"] == TOOL_CALL)
        # Bob's record (in his own repo, same keys) is not the owner's: ignored.
        bob = await _session(d, "bob.test", BOB_PASSWORD)
        r = await _write_approval(d, bob, BOB, skey, reply, index, "e1", True)
        assert r.status_code == 200, r.text
        # Nor may he write into Alice's repo.
        r = await _write_approval(d, bob, ALICE, skey, reply, index, "e1", True)
        assert r.status_code >= 400
        # A record at the wrong index for the call is ignored too.
        alice = await _session(d, "alice.test", ALICE_PASSWORD)
        r = await _write_approval(d, alice, ALICE, skey, reply, index + 5, "e1", True)
        assert r.status_code == 200, r.text
        await anyio.sleep(1.5)  # the change feed delivers within a second (SPEC §4)
        assert (await d.record(skey, reply))["status"] == "pending"
        assert d.service.engine.approvals.waiting(ALICE, skey, reply) == ["e1"]
        r = await _write_approval(d, alice, ALICE, skey, reply, index, "e1", True)
        assert r.status_code == 200, r.text
        final = await d.final(skey, reply, wait=20)
        (call,) = _parts(final, TOOL_CALL)
        (result,) = _parts(final, TOOL_RESULT)
        assert call["approval"] == "approved"
        assert result["output"] == "Echo: approved by record"

        posted = await d.post(skey, "again", parent=reply, generation={"tools": ["everything"]})
        pending = await _pending(d, skey, posted["replyKey"])
        index = next(i for i, p in enumerate(pending["content"]["parts"]) if p["$type"] == TOOL_CALL)
        r = await _write_approval(d, alice, ALICE, skey, posted["replyKey"], index, "e2", False)
        assert r.status_code == 200, r.text
        final = await d.final(skey, posted["replyKey"], wait=20)
        (call,) = _parts(final, TOOL_CALL)
        (result,) = _parts(final, TOOL_RESULT)
        assert call["approval"] == "denied" and result["output"] == "not approved by the user"
        # Bob's API token cannot decide Alice's calls either: her conversation is a 404 to him.
        async with d.client(BOB_TOKEN) as as_bob:
            r = await as_bob.post(
                f"/api/conversations/{skey}/messages/{reply}/approvals/e1", json={"approve": True}
            )
            assert r.status_code == 404


async def test_cancel_during_an_approval_wait_cancels_the_turn(
    tmp_path: Path, fake: FakeModel, http_tools: HttpToolServer
) -> None:
    fake.push(Reply.tool_calls([ToolCall("weather", {"city": "Oslo"}, id="a1")]))
    async with running_daemon(tmp_path, fake, tools=_weather(http_tools)) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "Oslo?", generation={"tools": ["weather"]})
        await _pending(d, skey, posted["replyKey"])
        cancel = f"/api/conversations/{skey}/messages/{posted['replyKey']}/cancel"
        assert (await d.http.post(cancel)).json() == {"cancelled": True}
        final = await d.final(skey, posted["replyKey"])
        assert final["status"] == "cancelled"
        (call,) = _parts(final, TOOL_CALL)
        assert call["approval"] == "timedout"  # nothing waits any more, no decision came
        route = f"/api/conversations/{skey}/messages/{posted['replyKey']}/approvals/a1"
        assert (await d.http.post(route, json={"approve": True})).status_code == 409
        assert http_tools.requests == []


@pytest.mark.parametrize("how", ["kill -9", "clean stop"])
def test_a_restart_during_an_approval_wait_leaves_no_call_pending(
    tmp_path: Path, http_tools: HttpToolServer, how: str
) -> None:
    """No record may keep offering a decision nobody can take: after a crash the reply is
    `error` "interrupted"; a clean stop ends the wait at once and the turn finishes. Either
    way the call says `timedout`, and neither the route nor an owner's record revives it."""
    from tests.support.accounts import ALICE_PASSWORD

    with FakeModel() as fake:
        fake.push(
            Reply.tool_calls([ToolCall("weather", {"city": "Oslo"}, id="a1")]),
            Reply.text("I could not check."),  # the stop's next step, after "approval timed out"
        )
        extra = f'\n[tools.weather]\nkind = "http"\nurl = "{http_tools.url("/weather")}"\napproval = "always"\n'
        daemon = Turnd(tmp_path, "t", tmp_path / "data", fake.base_url, extra=extra).start()
        try:
            with daemon.client() as http:
                skey = http.post("/api/conversations", json={}).json()["skey"]
                posted = http.post(
                    f"/api/conversations/{skey}/messages",
                    json={"parts": [{"$type": "network.sharedcomputer.chat.defs#textPart", "text": "Oslo?"}],
                          "generation": {"tools": ["weather"]}},
                ).json()
                reply_key = posted["replyKey"]

                def reply() -> dict[str, Any] | None:
                    messages = http.get(f"/api/conversations/{skey}").json()["messages"]
                    return next((m["value"] for m in messages if m["key"] == reply_key), None)

                wait_until(
                    lambda: (v := reply()) and any(p.get("approval") == "pending" for p in v["content"]["parts"]),
                    30, "the pending approval",
                )
                if how == "kill -9":
                    daemon.kill()
                else:
                    assert daemon.stop() == 0
                daemon.start()
                final = wait_until(lambda: (v := reply()) and v["status"] != "pending" and v, 30, "the reply")
                (call,) = _parts(final, TOOL_CALL)
                assert call["approval"] == "timedout"
                if how == "kill -9":
                    assert (final["status"], final["error"]) == ("error", "interrupted")
                    assert _parts(final, TOOL_RESULT) == []
                else:
                    assert final["status"] == "complete", final
                    (result,) = _parts(final, TOOL_RESULT)
                    assert (result["output"], result["isError"]) == ("approval timed out", True)
                    assert _tool_messages(fake, 1)[-1]["content"] == "approval timed out"

                route = f"/api/conversations/{skey}/messages/{reply_key}/approvals/a1"
                assert http.post(route, json={"approve": True}).status_code == 409
                jwt = http.post(
                    "/xrpc/com.atproto.server.createSession",
                    json={"identifier": "alice.test", "password": ALICE_PASSWORD},
                ).json()["accessJwt"]
                record = {
                    "$type": APPROVAL, "reply": reply_key, "callId": "a1", "approve": True,
                    "createdAt": "2026-12-01T09:00:00.000Z",
                }
                written = http.post(
                    "/xrpc/com.atproto.repo.createRecord",
                    headers={"Authorization": f"Bearer {jwt}"},
                    json={"repo": ALICE, "collection": APPROVAL, "rkey": f"{skey}:{reply_key}.a0",
                          "record": record},
                )
                assert written.status_code == 200, written.text
                # A later turn has gone through the same change feed, past the approval record.
                fake.push(Reply.text("later"))
                later = http.post(
                    f"/api/conversations/{skey}/messages",
                    json={"parts": [{"$type": "network.sharedcomputer.chat.defs#textPart", "text": "later"}],
                          "parent": reply_key, "generation": {}},
                ).json()
                wait_until(
                    lambda: any(m["key"] == later["replyKey"] and m["value"]["status"] != "pending"
                                for m in http.get(f"/api/conversations/{skey}").json()["messages"]),
                    30, "the later reply",
                )
                assert reply() == final
            assert http_tools.requests == []
        finally:
            daemon.stop()


# -- config and turnd check ---------------------------------------------------------------

TURND = str(Path(sys.executable).parent / "turnd")


def _config_file(tmp_path: Path, tools_toml: str) -> Path:
    path = tmp_path / "turnd.toml"
    path.write_text(
        f'[store]\nkind = "local"\npath = "{tmp_path / "data"}"\n\n'
        '[http]\nlisten = "127.0.0.1:0"\n\n' + tools_toml
    )
    return path


def _turnd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TURND, *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[tools.time]\nkind = "mcp"\ncommand = "mcp-server-tme"\n',
         "tools.time.command: 'mcp-server-tme' is not an executable on PATH"),
        ('[tools.time]\nkind = "mcp"\n', "tools.time.command: an MCP source has either command (stdio) or url (HTTP)"),
        ('[tools.time]\nkind = "mcp"\ncommand = "sh"\nenv_from = { API_KEY = "NO_SUCH_VAR_X" }\n',
         "tools.time.env_from.API_KEY: environment variable NO_SUCH_VAR_X is not set"),
        ('[tools.time]\nkind = "mcp"\ncommand = "sh"\napproval = "sometimes"\n', "tools.time.approval: "),
        ('[tools.time]\nkind = "mcp"\ncommand = "sh"\ncomand = "x"\n', "tools.time.comand: unknown key"),
        ('[tools.weather]\nkind = "http"\n', "tools.weather.url: required for an http tool"),
        ('[tools.weather]\nkind = "http"\nurl = "ftp://x"\n', "tools.weather.url: must be an http(s) URL"),
        ('[tools.weather]\nkind = "http"\nurl = "http://x"\ntimeoutSeconds = 0\n', "tools.weather.timeoutSeconds: "),
        ('[tools."bad name"]\nkind = "http"\nurl = "http://x"\n', 'tools.bad name: a tool source\'s name is'),
        ('[tools.x]\nkind = "grpc"\n', "tools.x.kind: "),
    ],
)
def test_a_bad_tool_source_is_a_config_error_naming_the_key(table: str, message: str) -> None:
    import tomllib

    from daemon.config import ConfigError, build_config

    with pytest.raises(ConfigError) as info:
        build_config(tomllib.loads(table), env=dict(os.environ), path=None, base_dir=HERE)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_bad_tool_source_stops_serve_with_one_line_and_exit_2(tmp_path: Path) -> None:
    table = '[tools.time]\nkind = "mcp"\ncommand = "mcp-server-tme"\n'
    done = _turnd("serve", "--config", str(_config_file(tmp_path, table)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "turnd: config error: tools.time.command: 'mcp-server-tme' is not an executable on PATH"
    ]


def test_turnd_check_reports_each_tool_source(tmp_path: Path, http_tools: HttpToolServer) -> None:
    never = f'"{sys.executable}"'
    toml = (
        f'[tools.time]\nkind = "mcp"\ncommand = "{TIME_SERVER}"\n\n'
        f'[tools.never]\nkind = "mcp"\ncommand = {never}\nargs = ["-c", "import sys; sys.exit(3)"]\n\n'
        f'[tools.weather]\nkind = "http"\nurl = "{http_tools.url("/weather")}"\n'
        'headers_from = { Authorization = "T_WEATHER_AUTH" }\n'
    )
    done = _turnd("check", "--config", str(_config_file(tmp_path, toml)),
                  env={"T_WEATHER_AUTH": "Bearer weather-secret-123"})
    out = done.stdout
    assert done.returncode == 0, out + done.stderr  # a degraded source is shown, not failed
    lines = {line.split()[2].rstrip(":"): line for line in out.splitlines() if " tools " in line}
    assert lines["time"].startswith("ok") and lines["time"].endswith("time: mcp over stdio, 2 tools")
    assert lines["never"].startswith("degraded tools     never: mcp over stdio: ")
    assert lines["weather"].startswith("ok") and "1 tool" in lines["weather"]
    assert "weather-secret-123" not in out + done.stderr


async def test_the_lexicons_readme_approval_example_runs_against_a_live_daemon(
    tmp_path: Path, fake: FakeModel, http_tools: HttpToolServer
) -> None:
    import re

    from tests.support.accounts import ALICE_PASSWORD

    readme = (HERE.parent / "lexicons" / "README.md").read_text()
    section = readme[readme.index("## Approving a tool call"):]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    fake.push(Reply.tool_calls([ToolCall("weather", {"city": "Oslo"}, id="a1")]), Reply.text("ok"))
    async with running_daemon(tmp_path, fake, tools=_weather(http_tools)) as d:
        skey = await d.conversation()
        posted = await d.post(skey, "Oslo?", generation={"tools": ["weather"]})
        await _pending(d, skey, posted["replyKey"])
        # Run as the page says (`python approve.py <skey>` with TURND_URL and
        # TURND_ME_PASSWORD set); only the handle differs: the test account is alice.
        assert '"me.test"' in code
        source = code.replace('"me.test"', '"alice.test"')

        def run() -> None:
            saved_env, saved_argv = dict(os.environ), sys.argv
            os.environ.update(TURND_URL=d.base_url, TURND_ME_PASSWORD=ALICE_PASSWORD)
            sys.argv = ["approve.py", skey]
            try:
                exec(compile(source, "lexicons/README.md", "exec"), {})
            finally:
                os.environ.clear()
                os.environ.update(saved_env)
                sys.argv = saved_argv

        await anyio.to_thread.run_sync(run)
        final = await d.final(skey, posted["replyKey"], wait=20)
        (call,) = _parts(final, TOOL_CALL)
        assert final["status"] == "complete" and call["approval"] == "approved"
        assert [r["arguments"] for r in http_tools.requests] == [{"city": "Oslo"}]


async def test_the_tool_list_is_reread_when_the_server_announces_a_change(
    tmp_path: Path, fake: FakeModel
) -> None:
    log = tmp_path / "server.log"
    fake.push(
        Reply.tool_calls([ToolCall("t_grow", {"name": "fresh"}, id="g1")]),
        Reply.text("grown"),
        Reply.tool_calls([ToolCall("t_fresh", {}, id="f1")]),
        Reply.text("used"),
    )
    async with running_daemon(tmp_path, fake, tools={"t": _test_server(log)}) as d:
        skey = await d.conversation()
        first = await d.post(skey, "grow", generation={"tools": ["t"]})
        await d.final(skey, first["replyKey"], wait=40)
        assert "t_fresh" not in [t["function"]["name"] for t in fake.chat_requests[0].json["tools"]]

        async def listed() -> bool:
            tools = (await d.http.get("/api/tools")).json()["tools"]
            return "t_fresh" in [t["name"] for t in tools]

        await _until(listed, "the new tool listed")
        second = await d.post(skey, "use it", parent=first["replyKey"], generation={"tools": ["t_fresh"]})
        final = await d.final(skey, second["replyKey"], wait=40)
        (result,) = _parts(final, TOOL_RESULT)
        assert (result["output"], result.get("isError")) == ("fresh here", None)


async def test_an_http_mcp_server_that_goes_away_is_reconnected_on_next_use(
    tmp_path: Path, fake: FakeModel, everything: str
) -> None:
    installed = await anyio.run_process(["bash", str(HERE / "pds" / "install-everything.sh")])
    entry = installed.stdout.decode().strip().splitlines()[-1]  # cached by the fixture's run
    port = free_port()

    def serve() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["node", entry, "streamableHttp"], env={**os.environ, "PORT": str(port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    # (the `everything` fixture only makes sure the server is installed)
    calls = [ToolCall("ev_echo", {"message": f"m{i}"}, id=f"c{i}") for i in range(3)]
    fake.push(*(r for c in calls for r in (Reply.tool_calls([c]), Reply.text("ok"))))
    server = serve()
    try:
        await _wait_for_port(port)
        tools = {"ev": {"kind": "mcp", "url": f"http://127.0.0.1:{port}/mcp"}}
        async with running_daemon(tmp_path, fake, tools=tools) as d:
            skey = await d.conversation()

            async def echo(text: str) -> dict[str, Any]:
                posted = await d.post(skey, text, generation={"tools": ["ev"]})
                (result,) = _parts(await d.final(skey, posted["replyKey"], wait=40), TOOL_RESULT)
                return result

            assert (await echo("one"))["output"] == "Echo: m0"
            server.terminate()
            server.wait(10)
            gone = await echo("two")
            assert gone["isError"] is True
            server = serve()
            await _wait_for_port(port)
            back = await echo("three")
            assert (back["output"], back.get("isError")) == ("Echo: m2", None)
    finally:
        server.terminate()
        server.wait(10)
