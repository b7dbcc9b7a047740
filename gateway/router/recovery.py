"""What a stop left undone, queued again: after a restart, and (clustered) for a claimed session."""

from __future__ import annotations

import asyncio

from state import DeliveryRecord

from .guard import TurnClaim
from .lanes import ChatWork, ClaimedWork, ExpiredWork, Lanes, SendWork
from .outbox import Outbox
from .shared import RouterState, Ticket, resumed_ticket


class Recovery:
    """Stored replies not confirmed sent, and messages no turn answered, back on their lanes."""

    def __init__(self, shared: RouterState, lanes: Lanes, outbox: Outbox) -> None:
        self._shared = shared
        self._lanes = lanes
        self._outbox = outbox
        self._claim_keys: dict[str, TurnClaim] = {}  # clustered: session key -> the claim its lane runs

    def claimed_keys(self) -> dict[str, str]:
        """The session keys whose claimed work runs in this instance now: key -> session id."""
        return {key: claim.session_id for key, claim in self._claim_keys.items()}

    def recover(self, pending: list[DeliveryRecord], unanswered: list[dict]) -> dict[str, int]:
        """See :meth:`gateway.router.SessionRouter.recover`."""
        counts = {"replies": 0, "sessions": 0, "expired": 0}
        sends = self._outbox.has_output
        waiting = {row["session_key"] for row in unanswered if sends(row["platform"])}
        for record in pending:
            if not sends(record.platform):
                continue
            key = record.session_key
            if key is not None and key in waiting and self._outbox.adoptable(record):
                lane = self._lanes.lane(key)
                if lane.adopt is not None:  # an older one: said cut short, as before
                    lane.queue.append(SendWork(lane.adopt))
                lane.adopt = record  # the turn answering the session's messages continues it
                counts["replies"] += 1
                continue
            lane = self._lanes.lane(record.session_key or f"delivery:{record.id}")
            lane.queue.append(SendWork(record))
            counts["replies"] += 1
            self._lanes.wake(lane)
        by_key: dict[str, list[Ticket]] = {}
        for row in unanswered:
            if sends(row["platform"]):
                by_key.setdefault(row["session_key"], []).append(resumed_ticket(row))
        cutoff = self._shared.clock() - self._shared.settings.resume_within
        for key, tickets in by_key.items():
            lane = self._lanes.lane(key)
            if tickets[-1].msg.received_at < cutoff:
                lane.queue.append(ExpiredWork(tuple(tickets)))
                counts["expired"] += 1
            else:
                lane.queue.extend(ChatWork(ticket) for ticket in tickets)
                counts["sessions"] += 1
            self._lanes.wake(lane)
        return counts

    async def run_claimed(self, claim: TurnClaim) -> bool:
        """See :meth:`gateway.router.SessionRouter.run_claimed`."""
        if self._shared.closing:
            return False
        db, sends = self._shared.db, self._outbox.has_output
        # its messages waiting, and the replies stored under an earlier lease whose holder stopped before
        # confirming the send (one store call when there are none)
        waiting, open_replies = await db.recovery.claimed(claim.session_id)
        rows = [row for row in waiting if sends(row["platform"])]
        records = [record for record in open_replies if sends(record.platform)]
        key = rows[-1]["session_key"] if rows else next((r.session_key for r in records if r.session_key), None)
        if key is None:
            return True
        lane = self._lanes.lane(key)
        done = asyncio.get_running_loop().create_future()
        if rows:  # the turn about to answer them continues the latest reply their earlier turn streamed
            streams = [record for record in records if self._outbox.adoptable(record)]
            if streams and lane.adopt is None:
                lane.adopt = streams[-1]
                records = [record for record in records if record is not streams[-1]]
        lane.queue.extend(SendWork(record) for record in records)
        lane.queue.append(ClaimedWork(claim, done, resumed_ticket(rows[-1]) if rows else None))
        self._lanes.wake(lane)
        self._claim_keys[key] = claim  # a /stop written anywhere reaches it (turn_claims)
        try:
            return await done
        finally:
            if self._claim_keys.get(key) is claim:  # the session may be claimed again already: its lease
                del self._claim_keys[key]  # went back with the reply's sent mark
