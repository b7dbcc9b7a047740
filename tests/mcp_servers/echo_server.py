"""A real MCP server, written with the SDK, that the tests start as a stdio subprocess (or serve over HTTP).

    python tests/mcp_servers/echo_server.py            # stdio
    http_app()                                         # the same tools as a streamable HTTP Starlette app

Its tools: ``echo``, ``pid``, ``environment`` (its whole os.environ, as JSON), ``slow`` (and ``peak``, the most
that ran at once, and ``calls``: how many started and how many the client cancelled), ``fail``, ``big`` (a
result of N bytes), ``die`` (the process exits in the middle of the call) and ``grow`` (adds the tool
``late`` and tells the client its list changed) and ``book`` (asks the user, through elicitation, for a city
and whether to go ahead).  With ``REQUEST_STATE_KEY`` set, the ``request_state`` of its InputRequiredResult is
sealed under that key instead of one made at start, so a call's round outlives this process (as a deployed
server's does); without it, a request_state from before a restart is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated, Literal

from mcp.server.mcpserver import AcceptedElicitation, Context, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field


class Trip(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"] = Field(description="Where to")
    confirm: bool = Field(description="Book it now?")
    note: str = Field(default="", description="Anything to tell the hotel")


def ask_trip() -> Elicit[Trip]:
    return Elicit("Which trip shall I book?", Trip)


def build(name: str = "echo") -> MCPServer:
    key = os.environ.get("REQUEST_STATE_KEY")
    server = MCPServer(name, request_state_security=RequestStateSecurity(keys=[key]) if key else None)

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.tool()
    def environment() -> str:
        """This server's environment variables, as JSON."""
        return json.dumps(dict(os.environ), sort_keys=True)

    running = {"now": 0, "peak": 0, "started": 0, "cancelled": 0}

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answer after this many seconds."""
        running["now"] += 1
        running["started"] += 1
        if os.environ.get("CALL_LOG"):  # a record that outlives this process (the crash tests read it)
            with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as log:
                log.write(f"slow {seconds} started in {os.getpid()}\n")
        running["peak"] = max(running["peak"], running["now"])
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:  # the client sent notifications/cancelled for this call
            running["cancelled"] += 1
            raise
        finally:
            running["now"] -= 1
        return f"slept {seconds}"

    @server.tool()
    def calls() -> str:
        """How many calls of ``slow`` started, run now and were cancelled by the client, as JSON."""
        return json.dumps({k: running[k] for k in ("started", "now", "cancelled")})

    @server.tool()
    def peak() -> str:
        """The most calls of ``slow`` that ran at once."""
        return str(running["peak"])

    @server.tool()
    def fail(why: str) -> str:
        """Always fails (a ToolError: MCPServer shows the model the message of that one, not of others)."""
        raise ToolError(f"cannot do that: {why}")

    @server.tool()
    def big(size: int) -> str:
        """A result of ``size`` bytes."""
        return "x" * size

    @server.tool()
    async def die() -> str:
        """The server process exits in the middle of this call."""
        await asyncio.sleep(0.05)
        os._exit(3)

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Adds the tool ``late``."""
        def late() -> str:
            """A tool that came later."""
            return "late but here"

        server.add_tool(late, name="late")
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await ctx.notify_tools_changed()  # to the client's subscriptions/listen stream
        else:
            await ctx.session.send_tool_list_changed()  # notifications/tools/list_changed
        return "grown"

    @server.tool()
    def book(trip: Annotated[ElicitationResult[Trip], Resolve(ask_trip)]) -> str:
        """Book a trip: asks the user where to and whether to go ahead (2026-07-28: InputRequiredResult)."""
        if not isinstance(trip, AcceptedElicitation):
            return f"not booked ({trip.action})"
        got = trip.data
        if os.environ.get("CALL_LOG"):  # a record that outlives this process (the crash tests read it)
            with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as log:
                log.write(f"book {got.city} {got.confirm} in {os.getpid()}\n")
        return f"booked {got.city} (note: {got.note or 'none'})" if got.confirm else f"not booked: {got.city} unconfirmed"

    return server


def http_app():
    return build("echo-http").streamable_http_app()


if __name__ == "__main__":
    build().run("stdio")
