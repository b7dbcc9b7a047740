"""The Matrix adapter: matrix-nio's ``AsyncClient`` for every call, our own /sync loop around it.

    adapter = MatrixAdapter(MatrixConfig(homeserver="https://example.org", access_token="syt_..."))
    adapter.keep_state_in(state)       # the gateway's store: the sync token survives restarts and takeovers
    await adapter.start(handler)       # whoami (or a password login, once), then /sync
    await adapter.send(ChatRef("matrix", "!room:example.org"), "**hi**")
    await adapter.stop()

Logging in: with ``access_token`` the adapter asks ``whoami`` who it is; with a ``password`` it logs
in once and keeps the token and device id in ``<home>/platforms/matrix/credentials.json`` (0600),
so later starts are the same device.  A refused token (``M_UNKNOWN_TOKEN``) fails the start with
the key to set (``gateway.errors.TokenRejected``: the daemon does not retry it until a reload), and
stops a running /sync for good, never retried in a loop.

Encrypted rooms (``crypto``): with ``encryption`` on (the default) the device's keys are kept in the
home, an encrypted event is decrypted and goes to the same normaliser as a plaintext one, and what the
bot sends into an encrypted room is encrypted.  An event it cannot decrypt is kept until its key comes
(the room told once if it does not); with ``encryption: false`` the first encrypted event of a room
makes the bot say in that room, once (remembered in the store), that it is not read, and every one is
logged.  Either way a message is never dropped without a word.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from nio import AsyncClient, AsyncClientConfig, LoginResponse, ProfileGetDisplayNameResponse, WhoamiResponse

from gateway.errors import AdapterError, TokenRejected
from gateway.retry import Backoff
from gateway.tasks import spawn
from gateway.types import (
    AdapterHealth,
    AdapterState,
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

from .config import MatrixConfig
from .crypto import KEY_WAIT_SECONDS, Crypto
from .events import PLATFORM, Addressing, Room, invite_sender, normalize, reaction_command
from .media import collect
from .outbound import MESSAGE_LIMIT, Outbound, approval_footer, split_reply
from .sync import TOKEN_HELP, SyncLoop

log = logging.getLogger(__name__)

CREDENTIALS = "credentials.json"
E2EE_NOTICE = ("I can't read end-to-end encrypted messages: encryption is turned off for this bot "
               "(platforms.matrix.encryption). Write to me in an unencrypted room or DM.")
UNDECRYPTABLE_NOTICE = ("I couldn't decrypt a message here: no key for it reached my device, and asking your "
                        "devices for it has not helped yet. If your client shares keys only with verified "
                        "devices, allow unverified ones for this room, then send it again.")


class MemoryState:
    """:class:`~gateway.types.AdapterState` for an adapter run on its own (tests, embedding): in memory."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or Path.cwd() / ".switchboard-matrix"
        self.values: dict[str, str] = {}

    async def get(self, name: str) -> str | None:
        return self.values.get(name)

    async def set(self, name: str, value: str) -> None:
        self.values[name] = value


class _Lru(OrderedDict):
    def remember(self, key: str, value: Any = True, size: int = 10_000) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > size:
            self.popitem(last=False)


class MatrixAdapter:
    """One Matrix account (see the module docstring)."""

    platform = PLATFORM
    message_limit = MESSAGE_LIMIT

    def __init__(self, config: MatrixConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                 media: MediaLimits | None = None, backoff: Backoff = Backoff(base=1.0, factor=2.0, cap=30.0),
                 key_wait_seconds: float = KEY_WAIT_SECONDS):
        """``config`` (``platforms.matrix``, checked when it was loaded) names the homeserver, the login and
        what to answer; ``media`` comes from the rest of the config (``commands`` and ``vision`` are
        accepted and unused); ``backoff`` paces the sync loop's retries; ``key_wait_seconds`` is how long an
        undecryptable message waits for its key before the room is told."""
        c = config
        if not (c.access_token or c.password):
            raise AdapterError("matrix: no access token configured (platforms.matrix.access_token, or a password "
                               "with user_id)")
        self._homeserver = c.homeserver.rstrip("/")
        self._user_id = c.user_id
        self._token = c.access_token.strip()
        self._password = c.password
        self._device_name = c.device_name
        self._require_mention = c.require_mention
        self._free = frozenset(c.free_response_channels)
        self._allowed = frozenset(c.allowed_users)
        self._media = media or MediaLimits()
        self._max_media = c.max_media_bytes
        self._sync_timeout = c.sync_timeout_seconds
        self._backoff = backoff
        self._encryption = c.encryption
        self._trust = (c.device_trust, tuple(c.verified_devices), key_wait_seconds)
        self._crypto: Crypto | None = None
        self._state: AdapterState = MemoryState()
        self._health = AdapterHealth(platform=PLATFORM)
        self._client: AsyncClient | None = None
        self._out: Outbound | None = None
        self._who: Addressing | None = None
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._loop: SyncLoop | None = None
        self._sync_task: asyncio.Task | None = None
        self._seen = _Lru()  # event ids handed over (or skipped) in this run
        self._ours = _Lru()  # event ids of what the bot sent: a reply to one addresses the bot
        self._requests = _Lru()  # approval request event id -> (approve, deny, thread)
        self._told_encrypted: set[str] = set()

    @classmethod
    def from_config(cls, cfg: MatrixConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                    media: MediaLimits | None = None) -> "MatrixAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.matrix``."""
        return cls(cfg, commands=commands, vision=vision, media=media)

    def keep_state_in(self, state: AdapterState) -> None:
        self._state = state

    def health(self) -> AdapterHealth:
        return self._health

    def _report(self, state: str, error: str | None) -> None:
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    def _fail(self, reason: str) -> None:
        self._health.state = "failed"
        self._health.last_error = reason
        log.error("matrix: %s", reason)
        raise AdapterError(f"matrix: {reason}")

    # -- lifecycle -------------------------------------------------------------------------

    async def open_for_sending(self) -> None:
        """Log in and send without /sync (a standby of a cluster: the owner syncs)."""
        if self._client is None:
            await self._log_in()

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._sync_task is not None:
            raise RuntimeError("MatrixAdapter is already started")
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._health.state = "starting"
        if self._client is None:
            await self._log_in()
        assert self._client is not None
        self._loop = SyncLoop(self._client, self._state, deliver=self._deliver, invited=self._invited,
                              report=self._report, timeout_ms=int(self._sync_timeout * 1000), backoff=self._backoff,
                              after=self._after_sync if self._crypto is not None else None)
        self._sync_task = spawn(self._run_sync(self._loop), name="matrix:sync")
        synced = asyncio.ensure_future(self._loop.synced.wait())
        await asyncio.wait([synced, self._sync_task], timeout=self._sync_timeout + 30,
                           return_when=asyncio.FIRST_COMPLETED)
        synced.cancel()
        if self._sync_task.done() or not self._loop.synced.is_set():
            reason = self._health.last_error or "the first /sync did not come back"
            await self._teardown()
            self._fail(reason)
        self._health.state = "connected"
        self._health.detail = self._who.user_id if self._who else None
        log.info("matrix connected as %s on %s", self._health.detail, self._homeserver)

    async def _run_sync(self, loop: SyncLoop) -> None:
        try:
            await loop.run()
        except TokenRejected as exc:  # retrying cannot help: say so once, stay down
            self._health.state = "failed"
            self._health.last_error = str(exc)
            log.error("%s", exc)

    async def _log_in(self) -> None:
        crypto = Crypto(self._state.directory, self._state, trust=self._trust[0], verified=self._trust[1],
                        key_wait=self._trust[2]) if self._encryption else None
        options = await crypto.client_options() if crypto is not None else {"encryption_enabled": False}
        client = AsyncClient(self._homeserver, self._user_id or "", store_path=str(self._state.directory),
                             config=AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0,
                                                      request_timeout=self._sync_timeout + 15, **options))
        try:
            token, device = await self._credentials(client)
            client.access_token = token
            who = await client.whoami()
            if not isinstance(who, WhoamiResponse):
                code = getattr(who, "status_code", None)
                if code == "M_UNKNOWN_TOKEN":
                    self._health.state = "failed"
                    self._health.last_error = TokenRejected.SUMMARY
                    log.error("matrix: %s: %s", TokenRejected.SUMMARY, TOKEN_HELP)
                    raise TokenRejected(PLATFORM, "platforms.matrix.access_token", TOKEN_HELP)
                self._fail(f"could not reach the homeserver at {self._homeserver}: {who}")
            client.user_id = client.user = who.user_id
            client.device_id = who.device_id or device or ""
            name = await client.get_displayname(who.user_id)
            display = name.displayname if isinstance(name, ProfileGetDisplayNameResponse) else None
            self._who = Addressing(who.user_id, display or "", self._require_mention, self._free)
            if crypto is not None:
                try:
                    await crypto.open(client)
                except AdapterError as exc:
                    self._fail(str(exc).removeprefix("matrix: "))
        except BaseException:
            await client.close()
            raise
        self._client, self._crypto = client, crypto
        self._out = Outbound(client, f"{self._homeserver}|{self._who.user_id}",
                             prepare=crypto.prepare if crypto is not None else None)

    async def _credentials(self, client: AsyncClient) -> tuple[str, str | None]:
        """The access token and device id: the configured token, or the one a password login kept."""
        if self._token:
            return self._token, None
        path = self._state.directory / CREDENTIALS
        kept = await asyncio.to_thread(_read_credentials, path)
        if kept and kept.get("user_id") == self._user_id and kept.get("homeserver") == self._homeserver:
            return kept["access_token"], kept.get("device_id")
        resp = await client.login(password=self._password, device_name=self._device_name)
        if not isinstance(resp, LoginResponse):
            self._fail(f"the password login as {self._user_id} failed: {resp} (check platforms.matrix.password)")
        assert isinstance(resp, LoginResponse)
        await asyncio.to_thread(_write_credentials, path, {"homeserver": self._homeserver, "user_id": resp.user_id,
                                                           "device_id": resp.device_id,
                                                           "access_token": resp.access_token})
        return resp.access_token, resp.device_id

    async def stop(self) -> None:
        await self._teardown()
        self._health.state = "stopped"

    async def _teardown(self) -> None:
        task, self._sync_task = self._sync_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        client, self._client = self._client, None
        self._out = self._crypto = None
        if client is not None:
            await client.close()
            store = getattr(client, "store", None)
            if store is not None:  # the crypto store's SQLite connection: a reload opens it afresh
                store.database.close()

    # -- inbound ---------------------------------------------------------------------------

    def _room(self, room_id: str) -> Room:
        room = self._client.rooms.get(room_id) if self._client is not None else None
        if room is None:
            return Room(room_id, members=2)
        return Room(room_id, members=room.member_count, encrypted=bool(room.encrypted))

    async def _deliver(self, room_id: str, event: dict) -> bool:
        """One timeline event to the gateway; True once it may be passed (see sync.Deliver)."""
        event_id = event.get("event_id")
        if not isinstance(event_id, str) or event_id in self._seen or self._who is None:
            return True
        self._health.last_event_at = time.time()
        inbound: InboundMessage | None = None
        try:
            if event.get("type") == "m.room.encrypted":
                plain = self._crypto.decrypt(room_id, event) if self._crypto is not None else None
                if plain is None:
                    await self._encrypted(room_id, event)
                    return True  # kept for its key (crypto), or told: not one of the events seen
                event = plain
            if event.get("type") == "m.reaction":
                inbound = await self._reaction(room_id, event)
            else:
                inbound = normalize(event, self._room(room_id), self._who, ours=set(self._ours))
                if inbound is not None:
                    inbound = await self._with_media(inbound, event)
            if inbound is not None and self._handler is not None:
                await self._handler(inbound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the same /sync again, or set aside after the last attempt
            set_aside = await self._failed.give_up(event_id, event, inbound, exc)
            log.error("matrix event %s in %s failed (%s: %s); %s", event_id, room_id, type(exc).__name__, exc,
                      "set aside as a dead letter" if set_aside else "it will be delivered again")
            self._health.last_error = f"event {event_id}: {type(exc).__name__}: {exc}"
            if not set_aside:
                return False
        self._failed.forget(event_id)
        self._seen.remember(event_id)
        return True

    async def _with_media(self, inbound: InboundMessage, event: dict) -> InboundMessage | None:
        content = event.get("content")
        if self._client is None or not isinstance(content, dict):
            return inbound
        attachments = await collect(self._client, content, limits=self._media, cap=self._max_media)
        if attachments:
            inbound = replace(inbound, attachments=attachments)
        if not inbound.text and not inbound.attachments:
            return None
        return inbound

    async def _encrypted(self, room_id: str, event: dict) -> None:
        """An event this device cannot decrypt: kept for its key (E2EE on), or the room told it is not read."""
        if self._crypto is not None:
            await self._crypto.hold(room_id, event)
            return
        log.warning("matrix: an encrypted message %s from %s in %s cannot be read (platforms.matrix.encryption is "
                    "false); the room is told once", event.get("event_id"), event.get("sender"), room_id)
        await self._tell(room_id, E2EE_NOTICE)

    async def _tell(self, room_id: str, notice: str) -> None:
        """``notice`` in ``room_id``, once (remembered in the store, so once across restarts too)."""
        if room_id in self._told_encrypted or await self._state.get(f"e2ee_told:{room_id}"):
            self._told_encrypted.add(room_id)
            return
        assert self._out is not None
        await self._out.post(ChatRef(PLATFORM, room_id), notice, reply_to=None)
        await self._state.set(f"e2ee_told:{room_id}", "1")
        self._told_encrypted.add(room_id)

    async def _after_sync(self) -> None:
        """After every /sync (E2EE on): keys kept up, and the events kept for their keys tried again."""
        if self._crypto is not None:
            await self._crypto.maintain(self._deliver, self._undecryptable)

    async def _undecryptable(self, room_id: str) -> None:
        log.warning("matrix: a message in %s is still undecryptable after %gs; the room is told once", room_id,
                    self._trust[2])
        await self._tell(room_id, UNDECRYPTABLE_NOTICE)

    async def _reaction(self, room_id: str, event: dict) -> InboundMessage | None:
        """✅/❌ on an approval request: the reactor typing its command (the gateway checks who may)."""
        rel = event.get("content", {}).get("m.relates_to", {}) if isinstance(event.get("content"), dict) else {}
        target = rel.get("event_id") if isinstance(rel, dict) else None
        if not isinstance(target, str):
            return None
        if target not in self._requests:
            kept = await self._state.get(f"buttons:{target}")
            if not kept:
                return None
            self._requests.remember(target, tuple(json.loads(kept)))
        approve, deny, thread = self._requests[target]
        found = reaction_command(event, {target: (approve, deny)})
        if found is None or found[0] == (self._who.user_id if self._who else None):
            return None
        sender, command, event_id = found
        members = self._room(room_id).members
        chat_type = ChatType.THREAD if thread else (ChatType.DM if members <= 2 else ChatType.GROUP)
        return InboundMessage(platform=PLATFORM, chat_type=chat_type, chat_id=room_id, user_id=sender, text=command,
                              message_id=event_id, thread_id=thread or None, addressed=True)

    async def _invited(self, room_id: str, invite_state: list) -> None:
        assert self._client is not None and self._who is not None
        inviter = invite_sender(invite_state, self._who.user_id)
        if inviter in self._allowed:
            resp = await self._client.join(room_id)
            log.info("matrix: joined %s, invited by %s (%s)", room_id, inviter, resp)
            return
        log.warning("matrix: refused an invitation to %s from %s (not in platforms.matrix.allowed_users)",
                    room_id, inviter)
        await self._client.room_leave(room_id)

    # -- outbound ----------------------------------------------------------------------------

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        if self._out is None:
            return Delivery(ok=False, error="matrix adapter is not running", retry_later=True)
        parts = split_reply(text)
        if not parts:
            return Delivery(ok=False, error="nothing to send: the reply is empty")
        progress = progress if progress is not None else SendProgress()
        for index, part in enumerate(parts):
            if index < progress.skip:
                continue
            try:
                event_id = await self._out.post(chat, part, reply_to=reply_to)
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                error = f"part {index + 1}/{len(parts)} not delivered: {exc}"
                log.warning("matrix send to %s failed: %s", chat.chat_id, error)
                return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error)
            self._ours.remember(event_id)
            await progress.confirmed(event_id, last=index == len(parts) - 1)
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    async def send_buttons(self, chat: ChatRef, text: str, buttons: tuple[Button, ...], *,
                           reply_to: str | None = None) -> Delivery:
        """An approval request: the text with how to answer, and ✅/❌ put under it for a tap."""
        if self._out is None:
            return Delivery(ok=False, error="matrix adapter is not running", retry_later=True)
        try:
            event_id = await self._out.post(chat, text + approval_footer(buttons), reply_to=reply_to)
            await self._offer(chat, event_id, buttons)
        except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
            log.warning("matrix approval request to %s failed: %s", chat.chat_id, exc)
            return Delivery(ok=False, error=str(exc))
        return Delivery(ok=True, message_ids=(event_id,))

    async def _offer(self, chat: ChatRef, event_id: str, buttons: tuple[Button, ...]) -> None:
        approve = next((b.command for b in buttons if b.style != "danger"), "")
        deny = next((b.command for b in buttons if b.style == "danger"), "")
        kept = (approve, deny, chat.thread_id or "")
        self._requests.remember(event_id, kept)
        self._ours.remember(event_id)
        await self._state.set(f"buttons:{event_id}", json.dumps(kept))
        assert self._out is not None
        for key, command in (("✅", approve), ("❌", deny)):
            if command:
                await self._out.react(chat.chat_id, event_id, key)

    # a streamed reply (gateway.streaming.DraftOutput): one message, edited in place with m.replace

    def measure(self, text: str) -> int:
        return len(text)

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        if self._out is None:
            raise AdapterError("matrix adapter is not running")
        shown = text + approval_footer(buttons) if buttons else text
        event_id = await self._out.post(chat, shown, reply_to=reply_to, formatted=final, raise_rate_limit=True)
        self._ours.remember(event_id)
        if buttons:
            await self._offer(chat, event_id, buttons)
        return event_id

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        if self._out is None:
            raise AdapterError("matrix adapter is not running")
        shown = text + approval_footer(buttons) if buttons else text
        await self._out.edit(chat, message_id, shown, formatted=final, raise_rate_limit=True)
        if buttons:
            await self._offer(chat, message_id, buttons)

    async def send_voice(self, chat: ChatRef, audio: bytes, *, reply_to: str | None = None) -> Delivery:
        if self._out is None:
            return Delivery(ok=False, error="matrix adapter is not running", retry_later=True)
        try:
            event_id = await self._out.send_audio(chat, audio, reply_to=reply_to)
        except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
            log.warning("matrix voice message to %s failed: %s", chat.chat_id, exc)
            return Delivery(ok=False, error=str(exc))
        return Delivery(ok=True, message_ids=(event_id,))

    async def send_typing(self, chat: ChatRef) -> None:
        if self._out is not None:
            await self._out.typing(chat.chat_id)


def _read_credentials(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("access_token"), str) else None


def _write_credentials(path: Path, data: dict) -> None:
    """The device's token, written whole and private to the daemon's user (0600 in a 0700 directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    os.replace(tmp, path)


__all__ = ["MatrixAdapter", "MemoryState"]
