"""The Discord adapter on discord.py 2.7: connect, normalize, reply.

Lifecycle: :meth:`DiscordAdapter.open_for_sending` only logs in: discord.py's
REST client then sends replies, posts and edits drafts and shows typing by
channel id (partial messageables need no gateway cache), which is what a
standby instance of a cluster does while another instance holds the gateway
connection.  :meth:`DiscordAdapter.start` logs in (or keeps that login) (``GET /users/@me`` and
``/oauth2/applications/@me``), checks the Message Content intent, registers
the gateway's commands as global slash commands, opens the gateway websocket
and returns once READY arrived; then a supervisor task watches the
connection.  discord.py resumes dropped connections itself; the supervisor
restarts the client (with :class:`gateway.retry.Backoff`) when the library
gives up or the connection stalls (no frame, heartbeat ACKs included, for
``stall_timeout_seconds``).

Endpoints are process-wide: discord.py reads ``discord.http.Route.BASE`` and
``DiscordWebSocket.DEFAULT_GATEWAY`` (class attributes), so ``api_base_url``
and ``gateway_url`` apply to every discord.py client in the process; one
Discord adapter per process is the supported setup.  So is its JSON reader
(``discord.utils._from_json``), made tolerant of lone surrogates (``_tolerant_json``),
and each event's parser is guarded (``_guard_parsers``): an event discord.py cannot
read is set aside instead of ending the connection.

Sending lives in :mod:`.outbound`.

Slash commands are deferred at once (Discord wants an answer within 3 s,
before the gateway has persisted anything) and answered by follow-up: the
interaction is remembered under the InboundMessage's ``message_id`` and used
when ``send(..., reply_to=that id)`` comes.  Discord has no delivery
acknowledgement and no redelivery for gateway events, so a failing handler is
retried here (``deliver_attempts``, :data:`~gateway.types.DEAD_LETTER_AFTER` by
default, with backoff) before the event is set aside in the gateway's
dead-letter store, with the message's fields as its payload (discord.py keeps
no raw event); a message that cannot even be read is set aside at once.  A
slash command given up gets a follow-up telling the user.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import aiohttp
import discord
import yarl
from discord import app_commands

from gateway.errors import AdapterError, TokenRejected
from gateway.ratelimit import ChatRate
from gateway.retry import Backoff, retry_async
from gateway.tasks import spawn
from gateway.types import (
    DEAD_LETTER_AFTER,
    AdapterHealth,
    Button,
    ChatRef,
    ChatType,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    InboundHandler,
    InboundMessage,
    MediaLimits,
    SendProgress,
)

from . import attachments as _attachments, commands as _commands, events, redact
from .config import DiscordConfig
from .outbound import CHANNEL_RATE, Outbound, allowed_mentions
from .redact import describe

log = logging.getLogger(__name__)

PLATFORM = "discord"
DEFAULT_API_BASE_URL = "https://discord.com/api/v10"
DEFAULT_GATEWAY_URL = "wss://gateway.discord.gg/"
MESSAGE_CONTENT_HELP = (
    "Discord did not grant the Message Content intent, so the bot cannot read messages. "
    "Enable it in the Discord Developer Portal: your application -> Bot -> Privileged Gateway Intents -> "
    "Message Content Intent (bots in 100+ servers also need Discord's approval), then restart."
)
BAD_TOKEN_HELP = (
    "Discord rejected the bot token (401). Copy it again from the Discord Developer Portal "
    "(your application -> Bot -> Reset Token) into platforms.discord.token, then reload."
)
_APP_FLAG_MESSAGE_CONTENT = (1 << 18) | (1 << 19)  # GATEWAY_MESSAGE_CONTENT, GATEWAY_MESSAGE_CONTENT_LIMITED
_FATAL_CLOSE_CODES = {4014: MESSAGE_CONTENT_HELP}  # and 4004, the token: _bad_token()


class _Fatal(AdapterError):
    """A start failure that retrying cannot fix (bad token, missing intent)."""


_STRICT_JSON = discord.utils._from_json  # orjson.loads when orjson is installed, else json.loads


def _tolerant_json(text: str | bytes) -> Any:
    """discord.py's JSON reader, falling back to the standard library's for what it refuses: orjson
    refuses a lone surrogate escape (``"\\ud800"``), and a frame it cannot read ends the gateway
    connection and is replayed on RESUME, so one such message would keep the bot offline.  The standard
    reader keeps the surrogate, and ``InboundMessage`` turns it into U+FFFD."""
    try:
        return _STRICT_JSON(text)
    except ValueError:
        return json.loads(text)


def _bad_token() -> TokenRejected:
    return TokenRejected(PLATFORM, "platforms.discord.token", BAD_TOKEN_HELP)


def _intents() -> discord.Intents:
    intents = discord.Intents.none()
    intents.guilds = True  # channel and thread cache: tells a thread from a channel
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True  # privileged: see MESSAGE_CONTENT_HELP
    return intents


class DiscordAdapter:
    """One Discord bot: gateway events in, replies out."""

    platform = PLATFORM

    def __init__(
        self,
        config: DiscordConfig,
        *,
        commands: Sequence[tuple[str, str]] = (),
        vision: bool = False,
        media: MediaLimits | None = None,
        max_image_bytes: int = 8 * 1024 * 1024,
        connect_timeout_seconds: float = 30.0,
        sync_commands: bool = True,
        send_rate: float = 5.0,
        send_burst: int = 5,
        channel_rate: ChatRate = CHANNEL_RATE,
        send_attempts: int = 4,
        send_total_seconds: float = 120.0,
        send_backoff: Backoff = Backoff(base=0.5, cap=10.0),
        reconnect_backoff: Backoff = Backoff(base=1.0, cap=60.0),
        deliver_attempts: int = DEAD_LETTER_AFTER,
        deliver_backoff: Backoff = Backoff(base=0.5, cap=5.0),
    ):
        """``config`` (``platforms.discord``, checked when it was loaded) says where to connect and what to
        answer; ``commands``, ``vision`` and ``media`` come from the rest of the config; the keywords after
        them pace, time and retry (tests and benches turn them)."""
        if not config.token.strip():
            raise AdapterError("platforms.discord.token is empty: paste the bot token from the Discord Developer Portal")
        self._token = config.token.strip()
        self.api_base_url = config.api_base_url.rstrip("/")
        self.gateway_url = config.gateway_url or DEFAULT_GATEWAY_URL
        self.require_mention = config.require_mention
        self.free_response_channels = frozenset(str(c) for c in config.free_response_channels)
        self.stall_timeout_seconds = config.stall_timeout_seconds
        self.commands = tuple((name.lower(), desc) for name, desc in commands)
        self.vision = vision
        self.max_image_bytes = max_image_bytes
        # what is downloaded, per kind (media.max_bytes); a picture no more than max_image_bytes either
        limits = media or MediaLimits()
        self.media_limits = replace(limits, image=min(limits.image, max_image_bytes))
        self.connect_timeout_seconds = connect_timeout_seconds
        self.sync_commands = sync_commands
        self._reconnect_backoff = reconnect_backoff
        self._deliver_attempts, self._deliver_backoff = max(1, deliver_attempts), deliver_backoff

        self._health = AdapterHealth(PLATFORM)
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._client: discord.Client | None = None
        self._connect_task: asyncio.Task | None = None
        self._supervisor: asyncio.Task | None = None
        self._connected = asyncio.Event()
        self._last_seen = time.monotonic()
        self._downloads: aiohttp.ClientSession | None = None
        self._outbound = Outbound(token=self._token, client=lambda: self._client, rate=send_rate, burst=send_burst,
                                  attempts=send_attempts, total_seconds=send_total_seconds, backoff=send_backoff,
                                  channel_rate=channel_rate)
        self._channel_cache: dict[int, events.Where] = {}
        self._stopping = False
        self._warned_empty_content = False
        self._commands_synced = False
        self._opening = asyncio.Lock()  # one login at a time: open_for_sending and start may overlap
        redact.install(self._token)

    @classmethod
    def from_config(cls, platform_cfg: DiscordConfig, *, commands: Sequence[tuple[str, str]], vision: bool,
                    media: MediaLimits | None = None) -> "DiscordAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.discord``."""
        return cls(platform_cfg, commands=commands, vision=vision, media=media)

    # ------------------------------------------------------------------ lifecycle

    async def open_for_sending(self) -> None:
        """Log in for REST only: send, post and edit drafts, show typing, without a gateway connection (a
        standby of a cluster); :meth:`start` later connects this same client, :meth:`stop` closes it."""
        async with self._opening:
            if self._client is not None:
                return
            self._stopping = False
            self._configure_endpoints()
            client = self._build_client()
            try:
                await self._login(client)
            except BaseException:
                await _close(client, None)
                raise
            self._client = client
            log.info("discord: logged in for sending as %s", client.user)

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        """Log in (unless :meth:`open_for_sending` did), connect, return once READY; :class:`AdapterError` says why not."""
        async with self._opening:
            if self._supervisor is not None:
                raise RuntimeError("DiscordAdapter.start() called twice; stop() it first")
            self._handler = handler
            self._failed = FailedEvents(PLATFORM, dead_letter)
            self._stopping = False
            self._configure_endpoints()
            self._health.state = "starting"
            self._downloads = aiohttp.ClientSession()
            try:
                await self._connect_once(self._client)  # a client logged in for sending only gains the connection
            except BaseException as exc:
                self._health.state = "failed"
                self._health.last_error = str(exc)
                await self._close_client()
                await self._downloads.close()
                self._downloads = None
                raise
            self._supervisor = spawn(self._supervise(), name="discord:supervisor")

    async def stop(self) -> None:
        """Disconnect (idempotent)."""
        self._stopping = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        await self._close_client()
        if self._downloads is not None:
            await self._downloads.close()
            self._downloads = None
        if self._health.state != "failed":
            self._health.state = "stopped"

    def health(self) -> AdapterHealth:
        return AdapterHealth(**self._health.as_dict())

    def _configure_endpoints(self) -> None:
        # Process-wide class attributes of discord.py (see the module docstring).
        discord.http.Route.BASE = self.api_base_url
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.gateway_url)
        discord.utils._from_json = _tolerant_json  # type: ignore[attr-defined]

    def _build_client(self) -> discord.Client:
        # The bot never joins voice: discord.py's "PyNaCl/davey is not installed" warnings would only mislead.
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
        client = discord.Client(
            intents=_intents(),
            enable_debug_events=True,  # socket_raw_receive: every frame, heartbeat ACKs included (stall watch)
            max_ratelimit_timeout=30.0,  # longer 429s come to us (discord.RateLimited) and are retried by us
            allowed_mentions=allowed_mentions(),
            http_trace=self._outbound.rate_limit_trace(),
        )
        tree = app_commands.CommandTree(client)
        for name, description in self.commands:
            try:
                tree.add_command(_commands.slash_command(self.on_command, name, description))
            except (TypeError, ValueError, app_commands.AppCommandError) as exc:
                log.warning("discord: command /%s not registered (%s); it still works as a text command", name, exc)

        async def setup_hook() -> None:
            if self.sync_commands and self.commands and not self._commands_synced:
                try:
                    await _commands.sync_commands(client, tree)
                    self._commands_synced = True  # once per adapter: a restart need not re-register
                except discord.HTTPException as exc:
                    log.warning("discord: registering slash commands failed (%s); text commands still work", exc)

        async def on_socket_raw_receive(_msg: Any) -> None:
            self._last_seen = time.monotonic()
            self._health.last_event_at = time.time()

        async def on_connect() -> None:
            self._mark_connected(client, "connected")

        async def on_resumed() -> None:
            self._mark_connected(client, "resumed")

        async def on_disconnect() -> None:
            if client is self._client and not self._stopping:
                self._health.state = "reconnecting"
                self._health.detail = "gateway connection lost; discord.py is resuming"

        async def on_message(message: discord.Message) -> None:
            await self._on_message(message)

        async def on_interaction(interaction: discord.Interaction) -> None:
            if interaction.type == discord.InteractionType.component:
                await self.on_button(interaction)

        client.setup_hook = setup_hook  # type: ignore[method-assign]
        for fn in (on_socket_raw_receive, on_connect, on_resumed, on_disconnect, on_message, on_interaction):
            client.event(fn)
        self._guard_parsers(client)
        return client

    def _guard_parsers(self, client: discord.Client) -> None:
        """discord.py parses each gateway event inside the websocket's read loop, so one event it cannot
        read (a field missing, an id that is not a snowflake) ends the connection, and the RESUME replays
        it: the bot would be offline for good.  Each event's parser is wrapped (``ConnectionState.parsers``
        is discord.py's own table; there is no public hook before parsing): such an event is logged and
        set aside as a dead letter, and the connection goes on.  READY and RESUMED are left alone: a
        session that cannot start is the supervisor's to restart."""
        parsers = client._connection.parsers
        for event, parse in list(parsers.items()):
            if event not in ("READY", "RESUMED"):
                parsers[event] = self._guarded(event, parse)

    def _guarded(self, event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
        def guarded(data: Any) -> None:
            try:
                parse(data)
            except Exception as exc:  # noqa: BLE001 - one unreadable event must not end the connection
                event_id = str(data.get("id") or "") or None if isinstance(data, dict) else None
                log.error("discord %s event %s cannot be read (%s: %s); setting it aside", event, event_id,
                          type(exc).__name__, exc)
                self._health.last_error = f"could not read a {event} event: {type(exc).__name__}: {exc}"
                payload = {"t": event, "d": data if isinstance(data, dict) else repr(data)}
                spawn(self._failed.set_aside(event_id, payload, None, exc), name="discord:unreadable-event")

        return guarded

    def _mark_connected(self, client: discord.Client, how: str) -> None:
        self._last_seen = time.monotonic()
        user = client.user
        self._health.state = "connected"
        self._health.detail = f"{how} as {user} ({user.id})" if user else how
        self._connected.set()

    async def _login(self, client: discord.Client) -> None:
        try:
            await asyncio.wait_for(client.login(self._token), self.connect_timeout_seconds)
        except discord.LoginFailure:
            raise _bad_token() from None
        except (discord.HTTPException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise AdapterError(f"could not log in to Discord at {self.api_base_url}: {describe(exc)}") from None

    async def _connect_once(self, logged_in: discord.Client | None = None) -> None:
        """One gateway connection, on ``logged_in`` or a new client (logged in here); publishes
        ``self._client`` or cleans up and raises AdapterError."""
        client = logged_in if logged_in is not None else self._build_client()
        self._connected = asyncio.Event()
        try:
            if logged_in is None:
                await self._login(client)
            if not (client.application_flags.value & _APP_FLAG_MESSAGE_CONTENT):
                raise _Fatal(MESSAGE_CONTENT_HELP)
            self._client = client  # logged in: sends may use its REST session from here on
            self._last_seen = time.monotonic()
            self._connect_task = task = asyncio.create_task(client.connect(reconnect=True),
                                                            name="DiscordAdapter:gateway")
            ready = asyncio.create_task(self._connected.wait())
            try:
                await asyncio.wait({task, ready}, timeout=self.connect_timeout_seconds,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
            if task.done():
                raise _start_error(task)
            if not self._connected.is_set():
                raise AdapterError(f"no READY from the Discord gateway at {self.gateway_url} within "
                                   f"{self.connect_timeout_seconds:.0f}s")
        except BaseException:
            if self._client is client:
                self._client = None
            await _close(client, self._connect_task)
            self._connect_task = None
            raise
        self._client = client

    async def _close_client(self) -> None:
        client, task = self._client, self._connect_task
        self._client, self._connect_task = None, None
        await _close(client, task)

    async def _supervise(self) -> None:
        """Restart the client when discord.py gives up or the connection stalls."""
        while not self._stopping:
            reason = await self._watch()
            if self._stopping:
                return
            log.warning("discord: restarting the gateway connection: %s", reason)
            self._health.state = "reconnecting"
            self._health.last_error = reason
            attempt = 0
            while not self._stopping:
                await self._close_client()
                try:
                    await self._connect_once()
                    log.info("discord: reconnected")
                    break
                except (_Fatal, TokenRejected) as exc:
                    self._health.state = "failed"
                    self._health.last_error = str(exc)
                    log.error("discord: %s", exc)
                    return
                except Exception as exc:  # anything else is worth another try
                    if not isinstance(exc, AdapterError):
                        log.exception("discord: unexpected error while reconnecting")
                    wait = self._reconnect_backoff.delay(attempt, random)
                    attempt += 1
                    self._health.last_error = str(exc)
                    self._health.detail = f"reconnect attempt {attempt} failed; next in {wait:.1f}s"
                    log.warning("discord: reconnect attempt %d failed: %s (next in %.1fs)", attempt, exc, wait)
                    await asyncio.sleep(wait)

    async def _watch(self) -> str:
        """Wait until the connection task ends or stalls; return why."""
        tick = max(0.05, min(self.stall_timeout_seconds / 4, 5.0))
        while True:
            task = self._connect_task
            if task is None:
                return "no connection"
            done, _ = await asyncio.wait({task}, timeout=tick)
            if done:
                error = _start_error(task)
                if isinstance(error, (_Fatal, TokenRejected)):
                    self._health.state = "failed"
                    self._health.last_error = str(error)
                    log.error("discord: %s", error)
                    self._stopping = True
                    return str(error)
                return f"the gateway connection ended: {error}"
            idle = time.monotonic() - self._last_seen
            if idle > self.stall_timeout_seconds:
                return f"no gateway frame (event or heartbeat ACK) for {idle:.0f}s"

    # ------------------------------------------------------------------ inbound

    async def _place(self, channel: Any) -> events.Where | None:
        place = events.where(channel)
        if place is not None:
            return place
        cached = self._channel_cache.get(channel.id)
        if cached is not None:
            return cached
        client = self._client
        if client is None:
            return None
        try:  # a channel missing from the cache (e.g. a thread the gateway never announced)
            place = events.where(await client.fetch_channel(channel.id))
        except (discord.HTTPException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("discord: could not look up channel %s: %s", channel.id, describe(exc))
            return None
        if place is not None:
            if len(self._channel_cache) > 4096:
                self._channel_cache.clear()
            self._channel_cache[channel.id] = place
        return place

    def _addressing(self) -> events.Addressing:
        user = self._client.user if self._client else None
        return events.Addressing(
            bot_id=user.id if user else 0,
            require_mention=self.require_mention,
            free_response_channels=self.free_response_channels,
            command_names=frozenset(name for name, _ in self.commands),
        )

    async def _on_message(self, message: discord.Message) -> None:
        try:
            addressing = self._addressing()
            if events.ignore_reason(message, addressing.bot_id):
                return
            place = await self._place(message.channel)
            if place is None:
                log.warning("discord message %s skipped: unknown kind of channel %s", message.id, message.channel.id)
                return
            self._warn_if_content_missing(message, place)
            if events.from_message(message, place, addressing) is None:
                return
            files = await _attachments.collect(message.attachments, self._downloads, limits=self.media_limits,
                                               api_base_url=self.api_base_url)
            inbound = events.from_message(message, place, addressing, attachments=files)
        except Exception as exc:  # one odd event must not kill the adapter
            log.exception("discord message %s could not be normalized; setting it aside", getattr(message, "id", "?"))
            await self._failed.set_aside(str(getattr(message, "id", "")) or None, _message_payload(message), None, exc)
            return
        if inbound is None:
            return
        if inbound.chat_type is ChatType.DM:
            self._outbound.remember_dm(inbound.chat_id)
        await self._deliver(inbound, lambda: _message_payload(message))

    def _warn_if_content_missing(self, message: discord.Message, place: events.Where) -> None:
        if (place.chat_type is ChatType.DM or message.content or message.attachments or message.embeds
                or message.stickers or message.poll or getattr(message, "message_snapshots", None)
                or self._warned_empty_content):
            return
        self._warned_empty_content = True
        log.warning("discord: a guild message arrived with empty content. %s", MESSAGE_CONTENT_HELP)

    async def _deliver(self, inbound: InboundMessage, payload: Callable[[], dict]) -> bool | None:
        """Hand ``inbound`` to the gateway, retrying a failing handler (Discord never redelivers);
        after the last attempt the event (``payload()``) is set aside as a dead letter.

        True: taken (an answer will come); None: the gateway dropped it on purpose and will send
        nothing; False: it could not be handed over."""
        handler = self._handler
        if handler is None:
            return False
        taken = True

        def on_retry(attempt: int, exc: BaseException, wait: float) -> None:
            log.warning("discord: the gateway failed to take message %s (%s: %s); retry %d in %.1fs",
                        inbound.message_id, type(exc).__name__, exc, attempt, wait)

        try:
            taken = await retry_async(lambda: handler(inbound), classify=lambda exc: 0.0, backoff=self._deliver_backoff,
                                      max_attempts=self._deliver_attempts, on_retry=on_retry)
            return None if taken is False else True
        except Exception as exc:  # the handler's failure is logged; the adapter lives on
            log.exception("discord: the gateway failed to take message %s from chat %s; giving up after %d tries",
                          inbound.message_id, inbound.chat_id, self._deliver_attempts)
            await self._failed.set_aside(inbound.message_id, payload(), inbound, exc)
            return False

    async def on_button(self, interaction: discord.Interaction) -> None:
        """A press of one of our buttons (a message component): acknowledged at once (3 s rule, the
        message stays as it is), then handed over as the presser's command (``gateway.types.Button``)."""
        custom_id = str((interaction.data or {}).get("custom_id") or "")
        try:
            await interaction.response.defer()
        except discord.HTTPException as exc:
            log.warning("discord: could not acknowledge a button press: %s", describe(exc))
        if not custom_id.startswith("/") or interaction.channel is None:
            return
        place = await self._place(interaction.channel)
        if place is None:
            return
        user = interaction.user
        inbound = InboundMessage(platform=events.PLATFORM, chat_type=place.chat_type, chat_id=place.chat_id,
                                 thread_id=place.thread_id, user_id=str(user.id), user_name=user.display_name,
                                 text=custom_id, message_id=f"button:{interaction.id}", addressed=True)
        await self._deliver(inbound, lambda: {"id": str(interaction.id), "type": "component",
                                              "channel_id": str(interaction.channel_id),
                                              "user": {"id": str(user.id)}, "custom_id": custom_id})

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        return await self._outbound.send_buttons(chat, text, buttons, reply_to=reply_to)

    async def on_command(self, interaction: discord.Interaction, name: str, args: str | None) -> None:
        """A slash command: defer first (3 s rule), hand it over, remember where the answer goes."""
        try:
            await interaction.response.defer(thinking=True)
        except discord.HTTPException as exc:
            log.warning("discord: deferring /%s failed (%s); the answer will go to the channel", name, describe(exc))
        place = await self._place(interaction.channel) if interaction.channel is not None else None
        if place is None:
            log.warning("discord: /%s from an unknown kind of channel; ignored", name)
            await _commands.tell(interaction, name, "This command is not available here.")
            return
        inbound = events.from_command(interaction, place, name, args)
        self._outbound.remember_interaction(inbound.message_id or "", interaction.application_id, interaction.token)
        if place.chat_type is ChatType.DM:
            self._outbound.remember_dm(place.chat_id)
        taken = await self._deliver(inbound, lambda: _interaction_payload(interaction, name, args))
        if taken is None:
            # The gateway answers nothing (e.g. a stranger in a channel): withdraw "thinking…" rather
            # than leave Discord to say the application did not respond.
            try:
                await interaction.delete_original_response()
            except discord.HTTPException as exc:
                log.debug("discord: could not withdraw the deferred answer to /%s: %s", name, describe(exc))
        elif not taken:
            await _commands.tell(interaction, name, "Sorry, that command could not be processed. Please try again.")

    # ------------------------------------------------------------------ outbound

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        """Send a Markdown reply, split at 2,000 characters; never raises (see :mod:`.outbound`)."""
        return await self._outbound.send(chat, text, reply_to=reply_to, progress=progress)

    async def send_typing(self, chat: ChatRef) -> None:
        await self._outbound.send_typing(chat)

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        """A spoken reply uploaded as an audio file (``/voice on``); never raises (see :mod:`.outbound`)."""
        return await self._outbound.send_voice(chat, audio, reply_to=reply_to)

    # A streamed reply (gateway.streaming.DraftOutput): the outbound half does it.

    @property
    def message_limit(self) -> int:
        return self._outbound.message_limit

    def measure(self, text: str) -> int:
        return self._outbound.measure(text)

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        return await self._outbound.post_draft(chat, text, reply_to=reply_to, final=final, buttons=buttons)

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        await self._outbound.edit_draft(chat, message_id, text, final=final, buttons=buttons)


def _message_payload(message: discord.Message) -> dict:
    """What Discord sent for a message (the fields discord.py keeps), for a dead letter."""
    channel = getattr(message, "channel", None)
    guild = getattr(message, "guild", None)
    author = getattr(message, "author", None)
    return {
        "id": str(getattr(message, "id", "")),
        "channel_id": str(getattr(channel, "id", "")),
        "guild_id": str(guild.id) if guild is not None else None,
        "author": {"id": str(getattr(author, "id", "")), "username": getattr(author, "name", None)},
        "content": getattr(message, "content", None),
        "type": str(getattr(message, "type", "")),
        "attachments": [{"id": str(a.id), "filename": a.filename, "size": a.size, "content_type": a.content_type}
                        for a in getattr(message, "attachments", ())],
    }


def _interaction_payload(interaction: discord.Interaction, name: str, args: str | None) -> dict:
    """A slash command as Discord sent it, without its token, for a dead letter."""
    return {
        "id": str(interaction.id),
        "type": "application_command",
        "channel_id": str(interaction.channel_id),
        "guild_id": str(interaction.guild_id) if interaction.guild_id else None,
        "user": {"id": str(interaction.user.id), "username": interaction.user.name},
        "data": {"name": name, "options": [] if args is None else [{"name": "args", "value": args}]},
    }


async def _close(client: discord.Client | None, task: asyncio.Task | None) -> None:
    """Close a client (bounded: a half-dead socket must not hold us) and its connection task."""
    if client is not None:
        try:
            await asyncio.wait_for(client.close(), 10.0)
        except (asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - closing a broken client is best effort
            log.debug("discord: closing the client: %s", describe(exc))
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _start_error(task: asyncio.Task) -> AdapterError:
    """The AdapterError for a finished ``client.connect()`` task."""
    if task.cancelled():
        return AdapterError("the gateway connection was cancelled")
    exc = task.exception()
    if exc is None:
        return AdapterError("the gateway connection closed")
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return _Fatal(MESSAGE_CONTENT_HELP)
    if isinstance(exc, discord.ConnectionClosed) and exc.code == 4004:  # Authentication failed
        return _bad_token()
    if isinstance(exc, discord.ConnectionClosed) and exc.code in _FATAL_CLOSE_CODES:
        return _Fatal(_FATAL_CLOSE_CODES[exc.code])
    if isinstance(exc, discord.LoginFailure):
        return _bad_token()
    return AdapterError(f"the Discord gateway connection failed: {describe(exc)}")
