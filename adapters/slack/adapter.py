"""The Slack adapter: slack-bolt (async) in Socket Mode or HTTP Events mode.

Acknowledgement (what bolt allows, read in ``slack_bolt/listener/asyncio_runner.py``):
the app runs with ``process_before_response=True``, so for Events API
payloads bolt awaits our listener and only then acks (the Socket Mode
envelope ack, or the HTTP 200).  Our listener awaits the gateway's handler,
so an event is acknowledged only once it is persisted.  When the handler
raises, the listener re-raises, bolt answers 500, the Socket Mode envelope
is not acked and Slack redelivers it (HTTP mode: Slack retries).  Failures
are counted per event id: at failure number :data:`~gateway.types.DEAD_LETTER_AFTER`
the event is set aside in the gateway's dead-letter store and acknowledged, so
Slack stops redelivering it and the chat moves on.  Slash
commands must be acked within 3 s and are never redelivered, so they are
acked at once and handed to the gateway in a background task; the answer
goes to the command's ``response_url`` (see :mod:`.outbound`).

Duplicates and what counts as addressed: see :mod:`.inbound`.  Connections
(Socket Mode with its stall watchdog, the HTTP endpoint): :mod:`.connection`.
Sending (split at 3,900 characters, paced, 429 retried, plain-text fallback,
response_url): :mod:`.outbound`.

Threads (the documented choice): a top-level message in a channel that
addresses the bot is answered in a thread under it, and that thread keys
the session from the first message on: the event becomes ``ChatType.THREAD``
with ``thread_id`` = the message's own ``ts``, and every later message in the
thread has ``thread_ts`` = that ts, so one session holds the whole thread.
Messages in a thread the bot is in (it was addressed there, it posted
there, or it started it) are addressed without a mention; the adapter
remembers such threads in memory (after a restart, a thread needs a new
mention unless the bot started it).  With ``reply_in_thread=False``
top-level channel messages become ``ChatType.CHANNEL`` (``GROUP`` for a
multi-person DM), one session per user, answered at top level.  Slash
commands carry no thread, so in a channel they act on the user's CHANNEL
session; in a thread, write ``@bot /new`` instead.

Sending only: :meth:`SlackAdapter.open_for_sending` opens the Web API client
(``auth.test`` tells it its own ids) and no Socket Mode connection or HTTP
endpoint: a standby instance of a cluster sends replies and drafts that way
while another instance holds the socket; :meth:`SlackAdapter.start` later adds
the connection on the same client, :meth:`SlackAdapter.stop` closes both.

Typing: Slack has no typing indicator for bots posting with
chat.postMessage.  ``send_typing_on`` adds a reaction (``typing_reaction``,
default ``hourglass_flowing_sand``) to the message being answered, which the
router names (``send_typing``: the user's last message this instance saw in
that chat), removed when the reply is sent or its streamed message is whole;
without the ``reactions:write`` scope it turns itself off after one warning.
``typing_reaction=None`` makes it a no-op.  An adapter open for sending only (a standby of a cluster) reacts to
the message named, as the instance holding the connection does.

Stall detection (Socket Mode): a watchdog restarts the Socket Mode client
when it reports connected but no envelope, hello or pong arrived for
``stall_timeout_seconds``; restarts back off with :class:`gateway.retry.Backoff`.
In HTTP mode Slack connects to us, so silence is not a fault.

Approval buttons (Block Kit actions) need the app's Interactivity turned on (in HTTP mode, its
Request URL is the events path); a press arrives as ``block_actions``, is acked at once, and is
handed over in the background as the presser's command.

Scopes the Slack app needs: ``chat:write``, ``app_mentions:read``,
``im:history``, ``channels:history``, ``groups:history``, ``mpim:history``
(events ``message.im``, ``message.channels``, ``message.groups``,
``message.mpim``, ``app_mention``), ``commands`` for slash commands,
``users:read`` for names, ``files:read`` for images, ``reactions:write`` for
the typing reaction; Socket Mode needs an app-level token with
``connections:write``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Iterable, Sequence

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gateway.errors import AdapterError, RateLimited, TokenRejected
from gateway.formatting import split_message
from gateway.ratelimit import ChatRate, chat_budget_for, limiter_for
from gateway.retry import Backoff
from gateway.tasks import spawn
from gateway.types import (
    AdapterHealth,
    Button,
    ChatRef,
    DeadLetterHandler,
    Delivery,
    InboundHandler,
    MediaLimits,
    SendProgress,
)

from .config import SlackConfig
from .connection import TOKEN_ERRORS, HttpEndpoint, Pulse, SocketConnection
from .inbound import Inbound, InboundSettings, Lru
from .mrkdwn import to_mrkdwn
from .outbound import TEXT_LIMIT, PartFailed, Sender, describe_slack_error

log = logging.getLogger(__name__)

# One budget per channel for posts and the typing reaction (Slack: about 1 message a second in a
# channel, short bursts allowed).
CHANNEL_RATE = ChatRate(rate=SlackConfig.CAPABILITIES.chat_rate, burst=SlackConfig.CAPABILITIES.chat_burst)

PLATFORM = "slack"
ACTION_PREFIX = "switchboard_button_"  # our buttons' action ids (a press of another app's is not ours)
SECTION_LIMIT = 3000  # the most text a section block holds


class SlackAdapter:
    """Slack on slack-bolt; implements :class:`gateway.types.Adapter`."""

    platform = PLATFORM

    def __init__(
        self,
        config: SlackConfig,
        *,
        commands: Sequence[tuple[str, str]] = (),
        vision: bool = False,
        media: MediaLimits | None = None,
        http_host: str = "127.0.0.1",
        reply_in_thread: bool = True,
        max_image_bytes: int = 5_000_000,
        typing_reaction: str | None = "hourglass_flowing_sand",
        connect_timeout: float = 30.0,
        send_rate: float = 1.0,
        send_burst: int = 4,
        send_backoff: Backoff = Backoff(),
        send_attempts: int = 5,
        send_total_seconds: float = 90.0,
        reconnect_backoff: Backoff = Backoff(base=1.0, cap=60.0),
        duplicate_wait: float = 2.0,
        channel_rate: ChatRate = CHANNEL_RATE,
    ):
        """``config`` (``platforms.slack``, checked when it was loaded: the mode's credentials, the path)
        says how to connect and what to answer; ``commands``, ``vision`` and ``media`` come from the rest
        of the config; the keywords after them shape replies, pace and retry (tests and benches turn them)."""
        if not config.bot_token:
            raise ValueError("bot_token is required (xoxb-..., OAuth & Permissions > Bot User OAuth Token)")
        self.mode = config.mode
        self._bot_token = config.bot_token
        self._app_token = config.app_token
        self._signing_secret = config.signing_secret
        self._http_host, self._http_port, self._http_path = http_host, config.http_port, config.http_path
        api_base_url = config.api_base_url
        self._api_base_url = api_base_url if api_base_url.endswith("/") else api_base_url + "/"
        self._settings = InboundSettings(
            require_mention=config.require_mention,
            free_channels=frozenset(c.strip().lstrip("#") for c in config.free_response_channels),
            reply_in_thread=reply_in_thread,
            commands=frozenset(name.lower() for name, _ in commands),
            vision=vision,
            max_image_bytes=max_image_bytes,
            duplicate_wait=duplicate_wait,
            api_base_url=self._api_base_url,
            media=media or MediaLimits(),
        )
        self._stall_timeout = float(config.stall_timeout_seconds)
        self._typing_reaction = typing_reaction
        self._connect_timeout = connect_timeout
        self._send_rate, self._send_burst = send_rate, send_burst
        self._send_backoff, self._send_attempts, self._send_total = send_backoff, send_attempts, send_total_seconds
        self._reconnect_backoff = reconnect_backoff
        self._native_streaming = config.native_streaming
        self._channel_rate = channel_rate
        self._native_shown: dict[str, str] = {}  # ts of a message streamed with chat.startStream -> its text

        self._health = AdapterHealth(PLATFORM)
        self._pulse = Pulse(self._on_event_seen)
        self._client: AsyncWebClient | None = None
        self._sender: Sender | None = None
        self._inbound: Inbound | None = None
        self._connection: SocketConnection | HttpEndpoint | None = None
        self._http: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._opening = asyncio.Lock()  # one Web API client: open_for_sending and start may overlap
        self._who = ""  # "@name (id) in team", from auth.test
        self._reacted = Lru()  # ts -> (channel, thread), where the typing reaction is on
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self.http_port: int | None = None  # the bound port in HTTP mode (useful with http_port=0)

    @classmethod
    def from_config(cls, platform_cfg: SlackConfig, *, commands: Sequence[tuple[str, str]], vision: bool,
                    media: MediaLimits | None = None) -> "SlackAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.slack``."""
        return cls(platform_cfg, commands=commands, vision=vision, media=media)

    # ------------------------------------------------------------------ lifecycle

    def health(self) -> AdapterHealth:
        return self._health

    def _set_state(self, state: str, error: str | None = None) -> None:
        if state != self._health.state:
            log.info("slack: %s", state if error is None else f"{state} ({error})")
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    def _on_event_seen(self, at: float) -> None:
        self._health.last_event_at = at

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._started:
            raise RuntimeError("SlackAdapter.start() called twice")
        self._started = True
        self._set_state("starting")
        try:
            await self._start(handler, dead_letter)
        except asyncio.CancelledError:  # the daemon gave up on this start: leave nothing open
            await self._close_resources()
            self._started = False
            self._set_state("stopped")
            raise
        except Exception as exc:  # report with the reason, never a token
            error = exc if isinstance(exc, AdapterError) else AdapterError(f"slack: could not start: {type(exc).__name__}: {exc}")
            self._set_state("failed", str(error))
            await self._close_resources()
            self._started = False
            if error is exc:
                raise
            raise error from None

    async def open_for_sending(self) -> None:
        """Open the Web API client only: send, post and edit drafts, without a Socket Mode connection or
        HTTP endpoint (a standby of a cluster); :meth:`start` later adds the connection, :meth:`stop` closes both."""
        async with self._opening:
            if self._sender is not None:
                return
            try:
                await self._open_client()
            except BaseException:
                await self._close_resources()
                raise
            log.info("slack: open for sending as %s", self._who)

    async def _open_client(self) -> None:
        """The Web API client, its rate limits and who the bot is (``auth.test``); raises AdapterError."""
        # One HTTP session for every Web API call: slack-sdk otherwise opens a new session (and
        # connection) per call, which costs more CPU than the rest of a reply (bench/adapters.py).
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        client = AsyncWebClient(token=self._bot_token, base_url=self._api_base_url, timeout=30, session=self._http)
        try:
            auth = await asyncio.wait_for(client.auth_test(), self._connect_timeout)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "error"
            help = (f"Slack refused the bot token ({error}); set platforms.slack.bot_token to the Bot User "
                    "OAuth Token (xoxb-...) of an installed app (api.slack.com/apps -> your app -> OAuth & "
                    "Permissions), then reload")
            if error in TOKEN_ERRORS:
                raise TokenRejected(PLATFORM, "platforms.slack.bot_token", help) from None
            raise AdapterError(f"slack: {help}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise AdapterError(f"slack: cannot reach {self._api_base_url} ({type(exc).__name__}); check the network and api_base_url") from None
        self.bot_user_id, self.bot_id = auth.get("user_id"), auth.get("bot_id")
        self._who = f"@{auth.get('user')} ({self.bot_user_id}) in {auth.get('team') or auth.get('team_id')}"
        limiter = limiter_for(PLATFORM, self._bot_token, rate=self._send_rate, burst=self._send_burst)
        self._client = client
        self._sender = Sender(client, limiter, backoff=self._send_backoff, max_attempts=self._send_attempts,
                              total_seconds=self._send_total,
                              chat_budget=lambda channel: chat_budget_for(PLATFORM, self._bot_token, channel,
                                                                                  self._channel_rate))

    async def _start(self, handler: InboundHandler, dead_letter: DeadLetterHandler | None) -> None:
        async with self._opening:
            if self._sender is None:  # not yet open for sending
                await self._open_client()
        assert self._client is not None
        who = self._who
        self._inbound = Inbound(
            client=self._client, handler=handler, dead_letter=dead_letter, settings=self._settings,
            health=self._health, http=self._http,
            bot_token=self._bot_token, bot_user_id=self.bot_user_id, bot_id=self.bot_id, beat=self._pulse.beat,
            apologize=lambda channel, message_id: self.send(
                ChatRef(PLATFORM, channel), "Sorry, that command failed. Please try again.", reply_to=message_id),
        )
        app = self._build_app(self._inbound)
        if self.mode == "socket":
            self._connection = SocketConnection(
                app, self._client, self._app_token, pulse=self._pulse, set_state=self._set_state,
                stall_timeout=self._stall_timeout, connect_timeout=self._connect_timeout, backoff=self._reconnect_backoff)
            await self._connection.open()
            self._health.detail = f"socket mode, bot {who}"
        else:
            self._connection = HttpEndpoint(app, host=self._http_host, port=self._http_port, path=self._http_path)
            await self._connection.open()
            self.http_port = self._connection.port
            self._health.detail = f"http mode on {self._http_host}:{self.http_port}{self._http_path}, bot {who}"
        self._set_state("connected")

    def _build_app(self, inbound: Inbound) -> AsyncApp:
        app = AsyncApp(
            client=self._client,
            signing_secret=self._signing_secret or "socket-mode-unused",
            # Events are acked only after our listener returned (bolt's "FaaS" mode).
            process_before_response=True,
            request_verification_enabled=self.mode == "http",
            logger=logging.getLogger(f"{__name__}.bolt"),
            name="switchboard",
        )

        @app.error
        async def on_error(error):  # one line instead of bolt's traceback (ours is logged)
            log.warning("slack: request not acknowledged: %s: %s", type(error).__name__, error)

        @app.event("message")
        async def on_message(event, body):  # bolt injects arguments by name
            await inbound.on_event(event, "message", body)

        @app.event("app_mention")
        async def on_mention(event, body):
            await inbound.on_event(event, "app_mention", body)

        @app.event(re.compile(".*"))
        async def on_other(event):  # subscribed but unused: ack so Slack does not resend it
            self._pulse.beat()
            log.debug("slack: ignoring %s event", event.get("type") if isinstance(event, dict) else "?")

        @app.action(re.compile(f"^{ACTION_PREFIX}"))
        async def on_action(ack, body):
            await ack()  # within Slack's 3 s; the gateway gets the press in the background
            self._pulse.beat()
            self._spawn(inbound.on_action(dict(body)), "slack:action")

        @app.command(re.compile(".*"))
        async def on_command(ack, command):
            await ack()  # within Slack's 3 s; the gateway gets it in the background
            self._pulse.beat()
            self._spawn(inbound.on_command(dict(command)), "slack:command")

        return app

    def _spawn(self, coro, name: str) -> None:
        task = spawn(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        if not self._started and self._sender is None:
            return
        self._started = False
        await self._close_resources()
        self._set_state("stopped")

    async def _close_resources(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._inbound = self._sender = self._client = None
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    # ------------------------------------------------------------------ outbound

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        """Post a Markdown reply as mrkdwn, in ``chat.thread_id`` when set; never raises."""
        sender, inbound = self._sender, self._inbound  # inbound is None while open for sending only
        if sender is None:
            return Delivery(ok=False, error="slack adapter is not running", retry_later=True)
        parts = split_message(to_mrkdwn(text), TEXT_LIMIT)
        if not parts:
            return Delivery(ok=False, error="empty reply: nothing to send")
        route = inbound.routes.get(reply_to) if reply_to and inbound is not None else None
        progress = progress if progress is not None else SendProgress()
        sent = progress.sent_ids
        try:
            for index, part in enumerate(parts):
                if index < progress.skip:
                    continue  # confirmed before a restart
                last = index == len(parts) - 1
                if route is not None and route.usable():
                    try:
                        await sender.respond(route, part)
                        await progress.confirmed(f"response_url:{index}", last=last)  # Slack returns no ts
                        continue
                    except PartFailed as exc:
                        log.warning("slack: %s; falling back to chat.postMessage", exc)
                        route = None
                await progress.confirmed(await sender.post(chat.chat_id, part, thread_ts=chat.thread_id), last=last)
        except PartFailed as exc:
            self._health.last_error = str(exc)
            log.warning("slack: reply to %s not delivered after %d of %d parts: %s", chat.chat_id, len(sent), len(parts), exc)
            return Delivery(ok=False, message_ids=tuple(sent), error=str(exc))
        except Exception as exc:  # the gateway records a failed delivery, never an exception
            log.exception("slack: unexpected failure sending to %s", chat.chat_id)
            return Delivery(ok=False, message_ids=tuple(sent), error=f"{type(exc).__name__}: {exc}")
        finally:
            await self._clear_typing(chat, reply_to)
        if chat.thread_id and inbound is not None:
            inbound.threads.remember((chat.chat_id, chat.thread_id), True)
        return Delivery(ok=True, message_ids=tuple(sent))

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        """``text`` in a section block with an actions block of buttons, each button's value its command."""
        sender = self._sender
        if sender is None:
            return Delivery(ok=False, error="slack adapter is not running", retry_later=True)
        shown = to_mrkdwn(text)[:SECTION_LIMIT]
        blocks = _button_blocks(shown, buttons)
        try:
            ts = await sender.post_blocks(chat.chat_id, shown, blocks, thread_ts=chat.thread_id)
        except PartFailed as exc:
            log.warning("slack: message with buttons to %s not delivered: %s", chat.chat_id, exc)
            return Delivery(ok=False, error=str(exc))
        return Delivery(ok=True, message_ids=(ts,))

    # -- a streamed reply: one message, updated in place (gateway.streaming.DraftOutput) ---------

    message_limit = TEXT_LIMIT

    def measure(self, text: str) -> int:
        return len(to_mrkdwn(text))  # what Slack holds is the text after our rewrite

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        try:
            return await self._draft(chat, text, None, final, buttons)
        finally:
            if final:
                await self._clear_typing_in(chat)

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        try:
            await self._draft(chat, text, message_id, final, buttons)
        finally:
            if final:  # the streamed answer is whole: the typing reaction comes off, as with a sent reply
                await self._clear_typing_in(chat)

    async def _draft(self, chat: ChatRef, text: str, ts: str | None, final: bool,
                     buttons: tuple[Button, ...] = ()) -> str:
        sender = self._sender
        if sender is None:
            raise AdapterError("slack adapter is not running")
        if buttons:  # an approval request's final form: a section and its buttons, by chat.postMessage or chat.update
            if ts is not None and ts in self._native_shown:
                await sender.end_native(chat.chat_id, ts, self._native_shown)
            shown = to_mrkdwn(text)[:SECTION_LIMIT]
            return await sender.draft(chat.chat_id, shown, thread_ts=chat.thread_id, ts=ts, final=True,
                                      blocks=_button_blocks(shown, buttons))
        native = ts in self._native_shown if ts is not None else self._native_streaming and bool(chat.thread_id)
        if native:
            try:
                return await sender.native_draft(chat.chat_id, text, thread_ts=chat.thread_id, ts=ts, final=final,
                                                 shown=self._native_shown)
            except RateLimited:
                raise
            except Exception as exc:  # noqa: BLE001 - any error of the streaming methods: chat.update from now on
                log.warning("slack: the streaming methods failed (%s); streamed replies use chat.update from now on",
                            describe_slack_error(exc))
                self._native_streaming = False
                if ts is not None:
                    await sender.end_native(chat.chat_id, ts, self._native_shown)
        return await sender.draft(chat.chat_id, to_mrkdwn(text) if final else text, thread_ts=chat.thread_id,
                                  ts=ts, final=final)

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        """A spoken reply (OGG/Opus) uploaded with files_upload_v2 beside its text (needs files:write); never raises."""
        sender, client = self._sender, self._client
        if sender is None or client is None:
            return Delivery(ok=False, error="slack adapter is not running", retry_later=True)
        try:
            await sender.chat_budget(chat.chat_id).acquire()
            resp = await client.files_upload_v2(channel=chat.chat_id, thread_ts=chat.thread_id, file=audio,
                                                filename="reply.ogg", title="Spoken reply")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the gateway records a failed delivery, never an exception
            error = describe_slack_error(exc)
            log.warning("slack: voice message to %s not delivered: %s", chat.chat_id, error)
            return Delivery(ok=False, error=error)
        file = resp.get("file") or {}
        return Delivery(ok=True, message_ids=(str(file.get("id") or ""),))

    async def send_typing(self, chat: ChatRef) -> None:
        """React to the user's latest message in ``chat`` (Slack has no bot typing indicator)."""
        await self.send_typing_on(chat, None)

    async def send_typing_on(self, chat: ChatRef, message_id: str | None) -> None:
        """React to ``message_id`` (its ts), the message being answered; when None, to the user's latest
        message in ``chat`` that this instance received.  A standby, open for sending only, reacts too."""
        if not self._typing_reaction or self._client is None or self._sender is None:
            return
        inbound = self._inbound if self._started else None
        ts = message_id or (inbound.last_message.get((chat.chat_id, chat.thread_id)) if inbound else None)
        if ts is None or ts in self._reacted:
            return
        if not await self._sender.chat_budget(chat.chat_id).take_if_free():
            return  # best effort: never queued in front of a reply, never sent during a pause
        self._reacted.remember(ts, (chat.chat_id, chat.thread_id))
        try:
            await self._client.reactions_add(channel=chat.chat_id, name=self._typing_reaction, timestamp=ts)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "error"
            if error in ("missing_scope", "not_allowed_token_type", "invalid_name"):
                log.warning("slack: typing reaction turned off (%s); add the reactions:write scope to use it", error)
                self._typing_reaction = None
            elif error != "already_reacted":
                log.debug("slack: reactions.add failed: %s", error)
        except Exception as exc:  # noqa: BLE001 - best effort
            log.debug("slack: reactions.add failed: %s", type(exc).__name__)

    async def _clear_typing(self, chat: ChatRef, reply_to: str | None) -> None:
        latest = self._inbound.last_message.get((chat.chat_id, chat.thread_id)) if self._inbound else None
        await self._unreact({reply_to, latest} - {None})

    async def _clear_typing_in(self, chat: ChatRef) -> None:
        """Take the typing reaction off every message in ``chat`` (its thread) that has it: one turn at a
        time runs in a chat, so they are all the one just answered (a streamed reply names no message)."""
        where = (chat.chat_id, chat.thread_id)
        await self._unreact([ts for ts, at in self._reacted.items() if at == where])

    async def _unreact(self, stamps: Iterable[str]) -> None:
        for ts in stamps:
            at = self._reacted.pop(ts, None)
            if at is None or self._client is None or not self._typing_reaction:
                continue
            channel = at[0]
            try:
                await self._client.reactions_remove(channel=channel, name=self._typing_reaction, timestamp=ts)
            except Exception as exc:  # noqa: BLE001 - best effort
                log.debug("slack: reactions.remove failed: %s", type(exc).__name__)


def _button_blocks(shown: str, buttons: tuple[Button, ...]) -> list[dict]:
    """``shown`` (mrkdwn) in a section block with an actions block of buttons, each button's value its command."""
    elements = [{"type": "button", "text": {"type": "plain_text", "text": b.label[:75]},
                 "action_id": f"{ACTION_PREFIX}{i}", "value": b.command[:2000],
                 "style": "danger" if b.style == "danger" else "primary"} for i, b in enumerate(buttons)]
    return [{"type": "section", "text": {"type": "mrkdwn", "text": shown}},
            {"type": "actions", "elements": elements}]
