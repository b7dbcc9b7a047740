"""A real MCP server on the legacy revision (2025-11-25 and before): the SDK 1.x's FastMCP, over stdio.

    .venv-mcp1/bin/python tests/mcp_servers/legacy_server.py     # `make mcp-legacy` makes .venv-mcp1

It runs in its own virtual environment with ``mcp>=1.20,<2`` (``tests/mcp_legacy.py`` finds it), so
the gateway's client (SDK 2.x, ``mode="auto"``) is tested against a server that knows only the
``initialize`` handshake, pings, ``notifications/tools/list_changed`` and server-to-client
``elicitation/create`` requests, as the many servers not yet moved to 2.x do.  It imports nothing of
ours: only the 1.x SDK and the standard library.

Its tools: ``echo``, ``slow`` and ``calls`` (as in echo_server.py: started, running now, cancelled by
the client), ``grow`` (adds ``late`` and sends list_changed), ``big`` (N bytes), ``die`` (exits mid-call)
``book`` (asks the user, through elicitation, for a city and whether to go ahead) and ``connect`` (gives
the user a link to open, URL-mode elicitation, then says that step is done: notifications/elicitation/complete).
"""

from __future__ import annotations

import asyncio
import json
import os

from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel, Field


class Trip(BaseModel):
    city: str = Field(description="Where to", json_schema_extra={"enum": ["Paris", "Rome", "Oslo"]})
    confirm: bool = Field(description="Book it now?")
    note: str = Field(default="", description="Anything to tell the hotel")


def build() -> FastMCP:
    server = FastMCP("legacy")
    running = {"now": 0, "started": 0, "cancelled": 0}

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answer after this many seconds."""
        running["now"] += 1
        running["started"] += 1
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
        return json.dumps(running)

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
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    async def book(ctx: Context) -> str:
        """Book a trip: asks the user where to and whether to go ahead."""
        answer = await ctx.elicit("Which trip shall I book?", schema=Trip)
        if answer.action != "accept" or answer.data is None:
            return f"not booked ({answer.action})"
        trip = answer.data
        return f"booked {trip.city} (note: {trip.note or 'none'})" if trip.confirm else f"not booked: {trip.city} unconfirmed"

    @server.tool()
    async def connect(ctx: Context) -> str:
        """Connect the user's calendar: they open a link (URL elicitation); then the step is reported done."""
        answer = await ctx.elicit_url("Connect your calendar so I can read it.",
                                      "https://calendar.example/connect?session=e1", "e1")
        if answer.action != "accept":
            return f"not connected ({answer.action})"
        await ctx.session.send_elicit_complete("e1")
        return "calendar connected"

    return server


if __name__ == "__main__":
    build().run("stdio")
