"""The MCP servers' OAuth paths on the local API: where sign-ins come back, and the client's document.

    paths = SignInPaths(signins, trusted_proxies=cfg.ui.trusted_proxies)   # gateway.tools_mcp.signin.SignIns
    paths.mount(app)                 # GET /mcp/oauth/callback, GET /mcp/oauth/client.json
    paths.owns(request)              # LocalApi lets them past its bearer token

A browser follows the authorisation server's redirect to the callback, and an authorisation server
fetches the Client ID Metadata Document: neither carries the API's token.  The callback's check is
the flow's ``state`` (unguessable, used once, found in the store); the document is public by design.

Each callback costs a store write (the flow is taken from the store as it is read), so callbacks are
limited: :data:`CALLBACK_PER_CLIENT` a minute per client address (read as the dashboard reads it,
through ``ui.trusted_proxies`` only) and :data:`CALLBACK_OVERALL` from all addresses.  Past it the
answer is 429 with ``Retry-After``, before anything is read or written.  A person signing in needs one
callback per sign-in.
"""

from __future__ import annotations

from typing import Iterable

from aiohttp import web

from gateway.runtime.dashboard.guard import ClientLimit, Proxies
from gateway.tools_mcp.signin import CALLBACK_PATH, CLIENT_DOCUMENT_PATH, SignIns

PATHS = (CALLBACK_PATH, CLIENT_DOCUMENT_PATH)
CALLBACK_PER_CLIENT, CALLBACK_OVERALL, CALLBACK_WINDOW = 10, 120, 60.0  # callbacks a minute: one address, all
NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


class SignInPaths:
    def __init__(self, signins: SignIns, *, trusted_proxies: Iterable[str] = (),
                 limit: ClientLimit | None = None) -> None:
        self.signins = signins
        self.proxies = Proxies(trusted_proxies)
        self.limit = limit or ClientLimit(CALLBACK_PER_CLIENT, CALLBACK_OVERALL, CALLBACK_WINDOW)

    def mount(self, app: web.Application) -> None:
        app.router.add_get(CALLBACK_PATH, self.callback)
        app.router.add_get(CLIENT_DOCUMENT_PATH, self.client_document)

    def owns(self, request: web.Request) -> bool:
        return request.path in PATHS

    async def callback(self, request: web.Request) -> web.Response:
        """Where an MCP server's authorisation server sends the browser back (the code and the state)."""
        client = self.proxies.client(request.remote, request.headers, tls=request.secure).address
        wait = self.limit.retry_after(client)
        if wait:
            return web.Response(status=429, text=f"Too many sign-in callbacks from this address; try again in "
                                                 f"{wait} seconds.", headers={**NO_STORE, "Retry-After": str(wait)})
        self.limit.count(client)
        query = {k: v for k, v in request.query.items() if k in ("code", "state", "iss", "error")}
        status, page = await self.signins.callback(query)
        return web.Response(status=status, text=page, content_type="text/html", headers=NO_STORE)

    async def client_document(self, request: web.Request) -> web.Response:
        """The Client ID Metadata Document authorisation servers fetch (tools.oauth.client_id_url)."""
        return web.json_response(self.signins.client_document())
