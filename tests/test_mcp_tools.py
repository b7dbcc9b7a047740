"""MCP tool servers: real servers written with the SDK (tests/mcp_servers/echo_server.py), started by the
gateway over stdio or served in-process over streamable HTTP, and called by the model through a turn."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from gateway.config import config_from_dict
from gateway.tools import ToolContext, ToolRegistry
from gateway.tools_mcp import McpTools, allowed
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import ApiClient, eventually, running_gateway
from tests.mcp_servers.http_server import http_echo_server

# Every test here starts the echo server as a subprocess of the gateway (or serves it over HTTP).
pytestmark = [pytest.mark.processes, pytest.mark.slow]

ECHO = str(Path(__file__).resolve().parent / "mcp_servers" / "echo_server.py")
SECRET_IN_ENV = "sb-gateway-secret-value-7731"
# The server is itself Python: without this it would add LC_CTYPE to its own environment (PEP 538),
# which is the server's doing, not the gateway's; naming it in `env` keeps the comparison exact.
NO_COERCION = {"PYTHONCOERCECLOCALE": "0"}


def echo_server(**overrides) -> dict:
    return {"command": sys.executable, "args": [ECHO], "env": {**NO_COERCION, "GREETING": "hello-from-config"},
            "allow": ["echo__*"], "deny": ["echo__die"], **overrides}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def _ready(gw_or_tools, name: str = "echo"):
    tools = getattr(gw_or_tools, "mcp", gw_or_tools)
    server = tools.servers[name]
    await eventually(lambda: server.available, 20, lambda: f"{name} ready (state {server.state}: {server.last_error})")
    return server


def _tool_messages(request) -> list[dict]:
    return [m for m in request.messages if m.get("role") == "tool"]


async def test_the_model_calls_an_allowed_tool_and_its_result_is_stored_once_as_it_saw_it(tmp_path, model):
    model.script(ToolCall("echo__echo", {"text": "ping"}), Reply("the server said ping back"))
    async with running_gateway(tmp_path, model, tools={"mcp_servers": {"echo": echo_server()}}) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        reply = await api.say("ann", "call the echo tool")
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:ann"))
    first, second = model.requests[-2:]
    offered = sorted(t["function"]["name"] for t in first.body.get("tools", []))
    assert "echo__echo" in offered and "echo__die" not in offered  # denied: never offered
    assert [m["content"] for m in _tool_messages(second)] == ["echo: ping"]
    assert reply == "the server said ping back"
    tool_rows = [m for m in stored if m.role == "tool"]
    assert [(m.content, m.tool_name) for m in tool_rows] == [("echo: ping", "echo__echo")]


async def test_a_stdio_server_gets_only_its_env_plus_path_and_home(tmp_path, model, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_API_TOKEN", SECRET_IN_ENV)
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", SECRET_IN_ENV)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_IN_ENV)
    model.script(ToolCall("echo__environment", {}), Reply("ok"))
    async with running_gateway(tmp_path, model, tools={"mcp_servers": {"echo": echo_server()}}) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        await api.say("bo", "what is your environment?")
        await api.close()
    seen = json.loads(_tool_messages(model.requests[-1])[0]["content"])
    assert seen == {"GREETING": "hello-from-config", "PYTHONCOERCECLOCALE": "0",
                    "PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    assert SECRET_IN_ENV not in json.dumps(seen) and "sk-test-not-a-secret-0000" not in json.dumps(seen)


async def test_a_ten_megabyte_result_reaches_the_model_and_the_store_cut_at_the_cap(tmp_path, model):
    model.script(ToolCall("echo__big", {"size": 10_000_000}), Reply("that was long"))
    async with running_gateway(tmp_path, model, tools={"mcp_servers": {"echo": echo_server()}}) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        assert await api.say("cy", "give me everything") == "that was long"
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:cy"))
    sent = _tool_messages(model.requests[-1])[0]["content"]
    assert sent.startswith("x" * 32768) and not sent.startswith("x" * 32769)
    assert sent.endswith("[cut: the result was 10,000,000 bytes; only the first 32,768 are shown]")
    assert [m.content for m in stored if m.role == "tool"] == [sent]


async def test_a_slow_tool_times_out_a_failing_one_says_why_and_the_server_goes_on(tmp_path, caplog):
    caplog.set_level("INFO", logger="gateway.tools_mcp.server.echo")
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {
        "echo": echo_server(timeout_seconds=0.5)}}}, env={})
    tools = McpTools(cfg.tools, ToolRegistry())
    tools.start()
    try:
        server = await _ready(tools)
        assert await server.call("slow", {"seconds": 5}) == "error: echo__slow did not answer within 0.5 seconds"
        # the server was told (notifications/cancelled) and stopped the call's work
        await eventually(lambda: _calls(server, want={"started": 1, "now": 0, "cancelled": 1}), 5,
                         "the timed-out call cancelled in the server")
        assert await server.call("fail", {"why": "no disk"}) == (
            "error: Error executing tool fail: cannot do that: no disk")
        assert await server.call("echo", {"text": "still here"}) == "echo: still here"
    finally:
        await tools.stop()
    # what the server wrote to its stderr is in our log (through the redactor), named after it
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.tools_mcp.server.echo"]
    assert any("Tool 'fail' failed" in line for line in said), said[:5]


async def _calls(server, *, want: dict | None = None) -> dict | bool:
    seen = json.loads(await server.call("calls", {}))
    return seen if want is None else seen == want


async def test_stop_cancels_a_running_tool_call_in_the_server(tmp_path, model):
    model.script(ToolCall("echo__slow", {"seconds": 60}), Reply("never sent: the turn was stopped"))
    async with running_gateway(tmp_path, model, tools={"mcp_servers": {"echo": echo_server()}}) as gw:
        server = await _ready(gw)
        api = ApiClient(gw)
        turn = asyncio.create_task(api.say("fay", "take your time"))
        await eventually(lambda: _calls(server, want={"started": 1, "now": 1, "cancelled": 0}), 20, "the slow call running")
        assert await api.say("fay", "/stop") == "Stopping the current reply."
        await eventually(lambda: _calls(server, want={"started": 1, "now": 0, "cancelled": 1}), 10,
                         "the server told the call was cancelled")
        await asyncio.wait_for(turn, 10)
        await api.close()
    assert len(model.requests) == 1  # the model was not called again with a result


@pytest.mark.parametrize("cap", [1, 3])
async def test_calls_beyond_a_servers_concurrency_cap_wait_their_turn(tmp_path, cap):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {
        "echo": echo_server(max_concurrent_calls=cap)}}}, env={})
    tools = McpTools(cfg.tools, ToolRegistry())
    tools.start()
    try:
        server = await _ready(tools)
        results = await asyncio.gather(*(server.call("slow", {"seconds": 0.2}) for _ in range(6)))
        assert results == ["slept 0.2"] * 6
        assert await server.call("peak", {}) == str(cap)
    finally:
        await tools.stop()


async def test_a_server_that_dies_mid_call_is_reported_unavailable_then_restarted(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {
        "echo": echo_server(allow=["echo__*"], deny=[])}}}, env={})
    registry = ToolRegistry()
    tools = McpTools(cfg.tools, registry)
    tools.start()
    try:
        server = await _ready(tools)
        assert await server.call("die", {}) == (
            "error: the echo tool server stopped during the call to echo__die; it is being restarted, try again shortly")
        assert await server.call("echo", {"text": "too soon"}) == (
            "error: echo__echo is unavailable right now (the echo tool server is restarting); "
            "try again later or do without it")
        assert "echo__echo" in registry.names()  # still known, answering "unavailable" meanwhile
        await _ready(tools)
        assert await server.call("echo", {"text": "back"}) == "echo: back"
        assert server.restarts == 1
    finally:
        await tools.stop()


async def test_a_server_killed_while_idle_is_found_by_its_ping_and_restarted(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {"echo": echo_server()}}}, env={})
    tools = McpTools(cfg.tools, ToolRegistry(), ping_seconds=0.2)
    tools.start()
    try:
        server = await _ready(tools)
        first = int(await server.call("pid", {}))
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: server.restarts >= 1, 10, "the dead server noticed")
        await _ready(tools)
        second = int(await server.call("pid", {}))
        assert second != first
    finally:
        await tools.stop()
    await eventually(lambda: not _alive(second), 10, "the server process gone after stop()")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:  # a zombie is gone too: it only awaits its reaping
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_stopping_the_gateway_leaves_no_server_process_behind(tmp_path, model):
    model.script(ToolCall("echo__pid", {}), Reply("ok"))
    async with running_gateway(tmp_path, model, tools={"mcp_servers": {"echo": echo_server()}}) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        await api.say("ed", "your pid?")
        await api.close()
    pid = int(_tool_messages(model.requests[-1])[0]["content"])
    await eventually(lambda: not _alive(pid), 10, f"server process {pid} ended with the gateway")


async def test_a_changed_tool_list_is_read_again_and_offered(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {"echo": echo_server()}}}, env={})
    registry = ToolRegistry()
    tools = McpTools(cfg.tools, registry)
    tools.start()
    try:
        server = await _ready(tools)
        assert "echo__late" not in registry.names()
        assert await server.call("grow", {}) == "grown"
        await eventually(lambda: "echo__late" in registry.names(), 10, "the new tool registered")
        assert await server.call("late", {}) == "late but here"
    finally:
        await tools.stop()


async def test_only_allowed_tools_are_offered_and_nothing_without_an_allow(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {
        "echo": echo_server(allow=["echo__e*", "echo__big"], deny=["echo__environment"]),
        "quiet": echo_server(allow=[], deny=[])}}}, env={})
    registry = ToolRegistry()
    tools = McpTools(cfg.tools, registry)
    tools.start()
    try:
        await _ready(tools)
        await _ready(tools, "quiet")
        anywhere = ToolContext(session_id="s", session_key="agent:main:api:dm:ann", platform="api", user_id="ann",
                               agent="main")
        assert sorted(registry.offered(anywhere)) == ["echo__big", "echo__echo"]
        assert "echo__environment" not in registry.names()  # the server's own deny: never registered
        listed = {s.name: sorted((t.full_name, t.allowed) for t in s.tools) for s in tools.catalog()}
        assert ("echo__environment", False) in listed["echo"] and ("echo__echo", True) in listed["echo"]
        assert all(not ok for _, ok in listed["quiet"]) and len(listed["quiet"]) == 11
    finally:
        await tools.stop()


async def test_a_server_that_cannot_start_says_why(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {
        "gone": {"command": str(tmp_path / "no-such-server"), "allow": ["gone__*"]}}}}, env={})
    tools = McpTools(cfg.tools, ToolRegistry())
    tools.start()
    try:
        await tools.settled(20)
        [status] = tools.catalog()
    finally:
        await tools.stop()
    assert status.state == "restarting" and status.tools == ()
    assert status.last_error == (f"FileNotFoundError: [Errno 2] No such file or directory: "
                                 f"'{tmp_path / 'no-such-server'}'")


def test_allow_and_deny_globs():
    assert allowed("files__read_file", ("files__read_*",), ())
    assert not allowed("files__read_file", ("files__*",), ("files__read_*",))
    assert not allowed("files__read_file", (), ())  # nothing until allowed
    assert not allowed("other__read_file", ("files__*",), ())


async def test_a_streamable_http_server_with_its_headers(tmp_path, model):
    model.script(ToolCall("web__echo", {"text": "over http"}), Reply("done"))
    async with http_echo_server(value="Bearer http-token-1234") as url:
        servers = {"web": {"url": url, "headers": {"Authorization": "Bearer http-token-1234"}, "allow": ["web__*"]},
                   "nokey": {"url": url, "allow": ["nokey__*"]}}
        async with running_gateway(tmp_path, model, tools={"mcp_servers": servers}) as gw:
            await _ready(gw, "web")
            api = ApiClient(gw)
            assert await api.say("di", "over http please") == "done"
            await api.close()
            nokey = gw.mcp.servers["nokey"]
            await eventually(lambda: nokey.restarts >= 1, 10, "the server without its header refused")
            assert not nokey.available and "nokey__echo" not in gw.tools.names()
    assert [m["content"] for m in _tool_messages(model.requests[-1])] == ["echo: over http"]


def test_a_streamed_reply_names_the_tool_and_its_server_while_it_runs():
    from gateway.turn import tool_status

    assert tool_status("files__read_file") == "using read file (files)…"
    assert tool_status("memory") == "updating my notes…"
