"""Signing people in to remote MCP servers from the chat: the link, the callback, signing out.

    signins = SignIns(db, home, settings, approvers=lambda: approvals.approvers)
    auth = signins.auth_for("docs", cfg)     # the server's ServerAuth (gateway.tools_mcp.oauth)
    McpServer(..., auth=auth, sign_in=signins.sign_in)
    await signins.start(control)             # where the links are sent (gateway.control)
    GET /mcp/oauth/callback?code=&state=     # LocalApi hands it to signins.callback()
    /tools logout docs                       # signins.logout_command; `switchboard tools logout docs`

A call of a server that is not signed in answers the model "the user must authorise <server> first"
and sends the person whose call it is the link: in a direct chat there, from a group in a direct
message (a link in a group could be opened by someone else, who would then sign the asker in with
their own account).  For ``auth: operator`` only an approver (``tools.approvers``) is sent the link;
anyone else is told the operator must sign in.  The link names the flow by its ``state``; the
callback finds the flow in the store (any instance's, after a restart too), exchanges the code with
the flow's PKCE verifier, keeps the tokens sealed, tells the chat, and wakes the server so that the
next call runs.  Nothing secret is ever in a message: the link carries only the public half of PKCE.
"""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import state
from gateway.config import McpServerConfig
from gateway.errors import GatewayClosing
from gateway.tools_mcp.oauth import FLOW_SECONDS, OPERATOR, AuthError, OAuthSettings, ServerAuth, state_hash
from gateway.tools_mcp.server import Asking, McpServer
from gateway.tools_mcp.vault import Vault
from gateway.types import ChatRef

if TYPE_CHECKING:  # pragma: no cover
    from gateway.control import ChatControl
    from gateway.tools_mcp.signedin import SignedInCalls

log = logging.getLogger(__name__)

CALLBACK_PATH = "/mcp/oauth/callback"
CLIENT_DOCUMENT_PATH = "/mcp/oauth/client.json"
NO_CHAT_PLATFORMS = frozenset({"cron", "api", "cli"})  # nobody reads a link sent there


def oauth_settings(cfg: Any, bound_port: int | None = None) -> OAuthSettings:
    """The sign-ins' settings from a :class:`gateway.config.Config` (``tools.oauth``, ``api``; the port the
    local API was bound to, when it was asked for any: ``api.port: 0``)."""
    oauth, api = cfg.tools.oauth, cfg.api
    port = bound_port or api.port
    return OAuthSettings(redirect_uri=oauth.callback_base(api.host, port) + CALLBACK_PATH,
                         client_id_url=oauth.metadata_url(api.host, port), client_name=oauth.client_name)


class SignIns:
    def __init__(self, db: state.AsyncSessionDB, home: Path, settings: OAuthSettings, *,
                 approvers: Callable[[], frozenset[str]] = frozenset, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.home = home
        self._vault: Vault | None = None  # the key file is read (or made) when a server first signs in
        self.settings = settings
        self.approvers = approvers
        self.clock = clock
        self.router: ChatControl | None = None
        self.auths: dict[str, ServerAuth] = {}
        self.signed_in: SignedInCalls | None = None  # runs the call that waited for a sign-in (assemble)

    def auth_for(self, name: str, cfg: McpServerConfig) -> ServerAuth | None:
        """The sign-ins of server ``name`` (None: ``auth: none``); the same one while its settings stay."""
        if cfg.auth == "none" or cfg.url is None:
            self.auths.pop(name, None)
            return None
        known = self.auths.get(name)
        client = (cfg.client_id, cfg.client_secret) if cfg.client_id else None
        if known is not None and (known.url, known.mode, known.scopes, known._preregistered) == (
                cfg.url, cfg.auth, cfg.scopes, client):
            return known
        if self._vault is None:
            self._vault = Vault.open(self.home)  # a few bytes, once (at start, or the reload adding the first)
        self.auths[name] = ServerAuth(name, cfg.url, cfg.auth, cfg.scopes, self.settings, self.db, self._vault,
                                      client=client, clock=self.clock)
        return self.auths[name]

    async def start(self, control: ChatControl, settings: OAuthSettings | None = None) -> None:
        """Send the links through ``control`` from now on (with ``settings`` once the local API is bound)."""
        self.router = control
        if settings is not None:
            self.settings = settings
            for auth in self.auths.values():
                auth.settings = settings

    # -- a call that needs a sign-in (McpServer's sign_in) -------------------------------------
    async def sign_in(self, server: McpServer, asking: Asking, principal: str) -> str:
        auth = server.auth
        assert auth is not None
        name = server.name
        ctx = asking.context
        chat: ChatRef | None = (getattr(ctx, "extra", None) or {}).get("chat")
        router = self.router
        if ctx is None or chat is None or router is None or ctx.platform in NO_CHAT_PLATFORMS \
                or not router.has_output(chat.platform):
            return (f"error: the user must authorise {name} first, and no sign-in link can be sent from this "
                    f"conversation; the operator can run `switchboard tools login {name}`"
                    + ("" if auth.mode == "operator" else " --user PLATFORM:USER_ID"))
        asker = f"{ctx.platform}:{ctx.user_id}"
        if principal == OPERATOR and asker not in self.approvers():
            await _tell(router, chat, f"{asking.tool} needs the operator to sign in to {name} first; "
                                      "ask them to (it uses one account for everyone).")
            return (f"error: the operator must authorise {name} first (one sign-in for everyone); the user was "
                    "told to ask them")
        try:
            waiting = self.signed_in.waiting(asking) if self.signed_in is not None else None
            link = await auth.begin(principal, (chat.platform, chat.chat_id, chat.thread_id), waiting=waiting)
        except AuthError as exc:
            log.warning("MCP server %s: a sign-in could not be started: %s", name, exc)
            await _tell(router, chat, f"{name} needs you to sign in, but the sign-in could not be started: {exc}")
            return f"error: the user must authorise {name} first, and starting the sign-in failed: {exc}"
        minutes = round(FLOW_SECONDS / 60)
        text = (f"To let me use **{name}**{' for everyone' if principal == OPERATOR else ' as you'}, sign in here "
                f"(the link is yours alone and works for {minutes} minutes): {link}")
        direct = ":dm:" in ctx.session_key or ctx.user_id is None
        if direct:
            sent = await _tell(router, chat, text)
        else:  # a group: the link goes to the asker alone
            sent = await _tell(router, ChatRef(chat.platform, str(ctx.user_id)), text)
            await _tell(router, chat, f"{name} needs you to sign in first: "
                                      + ("I sent you the link in a direct message." if sent else
                                         "I could not message you directly; write to me there and ask again."))
        if not sent:
            return f"error: the user must authorise {name} first, and the sign-in link could not be sent to them"
        if waiting is not None:
            return (f"error: the user must authorise {name} first. A sign-in link was sent to them; once they have "
                    f"signed in, this call runs again by itself and you are given its result.")
        return (f"error: the user must authorise {name} first. A sign-in link was sent to them; once they have "
                f"signed in, call the tool again.")

    # -- the callback (GET /mcp/oauth/callback) -------------------------------------------------
    async def callback(self, query: dict[str, str]) -> tuple[int, str]:
        """(HTTP status, the page shown in the browser) for the authorisation server's redirect."""
        state_value = query.get("state", "")
        if not state_value:
            return 400, _page("No sign-in here", "This address is where sign-in links come back; it was opened "
                                                 "without one.")
        flow = await self.db.mcp_auth.take_flow(state_hash(state_value), now=self.clock())
        if flow is None:
            return 400, _page("This sign-in link is used up", "It was used already, or it ran out. Ask again in "
                                                              "the chat for a new one.")
        auth = self.auths.get(flow["server"])
        chat = ChatRef(flow["platform"], flow["chat_id"], flow["thread_id"]) if flow["platform"] else None
        if auth is None:
            return 400, _page("Unknown server", f"{flow['server']} is no longer configured to sign in.")
        if query.get("error"):
            why = query["error"][:60]
            await self._notify(chat, f"Signing in to {flow['server']} was refused ({why}).")
            return 400, _page("Not signed in", f"The authorisation server said: {html.escape(why)}.")
        try:
            waiting = await auth.complete(flow, query.get("code", ""), query.get("iss"))
        except AuthError as exc:
            log.warning("MCP server %s: a sign-in could not be finished: %s", flow["server"], exc)
            await self._notify(chat, f"Signing in to {flow['server']} failed: {exc}. Ask again for a new link.")
            return 502, _page("Not signed in", html.escape(str(exc)))
        go = await self._waiting_call(waiting, flow["principal"])
        await self._notify(chat, f"Signed in to {flow['server']}. " + (
            "Running the call that waited for it." if go is not None else "Ask me again and I will use it."))
        if go is not None and self.router is not None:
            try:
                await go(self.router)
            except GatewayClosing:
                log.info("MCP server %s: signed in during shutdown; the call that waited is not run", flow["server"])
        return 200, _page("Signed in", f"Switchboard may now use {html.escape(flow['server'])}"
                                       f"{' for everyone' if flow['principal'] == OPERATOR else ' as you'}. "
                                       "You can close this tab.")

    async def _waiting_call(self, waiting: dict | None, principal: str) -> Any:
        """What runs the call that waited for this sign-in (gateway.tools_mcp.signedin), or None."""
        if waiting is None or self.signed_in is None or self.router is None:
            return None
        try:
            return await self.signed_in.prepared(waiting, principal)
        except Exception:  # the sign-in stands; the user asks again
            log.exception("the call that waited for a sign-in could not be run again")
            return None

    def client_document(self) -> dict[str, Any]:
        """The Client ID Metadata Document (served at CLIENT_DOCUMENT_PATH)."""
        return self.settings.client_metadata()

    async def _notify(self, chat: ChatRef | None, text: str) -> None:
        if chat is not None and self.router is not None:
            await _tell(self.router, chat, text)

    # -- signing out --------------------------------------------------------------------------
    async def logout(self, name: str, principal: str | None) -> int:
        """Delete (and revoke) ``principal``'s sign-in to ``name`` (None: everyone's); how many there were."""
        auth = self.auths.get(name)
        if auth is None:
            raise KeyError(name)
        return await auth.logout(principal)

    async def logout_command(self, name: str, platform: str, user_id: str | None) -> str:
        """``/tools logout SERVER``: the asker's own sign-in; an operator server's only by an approver."""
        auth = self.auths.get(name)
        if auth is None:
            known = ", ".join(sorted(self.auths)) or "none"
            return f"{name} is not a server that signs in (those that do: {known})."
        asker = f"{platform}:{user_id}"
        if auth.mode == "operator":
            if asker not in self.approvers():
                return f"{name} uses the operator's sign-in; only an approver (tools.approvers) can sign it out."
            principal = OPERATOR
        elif user_id is None:
            return "Signing out needs to know who you are, which this chat does not say."
        else:
            principal = asker
        gone = await auth.logout(principal)
        if not gone:
            return f"There was no sign-in to {name} to remove."
        return (f"Signed out of {name}" + (" for everyone" if principal == OPERATOR else "")
                + ": the token was deleted here and revoked where the server allows it.")


async def _tell(router: ChatControl, chat: ChatRef, text: str) -> bool:
    try:
        await router.deliver(chat, text, None)
        return True
    except Exception as exc:  # noqa: BLE001 - a link that cannot be sent is said so to the model
        log.warning("a sign-in message to %s could not be sent: %s", chat.platform, type(exc).__name__)
        return False


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body><h1>{html.escape(title)}</h1><p>{body}</p></body></html>")
