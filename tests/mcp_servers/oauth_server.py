"""A real OAuth 2.1 authorisation server and an MCP server that requires its tokens, both on 127.0.0.1.

    async with oauth_servers() as servers:
        servers.mcp_url       # http://127.0.0.1:P/mcp: an SDK 2.x MCPServer whose every request needs a bearer
        servers.issuer        # http://127.0.0.1:Q: the SDK's own authorisation-server routes (mcp.server.auth)
        servers.provider      # what it issued, revoked and was asked, for the tests to look at
        await servers.browser(link, account="ann")   # the person opens the link, signed in there as "ann"

The authorisation server is the SDK's (``create_auth_routes``: metadata, /authorize with PKCE S256,
/token, /register, /revoke) over an in-memory provider that checks what a real one checks: the
client is registered (or, with ``cimd=True``, its Client ID Metadata Document is fetched from its URL
and must list the redirect URI), the code is used once, by the client it was issued to, within its
time; refresh tokens rotate; the resource indicator binds each token to the MCP server.  The MCP
server is the SDK's ``MCPServer`` with ``AuthSettings`` (it serves its protected-resource metadata and
answers 401 with ``WWW-Authenticate: Bearer resource_metadata=...``); its tool ``whoami`` says whose
token the call carried; ``share`` asks the user first (elicitation: an InputRequiredResult on 2026-07-28).
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
import socket
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, AsyncIterator

import httpx
import uvicorn
from mcp.server.auth.handlers.revoke import RevocationRequest
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import AcceptedElicitation, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyHttpUrl, BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

_account: contextvars.ContextVar[str] = contextvars.ContextVar("account", default="nobody")

# The SDK's revocation request model declares ``client_secret: str | None`` without a default, so a public
# client (RFC 7009 §2.1: identified by its client_id alone, as ours is) is answered 400; a real server
# takes it.  Given its default here, the SDK's handler checks the rest as it would.
RevocationRequest.model_fields["client_secret"].default = None
RevocationRequest.model_rebuild(force=True)


@dataclass
class Provider:
    """The authorisation server's memory: clients, codes, tokens; and what it was sent."""

    resource: str
    access_seconds: int = 3600
    cimd: bool = False
    clients: dict[str, OAuthClientInformationFull] = field(default_factory=dict)
    codes: dict[str, AuthorizationCode] = field(default_factory=dict)
    access: dict[str, AccessToken] = field(default_factory=dict)
    refresh: dict[str, RefreshToken] = field(default_factory=dict)
    revoked: list[str] = field(default_factory=list)
    refreshed: int = 0
    registered: int = 0
    documents_fetched: list[str] = field(default_factory=list)
    authorize_params: list[AuthorizationParams] = field(default_factory=list)

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        if client_id in self.clients:
            return self.clients[client_id]
        if self.cimd and client_id.startswith("http"):  # a Client ID Metadata Document: fetched from its URL
            async with httpx.AsyncClient(timeout=5) as http:
                answer = await http.get(client_id)
            self.documents_fetched.append(client_id)
            if answer.status_code != 200:
                return None
            document = answer.json()
            if document.get("client_id") != client_id:  # the document must name itself
                return None
            # a document names no scopes (they are the server's policy): this one grants its own
            return OAuthClientInformationFull.model_validate({"scope": "docs.read docs.write", **document})
        return None

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.registered += 1
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        # the person is signed in at the authorisation server as _account and says yes
        self.authorize_params.append(params)
        code = secrets.token_urlsafe(24)
        assert client.client_id is not None
        self.codes[code] = AuthorizationCode(code=code, scopes=params.scopes or [], expires_at=time.time() + 300,
                                             client_id=client.client_id, code_challenge=params.code_challenge,
                                             redirect_uri=params.redirect_uri,
                                             redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
                                             resource=params.resource, subject=_account.get())
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    def _issue(self, client_id: str, scopes: list[str], resource: str | None, subject: str | None):
        from mcp.shared.auth import OAuthToken

        access, refresh = f"at-{secrets.token_urlsafe(16)}", f"rt-{secrets.token_urlsafe(16)}"
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes, resource=resource,
                                          expires_at=int(time.time()) + self.access_seconds, subject=subject)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource,
                                             subject=subject)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=self.access_seconds,
                          refresh_token=refresh, scope=" ".join(scopes) or None)

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode):
        del self.codes[authorization_code.code]  # once
        return self._issue(authorization_code.client_id, authorization_code.scopes, authorization_code.resource,
                           authorization_code.subject)

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        token = self.refresh.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(self, client, refresh_token: RefreshToken, scopes: list[str]):
        del self.refresh[refresh_token.token]  # rotated
        self.refreshed += 1
        return self._issue(refresh_token.client_id, scopes or refresh_token.scopes, refresh_token.resource,
                           refresh_token.subject)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token) -> None:
        self.revoked.append(token.token)
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def subjects(self) -> dict[str, str | None]:
        """Live access tokens -> whose."""
        return {t: a.subject for t, a in self.access.items()}


class _Verifier:
    """The MCP server's check of a bearer token: the authorisation server's record of it (introspection)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.provider.load_access_token(token)


def _bound() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


@asynccontextmanager
async def _serve(app, sock: socket.socket) -> AsyncIterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="test:oauth-server")
    for _ in range(1000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    try:
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@dataclass
class OAuthServers:
    mcp_url: str
    issuer: str
    provider: Provider

    async def browser(self, link: str, *, account: str) -> httpx.Response:
        """Open ``link`` as a person signed in at the authorisation server as ``account`` who says yes:
        the authorisation server redirects to the gateway's callback, which is followed (and answers)."""
        async with httpx.AsyncClient(timeout=20, follow_redirects=False) as http:
            answer = await http.get(link, headers={"X-Signed-In-As": account})
            assert answer.status_code in (302, 303, 307), (answer.status_code, answer.text[:300])
            return await http.get(answer.headers["location"])


class Consent(BaseModel):
    share: bool = Field(description="Share it with the team?")


def _ask_consent() -> Elicit[Consent]:
    return Elicit("May I share the document?", Consent)


def _mcp_app(resource: str, issuer: str, provider: Provider):
    server = MCPServer("docs", auth=AuthSettings(issuer_url=AnyHttpUrl(issuer), resource_server_url=AnyHttpUrl(resource),
                                                 required_scopes=["docs.read"], validate_token_resource=True),
                       token_verifier=_Verifier(provider))

    @server.tool()
    def whoami() -> str:
        """Whose token this call carried."""
        token = get_access_token()
        return f"you are {token.subject if token else 'nobody'}"

    @server.tool()
    def search(words: str) -> str:
        """Search the documents."""
        token = get_access_token()
        return f"{token.subject if token else 'nobody'}'s documents about {words}: 3 found"

    @server.tool()
    def share(consent: Annotated[ElicitationResult[Consent], Resolve(_ask_consent)]) -> str:
        """Share a document: asks the user first."""
        token = get_access_token()
        who = token.subject if token else "nobody"
        if not isinstance(consent, AcceptedElicitation):
            return f"{who}'s document not shared ({consent.action})"
        return f"{who}'s document {'shared' if consent.data.share else 'kept private'}"

    return server.streamable_http_app()


def _as_app(issuer: str, provider: Provider, *, cimd: bool):
    routes = create_auth_routes(provider, AnyHttpUrl(issuer),  # type: ignore[arg-type]
                                client_registration_options=ClientRegistrationOptions(
                                    enabled=True, valid_scopes=["docs.read", "docs.write"]),
                                revocation_options=RevocationOptions(enabled=True))
    app = Starlette(routes=routes)

    async def metadata_with_cimd(request: Request):
        answer = await inner(request)
        if request.url.path == "/.well-known/oauth-authorization-server" and cimd and answer.status_code == 200:
            import json

            body = json.loads(answer.body)
            body["client_id_metadata_document_supported"] = True
            return JSONResponse(body)
        return answer

    async def inner(request: Request):
        from starlette.responses import Response

        sent: dict = {}
        chunks: list[bytes] = []

        async def send(message):
            if message["type"] == "http.response.start":
                sent.update(message)
            else:
                chunks.append(message.get("body", b""))

        await app(request.scope, request.receive, send)
        return Response(b"".join(chunks), status_code=sent["status"],
                        headers={k.decode(): v.decode() for k, v in sent["headers"] if k.lower() != b"content-length"})

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers", []))
            token = _account.set(headers.get(b"x-signed-in-as", b"nobody").decode())
            try:
                if cimd and scope["path"] == "/.well-known/oauth-authorization-server":
                    response = await metadata_with_cimd(Request(scope, receive))
                    await response(scope, receive, send)
                    return
                await app(scope, receive, send)
            finally:
                _account.reset(token)
            return
        await app(scope, receive, send)

    return asgi


@asynccontextmanager
async def oauth_servers(*, access_seconds: int = 3600, cimd: bool = False) -> AsyncIterator[OAuthServers]:
    as_sock, as_port = _bound()
    mcp_sock, mcp_port = _bound()
    issuer = f"http://127.0.0.1:{as_port}"
    resource = f"http://127.0.0.1:{mcp_port}/mcp"
    provider = Provider(resource=resource, access_seconds=access_seconds, cimd=cimd)
    async with _serve(_as_app(issuer, provider, cimd=cimd), as_sock), \
            _serve(_mcp_app(resource, issuer, provider), mcp_sock):
        yield OAuthServers(resource, issuer, provider)
