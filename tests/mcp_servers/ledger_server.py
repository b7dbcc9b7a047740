"""A real MCP server (SDK, stdio) whose one tool leaves a trace: each call appends a line to a file, so a
test can count how many times a call really ran and with exactly which arguments.

    python tests/mcp_servers/ledger_server.py
"""

from __future__ import annotations

import asyncio
import json

from mcp.server.mcpserver import MCPServer


def build() -> MCPServer:
    server = MCPServer("ledger")

    @server.tool()
    def append(path: str, text: str) -> str:
        """Append a line to the file at ``path``."""
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"text": text}) + "\n")
        return f"appended {text!r}"

    @server.tool()
    async def append_slowly(path: str, text: str, seconds: float) -> str:
        """Append a line to the file at ``path``, then take ``seconds`` to answer."""
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"text": text}) + "\n")
        await asyncio.sleep(seconds)
        return f"appended {text!r} slowly"

    @server.tool()
    def look(path: str) -> str:
        """How many lines the file at ``path`` holds."""
        try:
            with open(path, encoding="utf-8") as src:
                return str(sum(1 for _ in src))
        except FileNotFoundError:
            return "0"

    return server


if __name__ == "__main__":
    build().run("stdio")
