"""The client the official MCP conformance suite drives: the gateway's own MCP client (McpServer, over
streamable HTTP), pointed at the suite's server for one scenario.

    python -m tests.conformance.client http://localhost:PORT/mcp     # MCP_CONFORMANCE_SCENARIO names it

It connects as the daemon does (``mode="auto"``: ``server/discover``, then the ``initialize`` handshake
for a legacy server), reads the tools, and calls each with arguments that fit its input schema.  A
question the server asks (elicitation) is answered as a user who takes every default would answer it
through the chat (gateway.tools_mcp.elicit: the form asked field by field, each skipped field given its
default).  Exits 0 when every call returned, 1 otherwise.

For the ``auth/*`` scenarios the server is configured ``auth: operator``: the gateway's own sign-in
(gateway.tools_mcp.oauth and .signin, with a store and a key in a throw-away home) discovers the
authorisation server, registers or uses its Client ID Metadata Document, and makes the link; the
person's browser is played here (the link opened, the authorisation server's redirect read) and
the code handed to the same callback the local API serves.  Only the chat that would carry the
link is missing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

import httpx
from mcp import types

import state
from gateway.config import McpServerConfig
from gateway.tools_mcp.elicit import form_content, form_questions
from gateway.tools_mcp.oauth import AuthError, OAuthSettings
from gateway.tools_mcp.server import Asking, McpServer
from gateway.tools_mcp.signin import SignIns

CIMD_URL = "https://conformance-test.local/client-metadata.json"  # the document the suite's server knows
REDIRECT = "http://127.0.0.1:9/mcp/oauth/callback"  # never reached: the redirect is read, not followed
MUST = "error: the user must authorise"

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


def browser(signins: SignIns):
    """The sign_in of McpServer, as a person who opens the link and says yes: the authorisation server's
    redirect is read and its query handed to the callback the local API serves."""
    async def sign_in(server: McpServer, asking: Asking, principal: str) -> str:
        assert server.auth is not None
        try:
            link = await server.auth.begin(principal)
        except AuthError as exc:
            log.error("the sign-in could not start: %s", exc)
            return f"{MUST} {server.name} first, and starting the sign-in failed: {exc}"
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.get(link)
        location = answer.headers.get("location", "")
        if not location.startswith(REDIRECT):
            log.error("the authorisation server answered %d, not a redirect to the callback", answer.status_code)
            return f"{MUST} {server.name} first (the authorisation server did not send the browser back)"
        status, page = await signins.callback(dict(parse_qsl(urlparse(location).query)))
        log.info("the callback answered %d", status)
        return f"{MUST} {server.name} first. A sign-in link was sent to them; once they have signed in, call again."

    return sign_in


async def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "?")
    auth = "operator" if scenario.startswith("auth/") else "none"
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")  # a pre-registered client, if any
    cfg = McpServerConfig(url=url, allow=("*",), timeout_seconds=20, auth=auth, client_id=context.get("client_id"),
                          client_secret=context.get("client_secret") or "")
    with tempfile.TemporaryDirectory() as home:
        db = state.AsyncSessionDB(state.SessionDB(Path(home) / "state.db"))
        signins = SignIns(db, Path(home), OAuthSettings(redirect_uri=REDIRECT, client_id_url=CIMD_URL))
        server = McpServer("conformance", cfg, elicit=takes_every_default, auth=signins.auth_for("conformance", cfg),
                           sign_in=browser(signins))
        server.start()
        try:
            return await _run(scenario, server)
        finally:
            await server.stop()
            await db.close()


async def _run(scenario: str, server: McpServer) -> int:
    await asyncio.wait_for(server.settled.wait(), 20)
    if server.state == "unauthorised":  # nobody signed in yet: what the <server>__authorise tool does
        log.info("%s: %s", scenario, (await server.authorise(None))[:200])
        for _ in range(200):
            if server.available:
                break
            await asyncio.sleep(0.1)
    if not server.available:
        log.error("%s: no connection: %s", scenario, server.last_error)
        return 1
    failed = False
    for tool in server.tools.values():
        text = await server.call(tool.name, arguments_for(tool.parameters))
        for _ in range(3):  # a step-up (403 insufficient_scope) signs in again with the scope asked for
            if not text.startswith(MUST):
                break
            for _ in range(200):
                if server.available:
                    break
                await asyncio.sleep(0.1)
            text = await server.call(tool.name, arguments_for(tool.parameters))
        log.info("%s: %s -> %s", scenario, tool.name, text[:200])
        failed = failed or text.startswith("error:")
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.exit(asyncio.run(main(sys.argv[-1])))
