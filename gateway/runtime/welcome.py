"""Pairing that tells the user: once the operator approves a code, the user hears so and is answered.

``switchboard pairing approve`` (another process) and the dashboard's Approve button both write the
approval to the store, which moves the message that got the code (``pairing_requests.waiting``) to
``approved_users.waiting``.  The daemon's :class:`Welcomes` polls for such rows every second or so and,
for each: sends the user :data:`APPROVED_LINE`, hands the waiting message to the router's intake (``SessionRouter.take``)
(stored and answered like any message: a command is not run again, the line says enough), then clears
the row.  A crash between those steps sends the line again at the next start, and never answers the
message twice (the store keeps a platform message once per session).  An instance that serves no
platform now (a cluster's standby, the connections owned elsewhere) reads nothing: the rows wait for
the instance that does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from gateway.types import ChatRef, InboundMessage, message_from_json
from state import AsyncSessionDB

log = logging.getLogger(__name__)

WELCOME_EVERY_SECONDS = 1.0
APPROVED_LINE = "You're approved: you can talk to me now."
ANSWERING_LINE = APPROVED_LINE + " Answering your message…"


class Welcomes:
    """The daemon's poll: greets each newly approved user and answers the message they were waiting on."""

    def __init__(self, db: AsyncSessionDB, deliver: Callable[[ChatRef, str], Awaitable[Any]],
                 inbound: Callable[[InboundMessage], Awaitable[Any]], *, serves: Callable[[str], bool],
                 serving: Callable[[], bool] = lambda: True, interval: float = WELCOME_EVERY_SECONDS):
        self._db = db
        self._deliver = deliver
        self._inbound = inbound
        self._serves = serves  # whether a platform's adapter runs here (else its approval waits for one)
        self._serving = serving  # whether any does now (else there is nothing to read)
        self.interval = interval

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed poll (store busy) is logged and tried again
                log.exception("pairing welcome poll failed; trying again in %.0fs", self.interval)
            await asyncio.sleep(self.interval)

    async def tick(self) -> None:
        if not self._serving():
            return
        for row in await self._db.pairing.welcomes():
            if self._serves(row["platform"]):
                await self._welcome(row)

    async def _welcome(self, row: dict) -> None:
        try:
            msg = message_from_json(row["waiting"])
        except (ValueError, KeyError, TypeError) as exc:  # not ours to answer: cleared, said once
            log.warning("pairing: the message %s user %s waited with cannot be read (%s); not answered",
                        row["platform"], row["user_id"], exc)
            await self._db.pairing.welcomed(row["platform"], row["user_id"])
            return
        answer = not msg.is_command and bool(msg.text.strip())
        await self._deliver(msg.chat, ANSWERING_LINE if answer else APPROVED_LINE)
        if answer:
            await self._inbound(msg)
        await self._db.pairing.welcomed(row["platform"], row["user_id"])
        log.info("pairing: told %s user %s they are approved%s", row["platform"], row["user_id"],
                 "; answering their message" if answer else "")
