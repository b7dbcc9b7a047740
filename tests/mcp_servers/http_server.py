"""The echo MCP server over streamable HTTP, served in-process by uvicorn on 127.0.0.1, port 0."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

import uvicorn

from tests.mcp_servers.echo_server import http_app


def _requiring(app, header: str, value: str):
    """``app`` behind a check of one request header: 401 without it (what a token-protected server does)."""
    wanted = (header.lower().encode(), value.encode())

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and wanted not in list(scope.get("headers", [])):
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing credentials"})
            return
        await app(scope, receive, send)

    return guarded


@asynccontextmanager
async def http_echo_server(*, header: str = "Authorization", value: str = "Bearer mcp-http-test-token"
                           ) -> AsyncIterator[str]:
    """Serve the echo server; yields its URL (``http://127.0.0.1:<port>/mcp``)."""
    app = http_app()
    config = uvicorn.Config(_requiring(app, header, value), host="127.0.0.1", port=0, log_level="warning",
                            lifespan="on")
    # uvicorn's lifespan runs the app's (the MCP session manager); the guard passes it through
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="test:mcp-http")
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
