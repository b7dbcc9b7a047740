"""The client the official MCP conformance suite drives: the gateway's own MCP client (McpServer, over
streamable HTTP), pointed at the suite's server for one scenario.

    python -m tests.conformance.client http://localhost:PORT/mcp     # MCP_CONFORMANCE_SCENARIO names it

It connects as the daemon does (``mode="auto"``: ``server/discover``, then the ``initialize`` handshake
for a legacy server), reads the tools, and calls each with arguments that fit its input schema.  A
question the server asks (elicitation) is answered as a user who takes every default would answer it
through the chat (gateway.tools_mcp.elicit: the form asked field by field, each skipped field given its
default).  Exits 0 when every call returned, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from mcp import types

from gateway.config import McpServerConfig
from gateway.tools_mcp.elicit import form_content, form_questions
from gateway.tools_mcp.server import Asking, McpServer

log = logging.getLogger("conformance")


async def takes_every_default(asking: Asking, params: types.ElicitRequestParams) -> types.ElicitResult:
    if not isinstance(params, types.ElicitRequestFormParams):
        return types.ElicitResult(action="decline")
    questions = form_questions(params.requested_schema)
    if any(q.required and q.default is None for q in questions):
        return types.ElicitResult(action="cancel")  # a field nobody here can answer
    return types.ElicitResult(action="accept", content=form_content(questions, {}))  # type: ignore[arg-type]


def arguments_for(schema: dict) -> dict:
    out: dict = {}
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        out[name] = {"number": 2, "integer": 2, "boolean": True, "string": "conformance"}.get(kind, None)
    return out


async def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "?")
    server = McpServer("conformance", McpServerConfig(url=url, allow=("*",), timeout_seconds=20),
                       elicit=takes_every_default)
    server.start()
    try:
        await asyncio.wait_for(server.settled.wait(), 20)
        if not server.available:
            log.error("%s: no connection: %s", scenario, server.last_error)
            return 1
        failed = False
        for tool in server.tools.values():
            text = await server.call(tool.name, arguments_for(tool.parameters))
            log.info("%s: %s -> %s", scenario, tool.name, text[:200])
            failed = failed or text.startswith("error:")
        return 1 if failed else 0
    finally:
        await server.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.exit(asyncio.run(main(sys.argv[-1])))
