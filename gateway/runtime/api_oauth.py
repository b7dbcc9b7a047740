"""The MCP servers' OAuth paths on the local API: where sign-ins come back, and the client's document.

    paths = SignInPaths(signins)     # gateway.tools_mcp.signin.SignIns
    paths.mount(app)                 # GET /mcp/oauth/callback, GET /mcp/oauth/client.json
    paths.owns(request)              # LocalApi lets them past its bearer token

A browser follows the authorisation server's redirect to the callback, and an authorisation server
fetches the Client ID Metadata Document: neither carries the API's token.  The callback's check is
the flow's ``state`` (unguessable, used once, found in the store); the document is public by design.
"""

from __future__ import annotations

from aiohttp import web

from gateway.tools_mcp.signin import CALLBACK_PATH, CLIENT_DOCUMENT_PATH, SignIns

PATHS = (CALLBACK_PATH, CLIENT_DOCUMENT_PATH)


class SignInPaths:
    def __init__(self, signins: SignIns) -> None:
        self.signins = signins

    def mount(self, app: web.Application) -> None:
        app.router.add_get(CALLBACK_PATH, self.callback)
        app.router.add_get(CLIENT_DOCUMENT_PATH, self.client_document)

    def owns(self, request: web.Request) -> bool:
        return request.path in PATHS

    async def callback(self, request: web.Request) -> web.Response:
        """Where an MCP server's authorisation server sends the browser back (the code and the state)."""
        query = {k: v for k, v in request.query.items() if k in ("code", "state", "iss", "error")}
        status, page = await self.signins.callback(query)
        return web.Response(status=status, text=page, content_type="text/html",
                            headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    async def client_document(self, request: web.Request) -> web.Response:
        """The Client ID Metadata Document authorisation servers fetch (tools.oauth.client_id_url)."""
        return web.json_response(self.signins.client_document())
