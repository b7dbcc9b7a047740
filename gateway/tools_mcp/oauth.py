"""OAuth 2.1 for one remote MCP server: who signs in, the link, the code's exchange, refresh, sign-out.

    auth = ServerAuth("docs", cfg, settings, db, vault)
    token = await auth.token("telegram:111")     # a valid access token (refreshed before expiry), or None
    link = await auth.begin("telegram:111", chat)  # the sign-in link to send that person
    await auth.complete(flow, code, iss)          # the callback's code exchanged (gateway.tools_mcp.signin)
    await auth.logout("telegram:111")             # tokens deleted (and revoked where the server can)
    McpServer(..., auth=auth)                     # every request carries the principal's bearer token

Discovery follows the MCP authorization spec, with the SDK's own helpers (``mcp.client.auth.utils``):
the resource's protected-resource metadata (RFC 9728: the ``resource_metadata`` of the server's
``WWW-Authenticate``, else its well-known URLs) names the authorisation server, whose metadata
(RFC 8414 / OpenID discovery) gives the endpoints and must name that issuer.  The client is a Client
ID Metadata Document (``tools.oauth.client_id_url``, when the authorisation server says it takes
them) or, as the fallback, registered dynamically (RFC 7591), once per server and kept sealed in the
store.  Every link carries PKCE (S256), a fresh ``state`` and RFC 8707's ``resource``.

Why not the SDK's ``OAuthClientProvider``: it runs the whole sign-in inside one HTTP request, waiting
for a browser on the same machine, with the code verifier held in that coroutine.  Here the person
signing in is in a chat and may take minutes or never come: the call answers at once ("the user must
authorise ... first"), the verifier waits sealed in the store (``db.mcp_auth_flows``), and the callback
(on any instance, after a restart too) finishes it.  The same protocol steps, kept apart.

Secrets (tokens, the verifier, a client secret) are sealed before they reach the store, sent only to
the authorisation server's token endpoint, and never logged: errors say what failed, not with what.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable
from urllib.parse import quote, urlencode, urlparse

import httpx2
from pydantic import ValidationError

from gateway.errors import SwitchboardError
from gateway.tools_mcp.vault import Vault, VaultError

if TYPE_CHECKING:  # the SDK's OAuth helpers are imported by the methods that use them (a sign-in, a refresh)
    from mcp.shared.auth import OAuthMetadata, OAuthToken, ProtectedResourceMetadata

log = logging.getLogger(__name__)

OPERATOR = "operator"  # the principal of an ``auth: operator`` server's one sign-in
REFRESH_BEFORE = 120.0  # a token this close to its expiry (or half its lifetime, if shorter) is refreshed before use
FLOW_SECONDS = 900.0  # a sign-in link is good for this long
CACHE_SECONDS = 30.0  # a token read from the store is used this long before it is read again (another instance may sign out)
HTTP_SECONDS = 15.0
GRANTS = ["authorization_code", "refresh_token"]


class AuthError(SwitchboardError):
    """A sign-in could not be started or finished; the message says what failed (never a secret)."""


@dataclass(frozen=True, slots=True)
class OAuthSettings:
    """What every server's sign-in shares (``tools.oauth``)."""

    redirect_uri: str  # the callback on the local API: <public url>/mcp/oauth/callback
    client_id_url: str | None = None  # a Client ID Metadata Document's URL (https), used where the server takes one
    client_name: str = "Switchboard"

    def client_metadata(self) -> dict[str, Any]:
        """The client's metadata: what the CIMD document serves and what dynamic registration sends."""
        doc: dict[str, Any] = {"client_name": self.client_name, "redirect_uris": [self.redirect_uri],
                               "grant_types": GRANTS, "response_types": ["code"],
                               "token_endpoint_auth_method": "none"}
        if self.client_id_url:
            doc["client_id"] = self.client_id_url
        return doc


def state_hash(state: str) -> str:
    """How a flow is found in the store: the secret ``state`` itself is never stored."""
    return hashlib.sha256(state.encode()).hexdigest()


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(64)[:96]
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


@dataclass
class _Cached:
    record: dict
    read_at: float


class ServerAuth:
    """One server's sign-ins (``auth: operator | per_user``), its discovery and its client."""

    def __init__(self, server: str, url: str, mode: str, scopes: tuple[str, ...], settings: OAuthSettings, db: Any,
                 vault: Vault, *, client: tuple[str, str] | None = None, clock: Callable[[], float] = time.time,
                 http: Callable[[], httpx2.AsyncClient] | None = None) -> None:
        if mode not in ("operator", "per_user"):
            raise ValueError(f"auth must be operator or per_user, not {mode!r}")
        self.server = server
        self.url = url
        self.mode = mode
        self.scopes = scopes
        self._preregistered = client  # (client_id, client_secret or ""): registered by hand, used as it is
        self.settings = settings
        self.db = db  # state.AsyncSessionDB: db.mcp_auth
        self.vault = vault
        self.clock = clock
        self._http = http or (lambda: httpx2.AsyncClient(timeout=HTTP_SECONDS, follow_redirects=False))
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._challenge: str | None = None  # the server's last WWW-Authenticate (where its metadata is)
        self.changed = asyncio.Event()  # set when someone signed in (the supervisor may connect now)

    def __repr__(self) -> str:  # never the client secret
        return f"ServerAuth({self.server!r}, {self.mode})"

    # -- whose token --------------------------------------------------------------------------
    def principal_of(self, platform: str | None, user_id: str | None) -> str | None:
        """Whose sign-in a call of this person uses: the operator's, or their own (None: nobody's)."""
        if self.mode == "operator":
            return OPERATOR
        if not platform or not user_id:
            return None
        return f"{platform}:{user_id}"

    async def listing_principal(self) -> str | None:
        """Whose token the server's own connection (its tool list) carries: the operator's, or, per user,
        the most recently signed-in person's (their calls never go through it)."""
        if self.mode == "operator":
            return OPERATOR
        held = await self.db.mcp_auth.principals(self.server)
        return held[0] if held else None

    # -- tokens -------------------------------------------------------------------------------
    async def token(self, principal: str) -> str | None:
        """``principal``'s access token, refreshed when it is near its expiry; None: they must sign in."""
        lock = self._locks.setdefault(principal, asyncio.Lock())
        async with lock:
            record = await self._record(principal)
            if record is None:
                return None
            expires_at = record.get("expires_at")
            margin = min(REFRESH_BEFORE, (record.get("lifetime") or REFRESH_BEFORE * 2) / 2)
            if expires_at is not None and expires_at - self.clock() < margin:
                if record.get("refresh_token"):
                    record = await self._refresh(principal, record)
                elif expires_at <= self.clock():
                    await self._forget(principal)
                    return None
            return None if record is None else record["access_token"]

    async def _record(self, principal: str) -> dict | None:
        cached = self._cache.get(principal)
        if cached is not None and self.clock() - cached.read_at < CACHE_SECONDS:
            return cached.record
        sealed = await self.db.mcp_auth.get(self.server, principal, "tokens")
        if sealed is None:
            self._cache.pop(principal, None)
            return None
        try:
            record = self.vault.unseal(sealed)
        except VaultError:
            log.warning("MCP server %s: a stored sign-in could not be opened (another key?); it is asked again",
                        self.server)
            await self._forget(principal)
            return None
        self._cache[principal] = _Cached(record, self.clock())
        return record

    async def _store(self, principal: str, record: dict) -> None:
        await self.db.mcp_auth.put(self.server, principal, "tokens", self.vault.seal(record),
                                   expires_at=record.get("expires_at"), now=self.clock())
        self._cache[principal] = _Cached(record, self.clock())

    async def _forget(self, principal: str) -> None:
        self._cache.pop(principal, None)
        await self.db.mcp_auth.drop(self.server, principal, "tokens")

    async def _refresh(self, principal: str, record: dict) -> dict | None:
        from mcp.shared.auth import OAuthToken

        data = {"grant_type": "refresh_token", "refresh_token": record["refresh_token"]}
        if record.get("resource"):
            data["resource"] = record["resource"]
        try:
            async with self._http() as http:
                response = await self._token_request(http, record["token_endpoint"], record["client"], data)
        except httpx2.HTTPError as exc:
            log.warning("MCP server %s: refreshing a token failed (%s); the current one is used while it lasts",
                        self.server, type(exc).__name__)
            return record if (record.get("expires_at") or 0) > self.clock() else None
        if response.status_code != 200:
            newer = await self._newer(principal, record)
            if newer is not None:  # another instance (or the CLI) refreshed first: its rotated token stands
                return newer
            log.info("MCP server %s: the authorisation server refused a refresh (HTTP %d); a new sign-in is asked",
                     self.server, response.status_code)
            await self._forget(principal)
            return None
        try:
            token = OAuthToken.model_validate_json(response.content)
        except ValidationError:
            log.warning("MCP server %s: a refresh answered something that is not a token; a new sign-in is asked",
                        self.server)
            await self._forget(principal)
            return None
        fresh = {**record, **self._token_fields(token)}
        fresh["refresh_token"] = token.refresh_token or record["refresh_token"]  # RFC 6749 §6: it may not rotate
        await self._store(principal, fresh)
        log.info("MCP server %s: a token was refreshed before its expiry", self.server)
        return fresh

    async def _newer(self, principal: str, record: dict) -> dict | None:
        """The store's record of ``principal`` when it is not ``record`` (refreshed elsewhere meanwhile)."""
        self._cache.pop(principal, None)
        stored = await self._record(principal)
        if stored is None or stored.get("refresh_token") == record.get("refresh_token"):
            return None
        return stored

    def _token_fields(self, token: OAuthToken) -> dict:
        return {"access_token": token.access_token, "refresh_token": token.refresh_token,
                "scope": token.scope, "lifetime": None if token.expires_in is None else float(token.expires_in),
                "expires_at": None if token.expires_in is None else self.clock() + float(token.expires_in)}

    def challenged(self, principal: str | None, www_authenticate: str | None) -> None:
        """The server refused a request (401): where its metadata is noted, and the token it refused is not
        used again from memory (the store is asked; a sign-out elsewhere is seen)."""
        if www_authenticate:
            self._challenge = www_authenticate
        if principal is not None:
            self._cache.pop(principal, None)

    async def refused(self, principal: str) -> None:
        """The server refused ``principal``'s token although it was valid to us: revoked there; sign in again."""
        await self._forget(principal)

    # -- signing in ---------------------------------------------------------------------------
    async def begin(self, principal: str, chat: tuple[str, str, str | None] | None = None, *,
                    waiting: dict | None = None) -> str:
        """The link that signs ``principal`` in (the flow kept, sealed, for the callback, with ``waiting``:
        the tool call that needed it, run again once signed in, gateway.tools_mcp.signedin)."""
        from mcp.client.auth.utils import extract_field_from_www_auth, get_client_metadata_scopes

        async with self._http() as http:
            prm, asm = await self._discover(http)
            scope = " ".join(self.scopes) if self.scopes else get_client_metadata_scopes(
                extract_field_from_www_auth(_Challenge(self._challenge), "scope") if self._challenge else None,
                prm, asm, GRANTS)
            client = await self._client(http, asm, scope)
        verifier, challenge = _pkce()
        state = secrets.token_urlsafe(32)
        resource = self._resource(prm)
        params = {"response_type": "code", "client_id": client["client_id"], "redirect_uri": self.settings.redirect_uri,
                  "state": state, "code_challenge": challenge, "code_challenge_method": "S256", "resource": resource}
        if scope:
            params["scope"] = scope
        now = self.clock()
        sealed = self.vault.seal({"verifier": verifier, "client": client, "token_endpoint": str(asm.token_endpoint),
                                  "revocation_endpoint": str(asm.revocation_endpoint) if asm.revocation_endpoint else None,
                                  "issuer": str(asm.issuer), "resource": resource, "scope": scope,
                                  "iss_required": bool(asm.authorization_response_iss_parameter_supported),
                                  "waiting": waiting})
        platform, chat_id, thread_id = chat or (None, None, None)
        await self.db.mcp_auth.add_flow({"state_hash": state_hash(state), "server": self.server, "principal": principal,
                                         "platform": platform, "chat_id": chat_id, "thread_id": thread_id,
                                         "data": sealed, "created_at": now, "expires_at": now + FLOW_SECONDS})
        log.info("MCP server %s: a sign-in link was made for %s", self.server, principal)
        return f"{asm.authorization_endpoint}?{urlencode(params)}"

    async def complete(self, flow: dict, code: str, iss: str | None) -> dict | None:
        """Exchange the callback's ``code`` for tokens with the flow's verifier; stored for its principal.
        Returns the call that waited for this sign-in (``begin``'s ``waiting``), if one did."""
        from mcp.shared.auth import OAuthToken

        try:
            secret = self.vault.unseal(flow["data"])
        except VaultError as exc:
            raise AuthError("the sign-in could not be read back (the key changed); start it again") from exc
        if iss is not None and iss != secret["issuer"]:
            raise AuthError("the answer came from another authorisation server than the one asked (RFC 9207 iss)")
        if iss is None and secret["iss_required"]:
            raise AuthError("the authorisation server's answer lacks the iss it promised (RFC 9207)")
        data = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.settings.redirect_uri,
                "code_verifier": secret["verifier"], "resource": secret["resource"]}
        async with self._http() as http:
            try:
                response = await self._token_request(http, secret["token_endpoint"], secret["client"], data)
            except httpx2.HTTPError as exc:
                raise AuthError(f"the token endpoint could not be reached ({type(exc).__name__})") from exc
        if response.status_code not in (200, 201):
            raise AuthError(f"the authorisation server refused the code (HTTP {response.status_code}: "
                            f"{_oauth_error(response)})")
        try:
            token = OAuthToken.model_validate_json(response.content)
        except ValidationError as exc:
            raise AuthError("the token endpoint answered something that is not a token") from exc
        record = {**self._token_fields(token), "token_endpoint": secret["token_endpoint"], "client": secret["client"],
                  "resource": secret["resource"], "revocation_endpoint": secret["revocation_endpoint"],
                  "issuer": secret["issuer"]}
        record["scope"] = record["scope"] or secret["scope"]
        await self._store(flow["principal"], record)
        log.info("MCP server %s: %s signed in", self.server, flow["principal"])
        self.changed.set()
        return secret.get("waiting")

    async def logout(self, principal: str | None) -> int:
        """Delete ``principal``'s tokens (None: everyone's), revoking each where the server offers it."""
        who = [principal] if principal is not None else await self.db.mcp_auth.principals(self.server)
        gone = 0
        for p in who:
            record = await self._record(p)
            await self._forget(p)
            if record is None:
                continue
            gone += 1
            endpoint = record.get("revocation_endpoint")
            if endpoint:
                await self._revoke(endpoint, record)
        self.changed.set()
        return gone

    async def _revoke(self, endpoint: str, record: dict) -> None:
        """RFC 7009, best effort: the refresh token (which takes its access tokens with it), then the access token."""
        try:
            async with self._http() as http:
                for name in ("refresh_token", "access_token"):
                    if record.get(name):
                        response = await self._token_request(http, endpoint, record["client"],
                                                             {"token": record[name], "token_type_hint": name})
                        if response.status_code != 200:
                            log.info("MCP server %s: revoking a %s answered HTTP %d", self.server, name,
                                     response.status_code)
        except httpx2.HTTPError as exc:
            log.warning("MCP server %s: revoking a token failed (%s); it was deleted here anyway", self.server,
                        type(exc).__name__)

    # -- the protocol's steps -----------------------------------------------------------------
    async def _discover(self, http: httpx2.AsyncClient) -> tuple[ProtectedResourceMetadata | None, OAuthMetadata]:
        from mcp.client.auth.utils import (
            build_oauth_authorization_server_metadata_discovery_urls,
            build_protected_resource_metadata_discovery_urls,
            extract_field_from_www_auth,
            handle_auth_metadata_response,
            handle_protected_resource_response,
        )
        from mcp.shared.auth import OAuthMetadata
        from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

        if self._challenge is None:  # ask the server once without a token: its 401 says where its metadata is
            try:
                probe = await http.post(self.url, json={"jsonrpc": "2.0", "id": 0, "method": "ping"},
                                        headers={"Accept": "application/json, text/event-stream"})
                self._challenge = probe.headers.get("WWW-Authenticate")
            except httpx2.HTTPError as exc:
                raise AuthError(f"the {self.server} server could not be reached ({type(exc).__name__})") from exc
        resource_metadata = (extract_field_from_www_auth(_Challenge(self._challenge), "resource_metadata")
                             if self._challenge else None)
        prm: ProtectedResourceMetadata | None = None
        for url in build_protected_resource_metadata_discovery_urls(resource_metadata, self.url):
            prm = await handle_protected_resource_response(await self._get(http, url))
            if prm is not None:
                break
        if prm is not None and prm.resource is not None and not check_resource_allowed(
                requested_resource=resource_url_from_server_url(self.url), configured_resource=str(prm.resource)):
            raise AuthError(f"the server's metadata is for another resource ({prm.resource}), not {self.url}")
        issuer = str(prm.authorization_servers[0]) if prm is not None else None
        origin = f"{urlparse(self.url).scheme}://{urlparse(self.url).netloc}"
        for url in build_oauth_authorization_server_metadata_discovery_urls(issuer, self.url):
            ok, asm = await handle_auth_metadata_response(await self._get(http, url))
            if not ok:
                break
            if asm is not None:
                # RFC 8414 §3.3: the metadata names the issuer it was looked up for.  Without resource
                # metadata (the 2025-03-26 revision) it was found at the MCP server's own origin, which
                # is what is trusted there, and its issuer was not checked by that revision.
                if issuer is not None and str(asm.issuer).rstrip("/") != issuer.rstrip("/"):
                    raise AuthError(f"the authorisation server's metadata names issuer {asm.issuer}, not {issuer}")
                if asm.code_challenge_methods_supported is not None and "S256" not in asm.code_challenge_methods_supported:
                    raise AuthError("the authorisation server does not offer PKCE with S256, which MCP requires")
                return prm, asm
        if issuer is None:  # 2025-03-26: no metadata at all; the default endpoints at the server's origin
            return None, OAuthMetadata.model_validate({
                "issuer": origin, "authorization_endpoint": f"{origin}/authorize", "token_endpoint": f"{origin}/token",
                "registration_endpoint": f"{origin}/register", "response_types_supported": ["code"]})
        raise AuthError(f"no authorisation server metadata was found for {self.url} (its resource metadata names "
                        f"{issuer})")

    async def _get(self, http: httpx2.AsyncClient, url: str) -> httpx2.Response:
        from mcp.client.auth.utils import create_oauth_metadata_request

        try:
            response = await http.send(create_oauth_metadata_request(url))
            await response.aread()
            return response
        except httpx2.HTTPError as exc:
            raise AuthError(f"{url} could not be read ({type(exc).__name__})") from exc

    def _resource(self, prm: ProtectedResourceMetadata | None) -> str:
        from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

        resource = resource_url_from_server_url(self.url)
        if prm is not None and prm.resource is not None and check_resource_allowed(
                requested_resource=resource, configured_resource=str(prm.resource)):
            return str(prm.resource)
        return resource

    async def _client(self, http: httpx2.AsyncClient, asm: OAuthMetadata, scope: str | None) -> dict:
        """The client this gateway is to ``asm``'s issuer: its CIMD URL where taken, else a registration
        (made once, kept sealed; made again for another issuer)."""
        from mcp.shared.auth import OAuthClientInformationFull

        issuer = str(asm.issuer)
        if self._preregistered is not None:
            client_id, secret = self._preregistered
            methods = asm.token_endpoint_auth_methods_supported or ["client_secret_basic"]
            method = "none" if not secret else ("client_secret_basic" if "client_secret_basic" in methods
                                                else "client_secret_post")
            return {"client_id": client_id, "client_secret": secret or None, "method": method, "issuer": issuer}
        if self.settings.client_id_url and asm.client_id_metadata_document_supported:
            return {"client_id": self.settings.client_id_url, "method": "none", "issuer": issuer}
        sealed = await self.db.mcp_auth.get(self.server, "", "client")
        if sealed is not None:
            try:
                known = self.vault.unseal(sealed)
                if (known.get("issuer") == issuer and known.get("redirect_uri") == self.settings.redirect_uri
                        and set((scope or "").split()) <= set((known.get("scope") or "").split())):
                    return known
            except VaultError:
                pass
        if asm.registration_endpoint is None:
            raise AuthError("the authorisation server takes neither a Client ID Metadata Document "
                            f"({'set tools.oauth.client_id_url' if not self.settings.client_id_url else 'not offered'}) "
                            "nor dynamic registration; register a client there by hand")
        metadata = self.settings.client_metadata()
        metadata.pop("client_id", None)
        if scope:
            metadata["scope"] = scope
        try:
            response = await http.post(str(asm.registration_endpoint), json=metadata)
        except httpx2.HTTPError as exc:
            raise AuthError(f"registering with the authorisation server failed ({type(exc).__name__})") from exc
        if response.status_code not in (200, 201):
            raise AuthError(f"the authorisation server refused the registration (HTTP {response.status_code}: "
                            f"{_oauth_error(response)})")
        try:
            info = OAuthClientInformationFull.model_validate_json(response.content)
        except ValidationError as exc:
            raise AuthError("the registration answer is not a client's information") from exc
        method = info.token_endpoint_auth_method or "none"
        if method not in ("none", "client_secret_post", "client_secret_basic") or (
                method != "none" and not info.client_secret):
            raise AuthError(f"the authorisation server registered a client this gateway cannot use ({method})")
        client = {"client_id": info.client_id, "client_secret": info.client_secret, "method": method,
                  "issuer": issuer, "redirect_uri": self.settings.redirect_uri, "scope": scope}
        await self.db.mcp_auth.put(self.server, "", "client", self.vault.seal(client), now=self.clock())
        log.info("MCP server %s: registered with its authorisation server %s", self.server, issuer)
        return client

    async def _token_request(self, http: httpx2.AsyncClient, endpoint: str, client: dict,
                             data: dict[str, str]) -> httpx2.Response:
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        body = {**data, "client_id": client["client_id"]}
        if client.get("method") == "client_secret_basic":
            pair = f"{quote(client['client_id'], safe='')}:{quote(client['client_secret'], safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif client.get("method") == "client_secret_post":
            body["client_secret"] = client["client_secret"]
        return await http.post(endpoint, data=body, headers=headers)


def _Challenge(value: str | None) -> httpx2.Response:
    """A WWW-Authenticate value as the SDK's header readers take it (the 401 it came with)."""
    return httpx2.Response(401, headers={"WWW-Authenticate": value or ""})


def _oauth_error(response: httpx2.Response) -> str:
    """The error code an OAuth server answered (RFC 6749 §5.2), never the body as a whole."""
    try:
        body = response.json()
    except ValueError:
        return "no OAuth error in the answer"
    if isinstance(body, dict):
        return str(body.get("error", "no OAuth error in the answer"))[:80]
    return "no OAuth error in the answer"


class BearerAuth(httpx2.Auth):
    """Each request of a server's connection carries ``principal()``'s access token; a 401 is noted."""

    def __init__(self, auth: ServerAuth, principal: Callable[[], str | None]) -> None:
        self._auth = auth
        self._principal = principal
        self.refusals = 0  # how often the server answered 401 (or 403 insufficient_scope) on this connection

    @property
    def refused(self) -> bool:
        return self.refusals > 0

    def sync_auth_flow(self, request):  # pragma: no cover - the MCP client is async
        raise RuntimeError("BearerAuth is for httpx2.AsyncClient")

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        principal = self._principal()
        token = await self._auth.token(principal) if principal is not None else None
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401 or (response.status_code == 403 and "insufficient_scope" in
                                           response.headers.get("WWW-Authenticate", "")):
            self.refusals += 1
            self._auth.challenged(principal, response.headers.get("WWW-Authenticate"))
