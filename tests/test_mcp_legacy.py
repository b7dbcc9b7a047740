"""Servers on the legacy MCP revision (before 2026-07-28: the initialize handshake, pings, list_changed
notifications) still work with the gateway's SDK 2.x client: a real SDK 1.x server, in its own
environment (tests/mcp_legacy.py), and the SDK 2.x echo server beside it on 2026-07-28."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from gateway.config import config_from_dict
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools
from tests.harness import eventually
from tests.mcp_legacy import legacy_server, needs_legacy
from tests.test_mcp_tools import ECHO, NO_COERCION

pytestmark = [pytest.mark.processes, pytest.mark.slow, needs_legacy]


def _tools(tmp_path, **servers) -> tuple[McpTools, ToolRegistry]:
    cfg = config_from_dict({"home": str(tmp_path), "tools": {"mcp_servers": servers}}, env={})
    registry = ToolRegistry()
    return McpTools(cfg.tools, registry), registry


async def _ready(tools: McpTools, name: str):
    server = tools.servers[name]
    await eventually(lambda: server.available, 30, lambda: f"{name} ready ({server.state}: {server.last_error})")
    return server


async def test_a_legacy_and_a_new_server_side_by_side_each_on_its_own_revision(tmp_path):
    tools, registry = _tools(tmp_path, legacy=legacy_server(),
                             echo={"command": sys.executable, "args": [ECHO], "env": NO_COERCION, "allow": ["echo__*"]})
    tools.start()
    try:
        legacy, echo = await _ready(tools, "legacy"), await _ready(tools, "echo")
        assert (legacy.protocol, echo.protocol) == ("2025-11-25", "2026-07-28")
        assert {s.name: s.protocol for s in tools.catalog()} == {"echo": "2026-07-28", "legacy": "2025-11-25"}
        assert await legacy.call("echo", {"text": "old"}) == "echo: old"
        assert await echo.call("echo", {"text": "new"}) == "echo: new"
        assert len(await legacy.call("big", {"size": 100_000})) > 32_000  # cut at the cap, marked
        # list_changed as a notification on the old revision, a subscriptions/listen event on the new
        for server, name in ((legacy, "legacy__late"), (echo, "echo__late")):
            assert name not in registry.names()
            assert await server.call("grow", {}) == "grown"
            await eventually(lambda n=name: n in registry.names(), 10, f"{name} registered")
            assert await server.call("late", {}) == "late but here"
    finally:
        await tools.stop()


async def test_a_legacy_call_that_times_out_is_cancelled_in_the_server(tmp_path):
    tools, _ = _tools(tmp_path, legacy=legacy_server(timeout_seconds=0.5))
    tools.start()
    try:
        server = await _ready(tools, "legacy")
        assert await server.call("slow", {"seconds": 5}) == "error: legacy__slow did not answer within 0.5 seconds"

        async def told() -> bool:
            return json.loads(await server.call("calls", {})) == {"now": 0, "started": 1, "cancelled": 1}

        await eventually(told, 5, "the timed-out call cancelled in the server (notifications/cancelled)")
    finally:
        await tools.stop()


async def test_a_legacy_server_killed_while_idle_is_down_at_once_and_restarted(tmp_path):
    tools, _ = _tools(tmp_path, legacy=legacy_server())
    tools.start()
    try:
        server = await _ready(tools, "legacy")
        first = await server.call("echo", {"text": "before"})
        assert first == "echo: before"
        children = _children()
        assert children, "the legacy server runs as a child of this process"
        for child in children:
            os.kill(child, signal.SIGKILL)
        await eventually(lambda: server.state == "restarting", 5, "marked down at once")
        assert (await server.call("echo", {"text": "x"})).startswith("error: legacy__echo is unavailable right now")
        await _ready(tools, "legacy")
        assert await server.call("echo", {"text": "after"}) == "echo: after"
    finally:
        await tools.stop()


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                out.append(int(entry))
    return out
