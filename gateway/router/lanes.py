"""Lanes: one queue and one worker per session key, and the typed work that waits in them.

A lane runs one piece of work at a time, in the order it was queued.  The work is a frozen value of
one of seven kinds (a chat batch's message, a request, a command, a resume after an approval, a
session's work claimed under a lease, a stored reply to send, messages too old to answer); the drain
loop knows nothing of answering: it hands each piece to the ``run`` callback the router gave it
(discord.py's ``dispatch=`` style).  ``run`` is called under the lane's lock, where it takes what the
work needs from the store, and returns what to run once the lock is released (None: nothing).

    lanes = Lanes(run)                  # run(lane, work) -> job | None
    lane = lanes.lane(key)
    async with lane.lock:
        lane.queue.append(ChatWork(ticket))
        lanes.wake(lane)
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Iterator

from gateway import tracing
from gateway.errors import GatewayClosing
from gateway.tasks import spawn
from state import DeliveryRecord

from .guard import TurnClaim
from .shared import STOPPED_BEFORE_ANSWERING, Ticket

if TYPE_CHECKING:  # pragma: no cover
    from gateway.commands import Command

MAX_IDLE_LANES = 10_000  # past this many chats seen, idle lanes are forgotten (their state is in the store)


@dataclass(frozen=True, slots=True)
class ChatWork:
    """A platform chat's stored message; consecutive ones are answered together by one turn."""

    ticket: Ticket


@dataclass(frozen=True, slots=True)
class RequestWork:
    """A request/response source's request (local API, terminal): a turn of its own, stored when it starts."""

    ticket: Ticket


@dataclass(frozen=True, slots=True)
class CommandWork:
    """A command that changes the session, run after the turn ahead of it."""

    ticket: Ticket
    command: Command


@dataclass(frozen=True, slots=True)
class ResumeWork:
    """An answered approval: ``step`` stores the call's result (its id; None: nothing to go on from),
    then a turn goes on from it; ``ticket`` gets the reply."""

    ticket: Ticket
    step: Callable[[], Awaitable[int | None]]


@dataclass(frozen=True, slots=True)
class ClaimedWork:
    """Clustered: what waits in the store for a session this instance claimed; ``done`` is told how it ended.
    ``seen``: the last message found waiting when it was claimed (whom the turn's context is read for; the
    messages themselves are read again with it, under the lane lock)."""

    claim: TurnClaim
    done: asyncio.Future
    seen: Ticket | None = None


@dataclass(frozen=True, slots=True)
class SendWork:
    """A reply stored (before a restart, or under an earlier lease) and not yet confirmed sent."""

    record: DeliveryRecord


@dataclass(frozen=True, slots=True)
class ExpiredWork:
    """Messages a restart found unanswered, too old to answer blindly: one line instead."""

    tickets: tuple[Ticket, ...]


Work = ChatWork | RequestWork | CommandWork | ResumeWork | ClaimedWork | SendWork | ExpiredWork
# work whose turn is being set up once it is taken: a /stop then stops it as soon as it starts
_TURNS = (ChatWork, RequestWork, ClaimedWork)
Job = Callable[[], Awaitable[None]]
Run = Callable[["Lane", Work], Awaitable[Job | None]]


@dataclass(eq=False)
class Lane:
    """One session key's queue and worker."""

    key: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: deque[Work] = field(default_factory=deque)
    worker: asyncio.Task | None = None
    current: asyncio.Task | None = None  # the turn or command now running
    # a turn's messages were taken from the queue and its turn is being set up (its message stored,
    # its history read): a /stop or Ctrl-C then stops it as soon as it starts
    starting: bool = False
    stop_asked: bool = False
    last_prompt_tokens: int | None = None
    # the chat's choices as read from the store (``stream``: /stream on|off, ``model``: /model NAME,
    # ``voice``: /voice on|off; a value of None: none made), each with when it was read (monotonic)
    choices: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    held: list[Ticket] = field(default_factory=list)  # stored, held back by a rate limit: the next turn answers them
    outage_told: bool = False  # the chat was told the model is down (once per outage: a turn answered resets it)
    # a streamed reply whose turn never finished (its instance died): the next turn here edits its messages
    # into its own answer instead of posting new ones (one answer in the chat, not a cut-short one and another)
    adopt: DeliveryRecord | None = None

    @property
    def busy(self) -> bool:
        return self.worker is not None and not self.worker.done()

    @property
    def idle(self) -> bool:
        """Nothing runs, waits or is held back here: a message stored now is answered next, by a turn of its own."""
        return not self.busy and not self.queue and not self.held

    def take_chats(self) -> list[Ticket]:
        """The chat messages queued right behind the one just taken: answered in the same turn."""
        batch: list[Ticket] = []
        while self.queue and isinstance(self.queue[0], ChatWork):
            batch.append(self.queue.popleft().ticket)  # type: ignore[union-attr]
        return batch


async def drain(lane: Lane, run: Run) -> None:
    """Run ``lane``'s work, one piece at a time, until its queue is empty.

    Each piece is handed to ``run`` under the lane lock, which the intake holds while storing a message:
    a message is either in this turn's history and batch, or stored after both and answered by the next
    turn -- never twice.  What ``run`` returns runs after the lock is released."""
    while True:
        async with lane.lock:
            if not lane.queue:
                return
            work = lane.queue.popleft()
            lane.starting, lane.stop_asked = isinstance(work, _TURNS), False
            job = await run(lane, work)
        if job is not None:
            await job()


class Lanes:
    """Every session key's lane in this process, each drained through ``run``."""

    def __init__(self, run: Run, *, on_forget: Callable[[], None] = lambda: None) -> None:
        self._run = run
        self._on_forget = on_forget  # told when idle lanes were forgotten (their rate-limit windows go too)
        self._lanes: dict[str, Lane] = {}

    def __len__(self) -> int:
        return len(self._lanes)

    def __iter__(self) -> Iterator[Lane]:
        return iter(list(self._lanes.values()))

    def get(self, key: str | None) -> Lane | None:
        return self._lanes.get(key) if key else None

    def lane(self, key: str) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            if len(self._lanes) >= MAX_IDLE_LANES:
                self._forget_idle()
            lane = self._lanes[key] = Lane(key)
        return lane

    def _forget_idle(self) -> None:
        """Drop lanes with nothing queued, running or waiting, so months of chats do not pile up.

        Safe without awaiting: a handle() that holds a lane either acquired its free lock at
        once (so it is locked) or waits behind whoever holds it (locked too)."""
        for key in [k for k, lane in self._lanes.items()
                    if not lane.lock.locked() and lane.idle and lane.current is None]:
            del self._lanes[key]
        self._on_forget()

    def wake(self, lane: Lane) -> None:
        """Start the lane's worker unless it runs: it drains the queue, then ends."""
        if not lane.busy:
            with tracing.detached():  # each of its turns joins the trace of the messages it answers
                lane.worker = spawn(drain(lane, self._run), name=f"lane:{lane.key}")

    def working_on(self, key: str | None) -> bool:
        """Whether this process has a turn running or messages queued for the session key ``key``."""
        lane = self.get(key)
        return lane is not None and (lane.busy or bool(lane.queue))

    def held_back(self, key: str) -> int:
        """How many of ``key``'s stored messages a rate limit holds back for the next turn that runs."""
        lane = self._lanes.get(key)
        return len(lane.held) if lane is not None else 0

    def active(self) -> int:
        return sum(1 for lane in self._lanes.values() if lane.busy)

    def queued(self) -> int:
        """Messages waiting in their conversation's lane for the turn ahead of them to finish."""
        return sum(len(lane.queue) for lane in self._lanes.values())

    def stop_turn(self, key: str) -> bool:
        """Stop the turn running (or being set up) in ``key``'s lane; whether there was one."""
        lane = self._lanes.get(key)
        if lane and lane.current and not lane.current.done():
            lane.current.cancel()
            return True
        if lane and lane.starting:
            lane.stop_asked = True
            return True
        return False

    async def close(self, grace_seconds: float) -> list[str]:
        """Let running work finish within the grace period, cancel the rest; returns the keys whose
        work was cancelled (their user messages stay stored, unanswered)."""
        workers = {key: lane.worker for key, lane in self._lanes.items()
                   if lane.worker is not None and not lane.worker.done()}  # the busy lanes
        if not workers:
            return []
        done, pending = await asyncio.wait(workers.values(), timeout=grace_seconds)
        cancelled = [key for key, task in workers.items() if task in pending]
        for task in pending:
            task.cancel()
        for key in cancelled:  # what waited behind the cut-off turn gets no answer from this process either
            for work in self._lanes[key].queue:
                if isinstance(work, (ChatWork, CommandWork, RequestWork)):
                    work.ticket.fail(GatewayClosing(STOPPED_BEFORE_ANSWERING))
                elif isinstance(work, ClaimedWork):  # its lease is given back unfinished: another instance answers it
                    settle_future(work.done, None, False)
        if pending:
            await asyncio.wait(pending, timeout=5)
        return cancelled


def settle_future(done: asyncio.Future, exc: BaseException | None, finished: bool = False) -> None:
    """Tell whoever queued claimed work how it ended: ``finished``, or not (shutdown), or ``exc``."""
    if done.done():
        return
    if exc is None or isinstance(exc, asyncio.CancelledError):
        done.set_result(finished)
    else:
        done.set_exception(exc)
