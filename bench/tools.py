"""MCP tool calls: the gateway's overhead per call, and memory over many large results.

    .venv/bin/python bench/tools.py                          # 500 timed calls per transport, 1,000 x 1 MB
    .venv/bin/python bench/tools.py --calls 2000 --big 10000 # the issue's figures (10,000 x 1 MB: minutes)

Servers: tests/mcp_servers/echo_server.py (SDK 2.x: the 2026-07-28 revision), over stdio (started as the daemon starts one, through the
clean environment and its own transport) and over streamable HTTP (served in-process by uvicorn on 127.0.0.1),
and tests/mcp_servers/legacy_server.py (SDK 1.x, the legacy revision: the initialize handshake) over stdio,
when ``make mcp-legacy`` made its environment.

Overhead: ``McpServer.call`` (what a turn's tool call runs: the concurrency slot, the SDK call with its
timeout, the result turned into capped text) against the SDK's own ``ClientSession.call_tool`` on a
second connection to the same server (the SDK's ``Client(mode="auto")``), the two timed in turns after
20 untimed calls of each; the difference of the
two is what the gateway adds beyond the server and the SDK.  A turn adds the crash journal around
each call (``gateway.turn``: one write of what the turn produced before the call, one after), timed
on a SQLite store with a turn's worth of produced messages.  Memory: RSS of this process while
``--big`` calls return 1 MB each (each result cut to 32 KB, as the model would get it), printed every
``--every`` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcp import Client

from gateway.config import config_from_dict
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools
from gateway.turn_journal import TurnJournal
from state import AsyncSessionDB
from tests.mcp_servers.http_server import http_echo_server

ECHO = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "echo_server.py")
LEGACY = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "legacy_server.py")
LEGACY_PYTHON = Path(__file__).resolve().parent.parent / ".venv-mcp1" / "bin" / "python"
TOKEN = "Bearer bench-token-123456"


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def _timed(call, n: int) -> list[float]:
    for _ in range(20):
        await call()
    out = []
    for _ in range(n):
        began = time.perf_counter()
        await call()
        out.append((time.perf_counter() - began) * 1000)
    return out


async def _timed_pairs(first, second, n: int) -> tuple[list[float], list[float]]:
    for _ in range(20):
        await first()
        await second()
    a, b = [], []
    for _ in range(n):
        for call, out in ((first, a), (second, b)):
            began = time.perf_counter()
            await call()
            out.append((time.perf_counter() - began) * 1000)
    return a, b


async def _overhead(label: str, server, n: int) -> None:
    # the SDK alone, on a second connection opened the same way (the same transport, mode="auto")
    # timed in turns (one of each, n times) so that neither gets the machine's quieter moments
    async with Client(server._transport(), mode="auto", cache=None) as raw:
        version = raw.protocol_version
        pair = await _timed_pairs(lambda: raw.call_tool("echo", {"text": "ping"}, read_timeout_seconds=60.0),
                                  lambda: server.call("echo", {"text": "ping"}), n)
    sdk, ours = pair
    label = f"{label} ({version})"
    p50, p95 = _pct(ours, 50), _pct(ours, 95)
    b50, b95 = _pct(sdk, 50), _pct(sdk, 95)
    print(f"{label:24} gateway call p50 {p50:6.2f} ms  p95 {p95:6.2f} ms | SDK alone p50 {b50:6.2f} ms  "
          f"p95 {b95:6.2f} ms | overhead p50 {p50 - b50:+.2f} ms  p95 {p95 - b95:+.2f} ms  ({n} calls)")


async def _journal(home: str, n: int) -> None:
    db = await AsyncSessionDB.open(Path(home) / "state.db")
    try:
        await db.sessions.create("s", "bench")
        message_id = await db.messages.append("s", "user", "use the tools")
        journal = TurnJournal(db, (message_id,), "s", None)
        step = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "stdio__echo", "arguments": '{"text": "ping"}'}}]}
        produced = [step, {"role": "tool", "tool_call_id": "c1", "name": "stdio__echo", "content": "x" * 32768}] * 2
        produced.append(step)

        async def both() -> None:  # the write before a call and the one after it
            await journal.write(produced, "c1")
            await journal.write(produced, None)

        times = await _timed(both, n)
        print(f"journal  2 writes per call p50 {_pct(times, 50):6.2f} ms  p95 {_pct(times, 95):6.2f} ms  "
              f"(SQLite, {len(produced)} produced messages of ~32 KB results; {n} calls)")
    finally:
        await db.close()


async def main(calls: int, big: int, every: int) -> None:
    home = tempfile.mkdtemp(prefix="sb-bench-tools-")
    async with http_echo_server(value=TOKEN) as url:
        servers = {
            "stdio": {"command": sys.executable, "args": [ECHO], "allow": ["stdio__*"]},
            "http": {"url": url, "headers": {"Authorization": TOKEN}, "allow": ["http__*"]},
        }
        if LEGACY_PYTHON.exists():
            servers["legacy"] = {"command": str(LEGACY_PYTHON), "args": [LEGACY], "allow": ["legacy__*"]}
        else:
            print(f"no legacy figures: {LEGACY_PYTHON} is missing (make mcp-legacy)")
        cfg = config_from_dict({"home": home, "tools": {"mcp_servers": servers}}, env={})
        tools = McpTools(cfg.tools, ToolRegistry())
        tools.start()
        try:
            await tools.settled(30)
            for name in servers:
                await _overhead(name, tools.servers[name], calls)
            await _journal(home, calls)
            server = tools.servers["stdio"]
            print(f"RSS before {big:,} calls of 1 MB (stdio): {_rss_mb():.1f} MB")
            began = time.perf_counter()
            for i in range(1, big + 1):
                text = await server.call("big", {"size": 1_000_000})
                assert len(text) < 33_000, len(text)
                if i % max(1, every) == 0:
                    print(f"  after {i:6,} calls: RSS {_rss_mb():.1f} MB ({time.perf_counter() - began:.0f} s)")
        finally:
            await tools.stop()


if __name__ == "__main__":
    logging.disable(logging.INFO)  # the servers' and the HTTP client's per-request lines
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="timed echo calls per transport")
    parser.add_argument("--big", type=int, default=1000, help="calls returning 1 MB each, for the RSS figure")
    parser.add_argument("--every", type=int, default=1000, help="print RSS after every this many of them")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.big, args.every))
