"""Everything the bot sends: replies in parts, edits (``m.replace``), reactions, typing, files.

Every event goes out as ``PUT /rooms/{room}/send/{type}/{txnId}`` with one transaction id per
event, kept across its retries: the homeserver answers a repeated transaction with the event it
already made, so a retry after a timeout or a 5xx never posts a reply twice.

Encrypted rooms: nio encrypts the content with the room's Megolm session (shared first with the
devices ``device_trust`` allows: ``crypto.Crypto.prepare``), leaving ``m.relates_to`` in the clear
so threads and edits still aggregate; a retry encrypts again under the same transaction id.  A voice
reply there is uploaded encrypted (``file`` with its key, never a plaintext ``url``).  Reactions go
unencrypted, as nio sends them (they carry only the key and the event they point at).

Pacing: one budget per room (``gateway.ratelimit.chat_budget_for``: ``CAPABILITIES.chat_rate`` with
bursts of ``chat_burst``) for messages, edits and typing, and one per account.  ``M_LIMIT_EXCEEDED``
pauses both for its ``retry_after_ms`` and the same transaction is tried again (nio's own 429 loop is
off: ``max_limit_exceeded=0``, so the wait is ours and the room's budget knows of it).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Awaitable, Callable

from nio import AsyncClient, RoomSendResponse, UploadResponse

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited
from gateway.formatting import split_message
from gateway.ratelimit import ChatRate, chat_budget_for, limiter_for
from gateway.types import Button, ChatRef

from .config import MatrixConfig
from .events import PLATFORM
from .format import CONTENT_BUDGET, content_size, message_content

log = logging.getLogger(__name__)

CAPS = MatrixConfig.CAPABILITIES
MESSAGE_LIMIT = CAPS.max_message_length
ROOM_RATE = ChatRate(rate=CAPS.chat_rate, burst=CAPS.chat_burst)
ACCOUNT_RATE = (10.0, 10)
_FATAL = ("M_FORBIDDEN", "M_UNKNOWN_TOKEN", "M_TOO_LARGE", "M_NOT_FOUND", "M_BAD_JSON", "M_NOT_JSON",
          "M_UNRECOGNIZED", "M_MISSING_TOKEN")
_SEND_ATTEMPTS = 6
TYPING_EVERY = 5.0


def split_reply(text: str) -> list[str]:
    """The parts a reply is sent in: within :data:`MESSAGE_LIMIT` characters, and each one's event within
    the spec's size (a part full of escapes is halved until it fits).  Deterministic, so "part N" means
    the same after a restart."""
    out: list[str] = []
    for part in split_message(text, MESSAGE_LIMIT):
        out.extend(_fit(part))
    return out


def _fit(part: str) -> list[str]:
    if content_size(message_content(part)) <= CONTENT_BUDGET or len(part) < 2:
        return [part]
    return [p for half in split_message(part, max(1, len(part) // 2)) for p in _fit(half)]


def _http_status(resp: Any) -> int:
    transport = getattr(resp, "transport_response", None)
    return int(getattr(transport, "status", 0) or 0)


#: room id -> whether unverified devices may get the room key (crypto.Crypto.prepare; encrypted rooms)
Prepare = Callable[[str], Awaitable[bool]]


async def _plain(room_id: str) -> bool:
    return True


class Outbound:
    def __init__(self, client: AsyncClient, token: str, *, backoff_seconds: float = 0.5,
                 prepare: Prepare | None = None):
        self.client = client
        self._prepare = prepare or _plain
        self._token = token
        self._backoff = backoff_seconds
        self._typed: dict[str, float] = {}

    def budget(self, room_id: str):
        return chat_budget_for(PLATFORM, self._token, room_id, ROOM_RATE)

    async def send_event(self, room_id: str, event_type: str, content: dict, *, attempts: int = _SEND_ATTEMPTS,
                         raise_rate_limit: bool = False) -> str:
        """Send one event within the room's budget; its event id.  Raises :class:`RateLimited` (with
        ``raise_rate_limit``, after pausing the budget), :class:`PlatformHTTPError` when refused for good."""
        txn = uuid.uuid4().hex  # one per event, kept across its retries: the homeserver dedups on it
        budget = self.budget(room_id)
        limiter = limiter_for(PLATFORM, self._token, rate=ACCOUNT_RATE[0], burst=ACCOUNT_RATE[1])
        last: str = ""
        for attempt in range(attempts):
            await budget.acquire()
            await limiter.acquire()
            try:
                unverified = await self._prepare(room_id)  # an encrypted room: its devices known, trust applied
                resp = await self.client.room_send(room_id, event_type, content, tx_id=txn,
                                                   ignore_unverified_devices=unverified)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a timeout or a dropped connection: the same txn again
                last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(self._backoff * 2 ** attempt)
                continue
            if isinstance(resp, RoomSendResponse):
                return resp.event_id
            code = getattr(resp, "status_code", None)
            if code == "M_LIMIT_EXCEEDED" or _http_status(resp) == 429:
                wait = max(0.05, (getattr(resp, "retry_after_ms", None) or 1000) / 1000)
                budget.pause(wait)
                limiter.pause(wait)
                if raise_rate_limit:
                    raise RateLimited(PLATFORM, wait)
                last = str(resp)
                continue
            if code in _FATAL or 400 <= _http_status(resp) < 500:
                raise PlatformHTTPError(PLATFORM, _http_status(resp) or 400, str(resp))
            last = str(resp)  # a 5xx: the same transaction again
            await asyncio.sleep(self._backoff * 2 ** attempt)
        raise AdapterError(f"matrix: the event was not accepted after {attempts} attempts ({last})")

    # -- replies, edits, reactions

    @staticmethod
    def relates(chat: ChatRef, reply_to: str | None) -> dict:
        """``m.relates_to`` for a message in ``chat``: in its thread (replying to ``reply_to`` there), or a
        reply to ``reply_to`` in a group; nothing in a DM."""
        if chat.thread_id:
            rel: dict = {"rel_type": "m.thread", "event_id": chat.thread_id, "is_falling_back": True,
                         "m.in_reply_to": {"event_id": reply_to or chat.thread_id}}
            return {"m.relates_to": rel}
        return {}

    async def post(self, chat: ChatRef, text: str, *, reply_to: str | None, formatted: bool = True,
                   raise_rate_limit: bool = False) -> str:
        content = message_content(text) if formatted else {"msgtype": "m.text", "body": text}
        content.update(self.relates(chat, reply_to))
        content["m.mentions"] = {}  # the bot's reply pings nobody (a quoted name is not a mention)
        return await self.send_event(chat.chat_id, "m.room.message", content, raise_rate_limit=raise_rate_limit)

    async def edit(self, chat: ChatRef, event_id: str, text: str, *, formatted: bool,
                   raise_rate_limit: bool = False) -> str:
        new = message_content(text) if formatted else {"msgtype": "m.text", "body": text}
        new["m.mentions"] = {}
        content = {**{k: (f"* {v}" if k in ("body", "formatted_body") else v) for k, v in new.items()},
                   "m.new_content": new, "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}
        return await self.send_event(chat.chat_id, "m.room.message", content, raise_rate_limit=raise_rate_limit)

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}}
        return await self.send_event(room_id, "m.reaction", content)

    async def typing(self, room_id: str) -> None:
        # Typing is not a room event (no rc_message limit on it), so it takes nothing from the room's
        # budget; one call holds for 20 s, so a room is told again at most every 5 s.
        now = time.monotonic()
        if now - self._typed.get(room_id, -1e9) < TYPING_EVERY:
            return
        self._typed[room_id] = now
        try:
            await self.client.room_typing(room_id, True, timeout=20_000)
        except Exception as exc:  # noqa: BLE001 - typing is best effort
            log.debug("matrix typing failed: %s", exc)

    async def upload(self, data: bytes, mime: str, name: str, *, encrypt: bool = False) -> tuple[str, dict | None]:
        """``data`` into the content repository: its ``mxc://`` URI, and with ``encrypt`` the key to it."""
        resp, keys = await self.client.upload(lambda *_: data, content_type=mime, filename=name, filesize=len(data),
                                              encrypt=encrypt)
        if not isinstance(resp, UploadResponse):
            raise PlatformHTTPError(PLATFORM, _http_status(resp) or 500, str(resp))
        return resp.content_uri, keys

    def encrypted(self, room_id: str) -> bool:
        room = self.client.rooms.get(room_id)
        return bool(self.client.olm is not None and room is not None and room.encrypted)

    async def send_audio(self, chat: ChatRef, audio: bytes, *, reply_to: str | None) -> str:
        """A spoken reply as a voice message (``m.audio`` with ``org.matrix.msc3245.voice``)."""
        secret = self.encrypted(chat.chat_id)
        uri, keys = await self.upload(audio, "audio/ogg", "reply.ogg", encrypt=secret)
        where = {"file": {**(keys or {}), "url": uri}} if secret else {"url": uri}
        content = {"msgtype": "m.audio", "body": "reply.ogg", **where,
                   "info": {"mimetype": "audio/ogg", "size": len(audio)},
                   "org.matrix.msc1767.audio": {}, "org.matrix.msc3245.voice": {}}
        content.update(self.relates(chat, reply_to))
        return await self.send_event(chat.chat_id, "m.room.message", content)


def approval_footer(buttons: tuple[Button, ...]) -> str:
    """The line under an approval request saying how to answer it (reactions stand in for buttons)."""
    commands = [b.command for b in buttons]
    return "\n\nReact ✅ to approve or ❌ to refuse, or reply with one of:\n\n" + "\n".join(
        f"`{c}`" for c in commands)
