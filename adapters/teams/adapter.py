"""The Microsoft Teams adapter: the Bot Framework protocol, spoken directly (aiohttp and PyJWT).

Why not the official SDK (``microsoft-teams-apps``): it brings its own web server (FastAPI and
uvicorn), its own HTTP client and its own retry and token handling, acknowledges an activity before
the app has handled it, and has no way to name where the signing keys and the bot's token come
from.  What the gateway needs is narrow and fully documented: one POST endpoint whose bearer token
is checked against the OpenID metadata (:mod:`.auth`), a 200 only once the message is stored, and
four connector calls (:mod:`.outbound`).  Spoken directly, every address is a setting (the tests
point them at tests/fakes/teams.py), and acknowledgement, deduplication and retries follow the same
rules as every other platform here.

Inbound: Teams POSTs each activity to the messaging endpoint, ``/teams/messages`` on the daemon's
local API (``TeamsConfig.HTTP_PATHS``, served by ``gateway.runtime.platform_http``: no listener of
its own; the Azure bot's messaging endpoint is the public HTTPS address a reverse proxy forwards
there).  The token is verified before the body is used at all: an unsigned or wrongly signed
activity gets 401 and reaches nothing.  A
message activity is handed to the gateway, and answered 200 only after the handler returned (it
is then stored); a failure answers 500 and the Bot Framework sends it again, until the third
failure sets it aside as a dead letter (200).  Activity ids already handled here answer 200 at once;
the store keeps ``message_id`` (the activity id) unique per session, so a redelivery to another
instance of a cluster is stored once too.  Activities of one conversation are handed over one at
a time, in the order they arrived.

Shapes and mentions: :mod:`.events`.  Markdown: :mod:`.format`.  Files: :mod:`.media`.

Replies go to the conversation's ``serviceUrl`` (remembered from its activities; ``service_url``,
the global one, for a conversation this instance has not seen), split at the capability's length.
A streamed reply is posted and then edited in place with ``updateActivity`` within the
conversation's rate budget (Teams' own streaming protocol works in personal chats only and has
its own pacing; edits work everywhere, so one path serves all three kinds of chat).  Approvals are
an Adaptive Card whose buttons are ``Action.Submit`` with ``{"switchboard": "/approve <id>"}``: a
press is a message activity from the presser, handed over as that person typing the command, so
the gateway's approval checks (the asker or an approver) decide.

A rejected app secret: the token endpoint's ``invalid_client`` (or 401) stops the adapter trying.
At start the adapter reports ``failed`` with what to fix and does not listen; later, every send
fails at once with the same words (kept pending) until a reload brings a new secret.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any, Sequence

import aiohttp

from gateway.errors import AdapterError, PlatformHTTPError
from gateway.formatting import split_message
from gateway.ratelimit import ChatRate, chat_budget_for, limiter_for
from gateway.retry import Backoff
from gateway.types import (
    AdapterHealth,
    Button,
    ChatRef,
    ChatType,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    HttpRequest,
    HttpResponse,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    SendProgress,
)

from . import events
from .auth import ActivityVerifier, BotToken, CredentialsRejected, Unauthorized
from .config import MESSAGES_PATH, TeamsConfig
from .format import to_teams
from .media import collect
from .outbound import Connector, PartFailed, allowed_service_url

log = logging.getLogger(__name__)

PLATFORM = "teams"
TEXT_LIMIT = TeamsConfig.CAPABILITIES.max_message_length
CHAT_RATE = ChatRate(rate=TeamsConfig.CAPABILITIES.chat_rate, burst=TeamsConfig.CAPABILITIES.chat_burst)
GLOBAL_SERVICE_URL = "https://smba.trafficmanager.net/teams/"
MAX_BODY = 1024 * 1024  # an activity is a few KB; Teams caps a message at about 28 KB
_OK = HttpResponse(200, {})
_REMEMBERED = 10_000


class _Lru(OrderedDict):
    def remember(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > _REMEMBERED:
            self.popitem(last=False)


class TeamsAdapter:
    """Microsoft Teams through the Bot Framework; implements :class:`gateway.types.Adapter`."""

    platform = PLATFORM

    def __init__(self, config: TeamsConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                 media: MediaLimits | None = None, send_backoff: Backoff = Backoff(), send_attempts: int = 6,
                 send_total_seconds: float = 90.0, chat_rate: ChatRate = CHAT_RATE, app_rate: float = 30.0):
        """``config`` (``platforms.teams``, checked when it was loaded: the app id with its secret) names the
        bot, its login and the connector and what to answer; ``media`` comes from the rest of the config
        (``commands`` and ``vision`` are accepted and unused); the keywords after it pace and retry sends."""
        c = config
        if not c.app_id or not c.app_password:
            raise ValueError("app_id and app_password are required (the Azure bot's Microsoft App ID and a client secret)")
        self._app_id, self._secret, self._tenant = c.app_id, c.app_password, c.tenant_id
        self._metadata_url, self._issuer = c.openid_metadata_url, c.issuer
        self._token_url = c.token_url.replace("{tenant}", c.tenant_id)
        self._scope, self._refresh = c.token_scope, c.keys_refresh_seconds
        self._default_service_url = c.service_url
        self._service_hosts = tuple(h.lower() for h in c.service_url_hosts)
        self._require_mention = c.require_mention
        self._free = frozenset(c.free_response_channels)
        self._media = media or MediaLimits()
        self._backoff, self._attempts, self._total = send_backoff, send_attempts, send_total_seconds
        self._chat_rate, self._app_rate = chat_rate, app_rate
        self.bot_id = f"28:{c.app_id}"
        self._health = AdapterHealth(PLATFORM)
        self._http: aiohttp.ClientSession | None = None
        self._verifier: ActivityVerifier | None = None
        self._token: BotToken | None = None
        self._connector: Connector | None = None
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._done: _Lru = _Lru()  # activity ids handed over here
        self._service_urls: _Lru = _Lru()  # conversation id -> its serviceUrl
        self._chat_locks: _Lru = _Lru()  # conversation id -> lock: one activity at a time, in arrival order
        self.unauthorized = 0  # activities refused for their token (bench and tests read it)

    @classmethod
    def from_config(cls, cfg: TeamsConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                    media: MediaLimits | None = None) -> "TeamsAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.teams``."""
        return cls(cfg, commands=commands, vision=vision, media=media)

    # ------------------------------------------------------------------ lifecycle

    def health(self) -> AdapterHealth:
        return self._health

    async def _open_client(self) -> None:
        if self._http is not None:
            return
        self._http = aiohttp.ClientSession()
        self._token = BotToken(self._http, token_url=self._token_url, app_id=self._app_id, secret=self._secret,
                               scope=self._scope)
        self._connector = Connector(
            self._http, self._token, limiter_for(PLATFORM, self._app_id, rate=self._app_rate, burst=int(self._app_rate)),
            chat_budget=lambda conversation: chat_budget_for(PLATFORM, self._app_id, conversation, self._chat_rate),
            backoff=self._backoff, max_attempts=self._attempts, total_seconds=self._total)

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._verifier is not None:
            raise RuntimeError("TeamsAdapter is already started")
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._health.state = "starting"
        await self._open_client()
        assert self._http is not None and self._token is not None
        try:
            await self._token.get()  # the app id and secret, checked before any activity is taken
        except CredentialsRejected as exc:
            self._health.state, self._health.last_error = "failed", str(exc)
            return  # not retried: a reload with a new secret starts it again
        except Exception:
            await self._close()
            raise
        verifier = ActivityVerifier(self._http, metadata_url=self._metadata_url, issuer=self._issuer,
                                    app_id=self._app_id, refresh_seconds=self._refresh)
        try:
            await verifier.load()
        except Exception:
            await self._close()
            raise
        self._verifier = verifier  # activities are taken from now on (503 until then: sent again)
        self._health.state, self._health.last_error = "connected", None
        self._health.detail = f"messaging endpoint {MESSAGES_PATH} on the local API, app {self._app_id}"
        log.info("teams: taking activities at %s on the local API", MESSAGES_PATH)

    async def stop(self) -> None:
        await self._close()
        self._health.state = "stopped"

    async def _close(self) -> None:
        http, self._http = self._http, None
        self._connector = self._token = self._verifier = None
        if http is not None:
            await http.close()

    # ------------------------------------------------------------------ inbound

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        """One POST to the messaging endpoint (:class:`gateway.types.HttpInbound`); never raises."""
        if request.method != "POST":
            return HttpResponse(405, {"error": "the Bot Framework POSTs activities here"}, {"Allow": "POST"})
        verifier = self._verifier
        if verifier is None or self._handler is None:
            return HttpResponse(503, {"error": "the teams platform is not running; retry shortly"},
                                {"Retry-After": "5"})
        if len(request.body) > MAX_BODY:
            return HttpResponse(413, {"error": f"an activity is at most {MAX_BODY} bytes"})
        try:
            activity = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            return HttpResponse(400, {"error": "the body is not JSON"})
        if not isinstance(activity, dict):
            return HttpResponse(400, {"error": "an activity is a JSON object"})
        try:
            await verifier.verify(request.headers.get("authorization"), activity)
        except Unauthorized as exc:
            self.unauthorized += 1
            log.warning("teams: refused an activity from %s: %s", request.remote, exc)
            return HttpResponse(401, {"error": "unauthorized"})
        self._health.last_event_at = asyncio.get_running_loop().time()
        return await self._on_activity(activity)

    async def _on_activity(self, activity: dict) -> HttpResponse:
        kind = activity.get("type")
        command = events.submitted_command(activity)
        if kind not in ("message", "invoke") or (kind == "invoke" and command is None):
            return _OK  # conversationUpdate, messageUpdate (an edit), reactions...
        shape = events.shape_of(activity)
        if shape is None or not allowed_service_url(shape.service_url, self._service_hosts):
            await self._failed.set_aside(_str_id(activity), activity, None,
                                         ValueError("an activity without a usable conversation, id, sender or serviceUrl"))
            return _OK
        if events.is_from_bot(activity, self.bot_id):
            return _OK
        event_id = f"{shape.chat_id}/{shape.message_id}"
        if event_id in self._done:
            return self._answer(kind)
        self._service_urls.remember(shape.chat_id, shape.service_url)
        lock = self._chat_locks.get(shape.chat_id)
        if lock is None:
            lock = asyncio.Lock()
            self._chat_locks.remember(shape.chat_id, lock)
        async with lock:
            if event_id in self._done:
                return self._answer(kind)
            message = None
            try:
                message = await self._message(activity, shape, command)
                assert self._handler is not None
                await self._handler(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Teams sends it again, or it is set aside
                log.warning("teams: activity %s failed: %s: %s", shape.message_id, type(exc).__name__, exc)
                if not await self._failed.give_up(event_id, activity, message, exc):
                    return HttpResponse(500, {"error": "not stored; send it again"})
            self._failed.forget(event_id)
            self._done.remember(event_id, True)
        return self._answer(kind)

    @staticmethod
    def _answer(kind: object) -> HttpResponse:
        if kind == "invoke":  # Action.Execute wants an invoke response; the reply comes as its own message
            return HttpResponse(200, {"statusCode": 200, "type": "application/vnd.microsoft.activity.message",
                                      "value": "Got it."})
        return _OK

    async def _message(self, activity: dict, shape: events.Shape, command: str | None) -> InboundMessage:
        if command is not None:
            text, addressed, attachments = command, True, ()
        else:
            text = events.clean_text(activity, self.bot_id)
            addressed = (shape.chat_type is ChatType.DM or shape.chat_id in self._free
                         or not self._require_mention or events.mentions_bot(activity, self.bot_id))
            files = events.file_attachments(activity)
            attachments = ()
            if files and self._http is not None and self._token is not None:
                attachments = await collect(self._http, files, service_url=shape.service_url, token=self._token,
                                            limits=self._media)
        return InboundMessage(platform=PLATFORM, chat_type=shape.chat_type, chat_id=shape.chat_id,
                              user_id=shape.user_id, text=text, message_id=shape.message_id,
                              thread_id=shape.thread_id, user_name=shape.user_name, attachments=attachments,
                              addressed=addressed)

    # ------------------------------------------------------------------ outbound

    def _where(self, chat: ChatRef) -> tuple[str, str]:
        return (self._service_urls.get(chat.chat_id) or self._default_service_url,
                events.conversation_id(chat.chat_id, chat.thread_id))

    def _not_running(self) -> Delivery | None:
        if self._connector is None:
            return Delivery(ok=False, error="teams adapter is not running", retry_later=True)
        if self._token is not None and self._token.rejected:
            return Delivery(ok=False, error=self._token.rejected, retry_later=True)
        return None

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        """Post a Markdown reply as Teams Markdown, split within the limit; never raises."""
        refused = self._not_running()
        if refused is not None:
            return refused
        assert self._connector is not None
        parts = split_message(to_teams(text), TEXT_LIMIT)
        if not parts:
            return Delivery(ok=False, error="empty reply: nothing to send")
        progress = progress if progress is not None else SendProgress()
        service_url, conversation = self._where(chat)
        try:
            for index, part in enumerate(parts):
                if index < progress.skip:
                    continue
                activity_id = await self._connector.send(service_url, conversation, _message(part))
                await progress.confirmed(activity_id, last=index == len(parts) - 1)
        except (PartFailed, CredentialsRejected) as exc:
            self._note_failure(exc)
            return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=str(exc),
                            retry_later=isinstance(exc, CredentialsRejected))
        except Exception as exc:  # the gateway records a failed delivery, never an exception
            log.exception("teams: unexpected failure sending to %s", conversation)
            return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=f"{type(exc).__name__}: {exc}")
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    def _note_failure(self, exc: BaseException) -> None:
        self._health.last_error = str(exc)
        if isinstance(exc, CredentialsRejected):
            self._health.state = "failed"
        log.warning("teams: reply not delivered: %s", exc)

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        """``text`` in an Adaptive Card with one ``Action.Submit`` per button."""
        refused = self._not_running()
        if refused is not None:
            return refused
        assert self._connector is not None
        service_url, conversation = self._where(chat)
        try:
            activity_id = await self._connector.send(service_url, conversation, _card(text, buttons))
        except (PartFailed, CredentialsRejected) as exc:
            self._note_failure(exc)
            return Delivery(ok=False, error=str(exc))
        return Delivery(ok=True, message_ids=(activity_id,))

    # -- a streamed reply: one message, updated in place (gateway.streaming.DraftOutput) ---------

    message_limit = TEXT_LIMIT

    def measure(self, text: str) -> int:
        return len(to_teams(text))

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        answer = await self._draft("POST", chat, text, None, final, buttons)
        return str(answer.get("id") or "")

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        await self._draft("PUT", chat, text, message_id, final, buttons)

    async def _draft(self, method: str, chat: ChatRef, text: str, activity_id: str | None, final: bool,
                     buttons: tuple[Button, ...]) -> dict:
        connector = self._connector
        if connector is None:
            raise AdapterError("teams adapter is not running")
        service_url, conversation = self._where(chat)
        if buttons:
            body = _card(text, buttons)
        else:
            body = _message(to_teams(text) if final else text, markdown=final)
        if activity_id is not None:
            body["id"] = activity_id
        try:
            return await connector.call(method, service_url, conversation, body, activity_id=activity_id)
        except CredentialsRejected as exc:
            self._note_failure(exc)
            raise PlatformHTTPError(PLATFORM, 401, str(exc)) from None

    async def send_typing(self, chat: ChatRef) -> None:
        if self._connector is None or (self._token is not None and self._token.rejected):
            return
        service_url, conversation = self._where(chat)
        await self._connector.typing(service_url, conversation)


def _str_id(activity: dict) -> str | None:
    value = activity.get("id")
    return value if isinstance(value, str) else None


def _message(text: str, *, markdown: bool = True) -> dict:
    return {"type": "message", "text": text, "textFormat": "markdown" if markdown else "plain"}


def _card(text: str, buttons: tuple[Button, ...]) -> dict:
    """An Adaptive Card: the text, then one Action.Submit per button, its data the button's command."""
    card = {
        "type": "AdaptiveCard", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "version": "1.4",
        "body": [{"type": "TextBlock", "text": to_teams(text)[:TEXT_LIMIT], "wrap": True}],
        "actions": [{"type": "Action.Submit", "title": b.label[:40],
                     "style": "destructive" if b.style == "danger" else "positive",
                     "data": {events.SUBMIT_KEY: b.command}} for b in buttons],
    }
    return {"type": "message", "text": to_teams(text)[:TEXT_LIMIT], "textFormat": "markdown",
            "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "content": card}]}
