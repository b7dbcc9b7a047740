"""MCP tool calls are visible and counted: the call and its result in `sessions show`, the export and
the dashboard transcript, and per tool in /metrics (calls by outcome, latency).  The real echo server."""

from __future__ import annotations

import json

import aiohttp
import pytest
from click.testing import CliRunner

from gateway.cli.sessions import sessions
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import ApiClient, running_gateway
from tests.test_dashboard import TOKEN, Browser
from tests.test_mcp_tools import _ready, echo_server

pytestmark = [pytest.mark.processes, pytest.mark.slow]


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def test_tool_calls_show_in_the_transcripts_and_are_counted_per_tool(home, model):
    model.script(ToolCall("echo__echo", {"text": "ping-7731"}), ToolCall("echo__fail", {"why": "disk-full-4410"}),
                 Reply("done with tools"))
    async with running_gateway(home, model, tools={"mcp_servers": {"echo": echo_server()}},
                               ui={"enabled": True}, api={"token": TOKEN}) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        assert await api.say("ann", "use your tools") == "done with tools"
        await api.close()
        session_id = await gw.db.routes.get("agent:main:api:dm:ann")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/metrics",
                                headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                metrics = await r.text()
        browser = Browser(gw)
        try:
            await browser.login()
            _, page, _ = await browser.get(f"/ui/sessions/{session_id}")
            _, exported, _ = await browser.get(f"/ui/sessions/{session_id}/export.json")
        finally:
            await browser.close()
    shown = CliRunner().invoke(sessions, ["show", session_id], catch_exceptions=False).output

    for text in (shown, page):  # the call with its arguments, and each result, in order
        assert text.index("echo__echo") < text.index("ping-7731") < text.index("echo__fail") < text.index("disk-full-4410")
        assert "echo: ping-7731" in text
        assert "Error executing tool fail: cannot do that: disk-full-4410" in text
    stored = json.loads(exported)["messages"]
    assert [(m["role"], m.get("tool_name")) for m in stored] == [
        ("user", None), ("assistant", None), ("tool", "echo__echo"), ("assistant", None), ("tool", "echo__fail"),
        ("assistant", None)]
    assert json.loads(stored[1]["tool_calls"] if isinstance(stored[1]["tool_calls"], str)
                      else json.dumps(stored[1]["tool_calls"]))[0]["function"]["name"] == "echo__echo"

    assert 'switchboard_tool_calls_total{outcome="ok",tool="echo__echo"} 1.0' in metrics
    assert 'switchboard_tool_calls_total{outcome="error",tool="echo__fail"} 1.0' in metrics
    assert 'switchboard_tool_call_seconds_count{tool="echo__echo"} 1.0' in metrics
