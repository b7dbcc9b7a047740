"""A stdio MCP server that dies is marked down at once, not at its next ping: its stdout ends (or its
process exits) and the gateway says so on ``/healthz`` within a second; a call meanwhile answers that
the tool is unavailable.  The server is the real SDK one (tests/mcp_servers/echo_server.py), killed
with SIGKILL within a second of its first ping wait (ten seconds, the default): only the end of the
transport can be what noticed."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.config import config_from_dict
from gateway.retry import Backoff
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, running_gateway

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ECHO = str(Path(__file__).resolve().parent / "mcp_servers" / "echo_server.py")
NO_PINGS = 600.0  # a ping never comes within a test
UNAVAILABLE = ("error: echo__echo is unavailable right now (the echo tool server is restarting); "
               "try again later or do without it")


def echo_server() -> dict:
    return {"command": sys.executable, "args": [ECHO], "env": {"PYTHONCOERCECLOCALE": "0"}, "allow": ["echo__*"]}


async def test_healthz_shows_a_killed_server_down_within_a_second(tmp_path):
    async with FakeModel() as model, running_gateway(tmp_path, model, tools={"mcp_servers": {"echo": echo_server()}}) as gw:
        server = gw.mcp.servers["echo"]
        await eventually(lambda: server.available, 20, lambda: f"echo ready ({server.state}: {server.last_error})")
        pid = int(await server.call("pid", {}))
        url = f"http://127.0.0.1:{gw.api.bound_port}/healthz"
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as r:
                assert (await r.json())["tool_servers"]["echo"]["state"] == "ready"
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            seen = None
            while time.monotonic() < killed + 1.0:  # the bound, as a deadline for the polling
                async with http.get(url) as r:
                    seen = (await r.json())["tool_servers"]["echo"]
                if seen["state"] != "ready":
                    break
            assert seen is not None and seen["state"] == "restarting", f"still {seen} 1 s after the kill"
            # it comes back by itself, a new process
            await eventually(lambda: server.available, 20, "echo restarted")
            assert int(await server.call("pid", {})) != pid
            async with http.get(url) as r:
                assert (await r.json())["tool_servers"]["echo"]["state"] == "ready"


async def test_a_call_right_after_the_kill_answers_unavailable_and_says_why(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": {"echo": echo_server()}}}, env={})
    # a long first backoff: the server stays down long enough to be called while it is
    tools = McpTools(cfg.tools, ToolRegistry(), ping_seconds=NO_PINGS, backoff=Backoff(base=60.0, cap=60.0))
    tools.start()
    try:
        server = tools.servers["echo"]
        await eventually(lambda: server.available, 20, lambda: f"echo ready ({server.state}: {server.last_error})")
        pid = int(await server.call("pid", {}))
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: server.state == "restarting", 1.0, "the kill noticed within a second")
        assert await server.call("echo", {"text": "anyone?"}) == UNAVAILABLE
        await eventually(lambda: server.restarts == 1, 5, "the connection's end recorded")
        assert server.last_error is not None and server.last_error.startswith("the server stopped: its ")
        [status] = tools.catalog()
        assert status.state == "restarting" and status.last_error == server.last_error
    finally:
        await tools.stop()
