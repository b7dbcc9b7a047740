"""Authorization: default deny, allowlists, and pairing for strangers.

A user may talk to the agent when ``auth.allow_all`` is set, when
``platform:user_id`` is in ``auth.allowed_users`` or the platform's own
``allowed_users``, or when the operator approved their pairing code.

A stranger who writes in a DM gets an 8-character pairing code (valid one
hour, at most 3 pending per platform, answered at most once per
``REPLY_EVERY_SECONDS``) and nothing else; the operator approves it with
``switchboard pairing approve <platform> <code>``.  In groups strangers are
ignored.  Nothing a stranger writes reaches the model: the message that got the
code is kept with the request alone (gone with it when it expires), and once the
operator approves, the daemon tells the user in one line and answers that message
(:mod:`gateway.runtime.welcome`).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Callable

from gateway.types import ChatType, InboundMessage, message_json
from state import AsyncSessionDB

log = logging.getLogger(__name__)

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: codes are read aloud and retyped
CODE_LENGTH = 8
CODE_TTL_SECONDS = 3600
MAX_PENDING_PER_PLATFORM = 3
REPLY_EVERY_SECONDS = 600


@dataclass(frozen=True, slots=True)
class AuthSettings:
    allow_all: bool = False
    allowed_users: frozenset[str] = frozenset()  # "platform:user_id"
    platform_allowed: dict | None = None  # platform -> frozenset of user ids
    unauthorized_dm: str = "pair"  # pair | ignore
    trusted_sources: frozenset[str] = frozenset()  # local sources (api, cli): guarded by the API token / the shell


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reply: str | None = None


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class Authorizer:
    def __init__(self, settings: AuthSettings, db: AsyncSessionDB, *, clock: Callable[[], float] = time.time):
        self.settings = settings
        self.db = db
        self.clock = clock
        self._last_reply: dict[tuple[str, str], float] = {}

    def update(self, settings: AuthSettings) -> None:
        self.settings = settings

    def allowed_by_config(self, platform: str, user_id: str) -> bool:
        s = self.settings
        if s.allow_all or f"{platform}:{user_id}" in s.allowed_users:
            return True
        return user_id in (s.platform_allowed or {}).get(platform, ())

    async def check(self, msg: InboundMessage) -> Verdict:
        if msg.platform in self.settings.trusted_sources:
            return Verdict(True)
        if msg.user_id is None:
            return Verdict(False)
        if self.allowed_by_config(msg.platform, msg.user_id):
            return Verdict(True)
        if await self.db.pairing.is_approved(msg.platform, msg.user_id):
            return Verdict(True)
        if msg.chat_type is not ChatType.DM or self.settings.unauthorized_dm != "pair":
            log.info("ignored a message from unknown %s user %s", msg.platform, msg.user_id)
            return Verdict(False)
        return Verdict(False, await self._pairing_reply(msg, msg.user_id))

    async def _pairing_reply(self, msg: InboundMessage, user_id: str) -> str | None:
        now = self.clock()
        who = (msg.platform, user_id)
        if now - self._last_reply.get(who, -1e18) < REPLY_EVERY_SECONDS:
            return None  # rate-limited: one answer per stranger per window
        request = await self.db.pairing.request(
            msg.platform, user_id, msg.user_name, new_code(), now=now, ttl=CODE_TTL_SECONDS,
            max_pending=MAX_PENDING_PER_PLATFORM, waiting=message_json(msg),
        )
        if len(self._last_reply) > 10_000:  # forget strangers whose window has passed
            self._last_reply = {k: t for k, t in self._last_reply.items() if now - t < REPLY_EVERY_SECONDS}
        self._last_reply[who] = now
        if request is None:
            log.warning("pairing request from %s user %s refused: too many pending", msg.platform, msg.user_id)
            return "I can't take new pairing requests right now. Please try again later."
        log.info("pairing code issued to %s user %s", msg.platform, msg.user_id)
        return (
            "I don't know you yet. To talk with me, ask the operator to run:\n"
            f"switchboard pairing approve {msg.platform} {request['code']}\n"
            "This code is valid for one hour."
        )
