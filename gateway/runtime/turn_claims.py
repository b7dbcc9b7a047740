"""Any instance runs any session's turn: this instance's claims on sessions whose messages wait.

    claims = TurnClaims(db.cluster, router, holder="i-2", lease_seconds=15, slots=4, wake=event)
    await claims.start()        # claims sessions (woken by the router, polling otherwise), runs their turns
    ...                         # the router sets ``event`` when it stores a message for any instance
    claims.stop_claiming()      # at shutdown, before the router drains
    await claims.close()        # the leases still held go back; another instance answers what is left

On several instances sharing one PostgreSQL store, the instance that stores a platform message
marks its session *pending* in the same transaction (``state.cluster.mark_pending``).  Each
instance runs one claim loop: while it has a free slot it takes the session whose work waited
longest with ``state.cluster.claim_next`` (``FOR UPDATE SKIP LOCKED``, so instances never wait on
each other), under a lease of ``cluster.lease_seconds`` carrying a fencing token, and hands it to
the router (:meth:`gateway.router.SessionRouter.run_claimed`), which answers the session's
unanswered messages in its lane like any turn.

While the turn runs, a keeper renews the lease every third of ``lease_seconds``.  The lease is
*trusted* locally until the monotonic time the last successful claim or renewal was sent plus 80 %
of ``lease_seconds`` (the monotonic clock runs on while the process is stopped, so a paused
instance wakes up untrusted): sends made before the answer is stored (typing, streamed drafts)
stop once it is not.  When renewal fails for good (the lease expired or another instance claimed
the session since), the turn is cancelled and nothing is stored or sent.  The answer itself is
stored under ``fenced_write``: a holder that lost its lease writes nothing even if it never
noticed.  Then the lease is released, ``finished``: the session stays pending when more messages
arrived meanwhile, and is claimed again.  When the reply's send is the last thing the turn does,
the lease goes back in the transaction that marks the reply sent (``Claim.handback``), not in one
of its own after it; never earlier, since another instance claiming the session while its reply
is stored but not marked sent would send it again.

The lease calls run on the store's connection pool (``state.ClusterStore``), grown by one
connection per thread of this module's own while the loop runs, so a renewal never waits for a
connection behind the store's own calls, and the event loop never waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from typing import Any, Callable, Protocol, TypeVar

import state
from gateway.retry import Backoff
from gateway.tasks import spawn
from state.cluster import ClusterStore, Lease, LeaseLost
from state.cluster.signals import STOP, WORK

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_SECONDS = 0.5  # how often the loop looks for work nobody woke it for (another instance stored it)
TRUSTED_SHARE = 0.8  # of lease_seconds after a claim or renewal was sent: sends may go until then
RECENT_CLAIMS = 20  # the claims /healthz lists besides those held now
THREADS = 3  # the lease calls' own threads, and the connections the store's pool grows by for them
STOP_POLL_SECONDS = 0.5  # while turns run here: how often /stop rows are read when no signal came
SWEEP_SECONDS = 2.0  # how often the sweeper looks for sessions with unanswered messages nothing would claim


class ClaimRunner(Protocol):
    """What the claim loop asks of the router (:class:`gateway.router.SessionRouter` is one)."""

    def claimed_keys(self) -> dict[str, str]:
        """The session keys whose claimed work runs here now: key -> session id."""

    def claimed_platforms(self) -> list[str]:
        """The platforms whose chat messages any instance answers under a lease."""

    def stop_turn(self, key: str) -> bool:
        """Stop the turn running in ``key``'s lane; whether one ran."""

    async def run_claimed(self, claim: Any) -> bool:
        """Answer what waits for the claimed session (``claim``: a ``gateway.router.TurnClaim``)."""


class Claim:
    """One session's lease as the router sees it (:class:`gateway.router.TurnClaim`)."""

    def __init__(self, lease: Lease, lease_seconds: float, sent_at: float):
        self.lease = lease
        self.session_id = lease.session_id
        self.fence = state.Fence(lease.session_id, lease.token)
        self._trust_for = lease_seconds * TRUSTED_SHARE
        self._trusted_until = sent_at + self._trust_for
        self.claimed_at = time.time()
        self.db_claimed_at = lease.expires_at - lease_seconds  # by the database's clock: a later /stop stops it
        self.lost_by: BaseException | None = None
        self._lost = False
        self.pending = False  # work left undone: released unfinished, so it is claimed again
        self.given_back = False  # with the reply's sent mark: the lease is not this instance's any more
        self._handing = False  # that sent mark is being written: a renewal finding the lease gone is its doing
        self._task: asyncio.Task | None = None

    def trusted(self) -> bool:
        return not self._lost and not self.given_back and time.monotonic() < self._trusted_until

    def trusted_for(self) -> float:
        return max(0.0, self._trusted_until - time.monotonic()) if not self._lost else 0.0

    def lost(self, exc: BaseException | None = None) -> bool:
        if isinstance(exc, LeaseLost) and not (self._lost or self._handing or self.given_back):
            self._lost, self.lost_by = True, exc
        return self._lost

    def attach(self, task: asyncio.Task) -> None:
        self._task = task
        if self._lost:
            task.cancel()

    def keep_pending(self) -> None:
        self.pending = True

    def handback(self) -> state.Handback | None:
        if self._lost or self.pending or self.given_back:
            return None
        self._handing = True
        return state.Handback(self.session_id, self.lease.token, self.lease.pending_seq)

    def handed_back(self) -> None:
        self.given_back = True

    def renewed(self, lease: Lease, sent_at: float) -> None:
        self.lease = lease
        self._trusted_until = max(self._trusted_until, sent_at + self._trust_for)

    def give_up(self, why: BaseException) -> None:
        """The lease is gone: stop the turn now; it stores and sends nothing (its last write, the reply's
        sent mark giving the lease back, is under way or done: nothing to stop)."""
        if self._lost or self._handing or self.given_back:
            return
        self._lost, self.lost_by = True, why
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def status(self) -> dict:
        return {"session": self.session_id, "token": self.lease.token, "since": round(self.claimed_at, 3),
                "trusted_for": round(self.trusted_for(), 1)}


class TurnClaims:
    """This instance's claim loop: at most ``slots`` sessions' turns at once, each under a lease."""

    def __init__(self, cluster: ClusterStore, router: ClaimRunner, *, holder: str, lease_seconds: float, slots: int,
                 wake: asyncio.Event, poll_seconds: float = POLL_SECONDS, sweep_seconds: float = SWEEP_SECONDS):
        if not lease_seconds > 0:
            raise ValueError(f"cluster.lease_seconds must be more than 0 (got {lease_seconds!r})")
        self.cluster = cluster
        self.router = router
        self.holder = holder
        self.lease_seconds = float(lease_seconds)
        self.poll_seconds = poll_seconds
        self.sweep_seconds = sweep_seconds
        self._wake = wake
        self._slots = asyncio.Semaphore(max(1, slots))
        self._held: dict[str, Claim] = {}
        self._runs: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._sweep_task: asyncio.Task | None = None
        self._stop_task: asyncio.Task | None = None
        self._signal_task: asyncio.Task | None = None
        self._stop_wake = asyncio.Event()
        self.signals = cluster.signals(self._signalled)
        self.stops_honoured = 0  # turns stopped here by a /stop another instance (or this one) wrote
        self._reserved = 0  # connections the store's pool grew by for this loop
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="turn-claims")
        self.turns_claimed = 0  # sessions this instance claimed since it started
        self.leases_lost = 0
        self.swept = 0  # stranded sessions the sweeper marked for claiming

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        if self._loop_task is not None:
            raise RuntimeError("the turn claims have started already")
        await self._call(functools.partial(self.cluster.reserve_connections, THREADS))
        self._reserved = THREADS
        self._loop_task = spawn(self._claim_loop(), name="turn-claims:loop")
        self._sweep_task = spawn(self._sweep_loop(), name="turn-claims:sweeper")
        self._stop_task = spawn(self._stop_loop(), name="turn-claims:stops")
        self._signal_task = spawn(self.signals.run(), name="turn-claims:signals")

    def stop_claiming(self) -> None:
        """Claim nothing more (shutdown): what runs goes on while the router drains."""
        for task in (self._loop_task, self._sweep_task, self._signal_task):
            if task is not None:
                task.cancel()

    async def close(self, timeout: float = 5.0) -> None:
        """After the router drained: wait for the runs to give their leases back, then close."""
        self.stop_claiming()
        await asyncio.gather(*(t for t in (self._loop_task, self._sweep_task, self._signal_task) if t is not None),
                             return_exceptions=True)
        await self.signals.close()
        if self._runs:
            _, late = await asyncio.wait(set(self._runs), timeout=timeout)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=2)
        if self._stop_task is not None:  # runs while turns may still be stopped: until the runs are over
            self._stop_task.cancel()
            await asyncio.gather(self._stop_task, return_exceptions=True)
        if self._reserved:
            await self._call(functools.partial(self.cluster.reserve_connections, -self._reserved))
            self._reserved = 0
        self._threads.shutdown(wait=False)

    def status(self) -> dict:
        """What /healthz shows: the sessions whose turns this instance holds now, and how many it claimed."""
        return {"turns": [claim.status() for claim in self._held.values()], "turns_claimed": self.turns_claimed,
                "leases_lost": self.leases_lost, "lease_seconds": self.lease_seconds, "swept": self.swept,
                "signals": "listening" if self.signals.listening else "polling",
                "stops_honoured": self.stops_honoured}

    # -- the loop --------------------------------------------------------------
    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    async def _claim_loop(self) -> None:
        backoff, failures = Backoff(base=0.5, cap=10.0), 0
        while True:
            await self._slots.acquire()
            self._wake.clear()  # a wake from here on means work stored after this claim looked
            sent_at = time.monotonic()
            try:
                lease = await self._call(functools.partial(self.cluster.claim_next, self.holder,
                                                           self.lease_seconds))
            except Exception as exc:  # noqa: BLE001 - the database comes back; the loop never dies
                self._slots.release()
                wait = backoff.delay(failures)
                failures += 1
                log.warning("could not look for sessions to answer (%s); trying again in %.1fs", exc, wait)
                await asyncio.sleep(wait)
                continue
            failures = 0
            if lease is None:
                self._slots.release()
                try:
                    async with asyncio.timeout(self.poll_seconds):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            claim = Claim(lease, self.lease_seconds, sent_at)
            self._held[lease.session_id] = claim
            self.turns_claimed += 1
            log.info("claimed session %s (fencing token %d)", lease.session_id, lease.token)
            task = spawn(self._run(claim), name=f"turn-claim:{lease.session_id}")
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)

    def _signalled(self, signal: str) -> None:
        """Another instance (or this one) signalled: work to claim, or a /stop to read."""
        if signal == WORK:
            self._wake.set()
        elif signal == STOP:
            self._stop_wake.set()

    async def _stop_loop(self) -> None:
        """Stop the turns running here whose chat's /stop was written after they were claimed: read at
        once when signalled, every ``STOP_POLL_SECONDS`` otherwise (only while turns run here)."""
        while True:
            try:
                async with asyncio.timeout(STOP_POLL_SECONDS):
                    await self._stop_wake.wait()
            except TimeoutError:
                pass
            self._stop_wake.clear()
            running = {key: self._held[sid] for key, sid in self.router.claimed_keys().items()
                       if sid in self._held}  # session key -> the claim its turn runs under
            if not running:
                continue
            since = min(claim.db_claimed_at for claim in running.values())
            try:
                asked = await self._call(functools.partial(self.cluster.stops_asked, list(running), since))
            except Exception as exc:  # noqa: BLE001 - read again at the next poll
                log.warning("could not read the /stop requests (%s); trying again", exc)
                continue
            for key, at in asked:
                claim = running.get(key)
                if claim is not None and at > claim.db_claimed_at and self.router.stop_turn(key):
                    self.stops_honoured += 1
                    log.info("stopping the turn of %s (session %s): /stop was asked", key, claim.session_id)

    async def _sweep_loop(self) -> None:
        """Every ``sweep_seconds``: sessions with unanswered messages, no pending mark and no live lease
        are marked pending (logged), and this instance's claim loop is woken to take them."""
        while True:
            await asyncio.sleep(self.sweep_seconds)
            await self.sweep()

    async def sweep(self) -> int:
        """One sweep; how many stranded sessions it marked (a failed sweep is logged and counts 0)."""
        try:
            found = await self._call(functools.partial(self.cluster.sweep_stranded,
                                                       self.router.claimed_platforms()))
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("the sweeper could not look for stranded sessions (%s); trying again in %.0fs",
                        exc, self.sweep_seconds)
            return 0
        for stranded in found:
            log.warning("sweeper: session %s had %d unanswered message(s), the oldest %.1fs old, and no live lease "
                        "or pending mark; marked for claiming", stranded.session_id, stranded.messages,
                        stranded.waited)
        if found:
            self.swept += len(found)
            self._wake.set()
        return len(found)

    async def _run(self, claim: Claim) -> None:
        keeper = spawn(self._keep(claim), name=f"turn-lease:{claim.session_id}")
        finished = False
        try:
            finished = await self.router.run_claimed(claim) and not claim.pending
        except Exception:  # the lease goes back unfinished: the session is claimed again
            log.exception("answering session %s under its lease failed; it stays pending", claim.session_id)
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            if self._held.get(claim.session_id) is claim:  # else claimed again, its lease given back with the reply
                del self._held[claim.session_id]
            try:
                if claim.lost():
                    self.leases_lost += 1
                elif not claim.given_back:  # else it went back with the reply's sent mark
                    await self._call(functools.partial(self.cluster.release, claim.lease, finished=finished))
            except Exception as exc:  # noqa: BLE001 - it expires on its own; the session is claimed again then
                log.warning("could not give the lease on session %s back (%s); it expires in %.0fs",
                            claim.session_id, exc, self.lease_seconds)
            finally:
                self._slots.release()

    async def _keep(self, claim: Claim) -> None:
        """Renew the lease every third of its length; give the turn up once it is lost or out of trust."""
        every = self.lease_seconds / 3
        while True:
            await asyncio.sleep(every if claim.trusted() else 0)
            if claim.given_back:
                return  # with the reply's sent mark
            sent_at = time.monotonic()
            try:
                lease = await self._call(functools.partial(self.cluster.renew, claim.lease, self.lease_seconds))
            except LeaseLost as exc:
                claim.give_up(exc)  # nothing, when the lease went back with the reply meanwhile
                return
            except Exception as exc:  # noqa: BLE001 - tried again until the lease can no longer be trusted
                if not claim.trusted():
                    claim.give_up(exc)
                    return
                log.warning("could not renew the lease on session %s (%s); trying again", claim.session_id, exc)
                await asyncio.sleep(min(every, 0.5))
                continue
            claim.renewed(lease, sent_at)
