"""What a turn may do: the guard every turn runs under, a lease when several instances share the store."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import state
from gateway import tracing
from gateway.errors import PlatformHTTPError
from gateway.streaming import DraftOutput
from gateway.types import Button, ChatRef

log = logging.getLogger("gateway.router")


class TurnGuard(Protocol):
    """What a turn may do: the fence its writes carry, and whether it may still store and send.

    Clustered, it is a session's lease (:class:`TurnClaim`): its writes carry ``fence`` (a
    ``state.Fence``), nothing is sent before the answer is stored unless :meth:`trusted`, and once
    :meth:`lost` nothing is stored or sent at all.  A single instance runs every turn under
    :data:`SINGLE_INSTANCE`, which never fences and is never lost."""

    @property
    def session_id(self) -> str | None:
        """The session the guard holds (None: any, a single instance)."""

    @property
    def fence(self) -> state.Fence | None:
        """The ``state.Fence`` every write of the turn carries (None: unfenced)."""

    @property
    def lost_by(self) -> BaseException | None:
        """What lost the lease (the store's LeaseLost, most often); None while it holds."""

    def trusted(self) -> bool:
        """Whether the lease can still be counted on (by the local clock) for a send made now."""

    def lost(self, exc: BaseException | None = None) -> bool:
        """Whether the lease is gone (renewal failed, or ``exc`` is the store's LeaseLost); remembered."""

    def attach(self, task: asyncio.Task) -> None:
        """The task running the turn: cancelled when the lease is lost."""

    def keep_pending(self) -> None:
        """Work stays undone (a stored reply not sent): the session stays pending for the next claim."""

    def handback(self) -> state.Handback | None:
        """The lease, to give back in the transaction about to mark the turn's reply sent, that send being
        the last thing done under it (None: nothing to give back, a single instance, or a lease lost).
        From this call on, a renewal finding the lease gone does not stop the turn: it is at its end."""

    def handed_back(self) -> None:
        """The sent mark carrying :meth:`handback` committed: the lease is no longer this instance's, and
        nothing more is sent, stored or renewed under it."""


class TurnClaim(TurnGuard, Protocol):
    """A session's work this instance claimed under a lease (see :mod:`gateway.runtime.turn_claims`);
    the router runs it in the session's lane like any turn, guarded by it."""

    @property
    def session_id(self) -> str: ...


class _SingleInstance:
    """The guard of every turn where one instance serves the store: unfenced, always trusted, never lost."""

    session_id = None
    fence = None
    lost_by = None

    def trusted(self) -> bool:
        return True

    def lost(self, exc: BaseException | None = None) -> bool:
        return False

    def attach(self, task: asyncio.Task) -> None:
        pass

    def keep_pending(self) -> None:
        pass

    def handback(self) -> state.Handback | None:
        return None

    def handed_back(self) -> None:
        pass


SINGLE_INSTANCE: TurnGuard = _SingleInstance()


class TrustedDrafts:
    """A platform's drafts that refuse to post or edit once the claim's lease can no longer be trusted."""

    def __init__(self, drafts: DraftOutput, claim: TurnGuard):
        self._drafts = drafts
        self._claim = claim
        self.message_limit = drafts.message_limit

    def measure(self, text: str) -> int:
        return self._drafts.measure(text)

    def _check(self, chat: ChatRef) -> None:
        if not self._claim.trusted():
            raise PlatformHTTPError(chat.platform, 0, "this instance's lease on the session ran out")

    async def post_draft(self, chat: ChatRef, text: str, *, reply_to: str | None, final: bool,
                         buttons: tuple[Button, ...] = ()) -> str:
        self._check(chat)
        with tracing.send(chat.platform, "draft"):
            return await self._drafts.post_draft(chat, text, reply_to=reply_to, final=final,
                                                 **({"buttons": buttons} if buttons else {}))

    async def edit_draft(self, chat: ChatRef, message_id: str, text: str, *, final: bool,
                         buttons: tuple[Button, ...] = ()) -> None:
        self._check(chat)
        with tracing.send(chat.platform, "edit"):
            await self._drafts.edit_draft(chat, message_id, text, final=final,
                                          **({"buttons": buttons} if buttons else {}))




def dropped(claim: TurnGuard, exc: BaseException | None, what: str) -> bool:
    """Whether the lease behind ``claim`` is gone (``exc`` may say so): then ``what`` is dropped, said once."""
    if not claim.lost(exc):
        return False
    why = exc if exc is not None else claim.lost_by
    holder = getattr(why, "holder", None)
    log.warning("dropping %s for session %s: this instance's lease on it was lost (%s: %s); "
                "nothing was stored or sent, %s answers it", what, claim.session_id,
                type(why).__name__ if why is not None else "LeaseLost",
                getattr(why, "reason", None) or why or "it could not be renewed in time",
                f"instance {holder}" if holder else "the instance holding the lease now")
    return True


def may_send_stored(claim: TurnGuard, session_id: str) -> bool:
    """Whether a reply stored under ``claim`` may be sent now; if not it stays pending, for the next claim."""
    if claim.trusted():
        return True
    claim.keep_pending()
    log.warning("the reply for session %s is stored but not sent from here: this instance's lease on it "
                "ran out meanwhile; the instance that claims the session next sends it", session_id)
    return False
