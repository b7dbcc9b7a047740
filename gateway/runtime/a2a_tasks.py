"""A2A tasks on the router: each task is a chat message of the ``a2a`` platform, answered like any other.

    tasks = A2aTasks(db, Router(submit, router.key_for, router.control.stop_anywhere, is_command))
    router.register_output("a2a", tasks.deliver, claimed=clustered)   # before the daemon recovers
    row, ticket = await tasks.send(caller, request)      # stored (task row, then the message), queued
    row = await tasks.wait(row["id"], seconds)            # until it ends, or the time is up
    row = await tasks.cancel(caller, task_id)             # /stop semantics, on whichever instance runs it

Why a platform and not a request/response source (as ``/v1/chat/completions`` is): a platform's
message waits in the store's inbox until its answer is stored, so a restart (or, clustered, whichever
instance claims its session) answers a task a crash left unanswered; and the reply goes out through
the outbox, recorded first, to :meth:`A2aTasks.deliver`, which ends the task in the store.  Every
instance can then answer ``GetTask`` from the store.  The rate limits and spend budgets hold a task's
message back as they would a chat user's: the task stays working, its status saying why.

The turn is submitted through one function the composition root gives (``Router.submit``:
``gateway.runtime.assemble`` hands the message to the router's ``handle``), so it can move to
another entry point later; this module never sees the router itself.

Push notifications: a task whose caller has a ``push_url`` is marked due as it ends, in the same
write; :meth:`A2aTasks.run_pushes` sends each due one (the task, as the stream's ``task`` event) with
``X-A2A-Notification-Token``, retried with backoff up to ``a2a.push_attempts`` tries, across restarts.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, Protocol

import aiohttp

import state
from gateway.control import STOPPED_LINE
from gateway.retry import Backoff
from gateway.runtime import a2a_wire as wire
from gateway.runtime.sse import SseSink
from gateway.types import ChatRef, ChatType, Delivery, InboundMessage, SendProgress

log = logging.getLogger(__name__)

PLATFORM = "a2a"
POLL_SECONDS = 0.5  # how often a waiter reads the store (another instance may end the task)
PUSH_POLL_SECONDS = 2.0  # how often due pushes are looked for when nothing woke the sender
PUSH_BACKOFF = Backoff(base=1.0, factor=2.0, cap=60.0)


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    push_url: str | None = None  # where its push notifications may go (a2a.callers.<name>.push_url)


@dataclass(frozen=True, slots=True)
class PushSettings:
    attempts: int = 5
    timeout_seconds: float = 10.0


class Turn(Protocol):
    """What a task's submitted message gives back (the router's ``Ticket``): where its answer streams."""

    sink: Any


@dataclass(frozen=True, slots=True)
class Router:
    """What the tasks need of the router, given by the composition root."""

    # store the message (in the inbox: a restart answers it) and queue it; None when dropped (a retry)
    submit: Callable[[InboundMessage, SseSink | None], Awaitable[Turn | None]]
    key_for: Callable[[InboundMessage], str]  # the message's session key
    stop: Callable[[str, str | None], Awaitable[bool]]  # /stop for (session key, session id), anywhere
    is_command: Callable[[str], bool]  # whether a text is a slash command (/help)


def task_id_of(caller: str, message_id: str) -> str:
    """The task a caller's message starts: the same for a retry of that message (same ``messageId``)."""
    return str(uuid.UUID(bytes=hashlib.sha256(f"{caller}\0{message_id}".encode()).digest()[:16], version=4))


class A2aTasks:
    """The tasks of the A2A endpoint: started, delivered, waited for, cancelled, pushed."""

    def __init__(self, db: state.AsyncSessionDB, router: Router, push: PushSettings = PushSettings(),
                 clock: Callable[[], float] = time.time):
        self.router = router
        self.db = db
        self.push = push
        self.clock = clock
        self._waiters: dict[str, set[asyncio.Event]] = {}  # task id -> each waiter's event, set as it changes here
        self._tickets: dict[str, Turn] = {}  # the tasks this instance took, while they work
        self._notes: dict[str, str] = {}  # task id -> why it waits (a rate limit, a budget)
        self._commands: set[str] = set()  # tasks whose message is a command (/help): answered unrecorded
        self._written: dict[str, str] = {}  # task id -> its answer as streamed so far (a turn streaming here)
        self._push_wake = asyncio.Event()

    # -- in --------------------------------------------------------------------------------
    async def send(self, caller: Caller, request: wire.SendRequest, *, stream: bool = False,
                   ) -> tuple[dict, Turn | None]:
        """Start the task ``request`` asks for (or find it again: a retry of the same message), its row and
        this instance's ticket for it (None for a retry: it was taken before)."""
        task_id = task_id_of(caller.name, request.message_id)
        seen = await self.db.a2a.get(task_id)
        if seen is not None:
            return seen, None
        if request.task_id is not None:
            earlier = await self.db.a2a.get(request.task_id)
            if earlier is None or earlier["caller"] != caller.name:
                raise wire.task_not_found(request.task_id)
            raise wire.RpcError(-32602, f"task {request.task_id!r} is {earlier['state']}: a task here takes one "
                                        "message; send the next one with its contextId and no taskId")
        context_id = request.context_id or str(uuid.uuid4())
        push_url = self._push_url(caller, request.push_url)
        msg = InboundMessage(platform=PLATFORM, chat_type=ChatType.DM, chat_id=f"{caller.name}:{context_id}",
                             user_id=caller.name, user_name=caller.name, text=request.text, message_id=task_id,
                             key_parts=(caller.name, context_id))
        now = self.clock()
        row = {"id": task_id, "caller": caller.name, "context_id": context_id,
               "session_key": self.router.key_for(msg), "request": request.text, "push_url": push_url,
               "push_token": request.push_token if push_url else None, "created_at": now}
        if not await self.db.a2a.add(row):  # the same message sent twice at once: the first one runs
            found = await self.db.a2a.get(task_id)
            assert found is not None
            return found, None
        if msg.is_command and self.router.is_command(msg.text):
            # answered by a line of its own, not a recorded reply; marked first: a command that changes
            # the session runs within the submit, and its line may come before the submit returns
            self._commands.add(task_id)
        try:
            ticket = await self.router.submit(msg, SseSink() if stream else None)
        except BaseException:
            # not stored: the task never started; a retry of the message starts it afresh
            self._commands.discard(task_id)
            await self.db.a2a.forget(task_id)
            raise
        if ticket is not None:
            self._tickets[task_id] = ticket
        else:
            self._commands.discard(task_id)
        stored = await self.db.a2a.get(task_id)
        assert stored is not None
        return stored, ticket

    def _push_url(self, caller: Caller, asked: str | None) -> str | None:
        if asked is None:
            return caller.push_url
        if caller.push_url is None or not asked.startswith(caller.push_url):
            raise wire.invalid_params(
                "push notifications go only under the URL configured for this caller "
                f"(a2a.callers.{caller.name}.push_url{'' if caller.push_url else ', which is not set'})")
        return asked

    # -- out: the router's sender for the a2a platform -------------------------------------------
    async def deliver(self, chat: ChatRef, text: str, reply_to: str | None,
                      progress: SendProgress | None = None) -> Delivery:
        """The outbox's sender: a reply to a task's message ends it (every task of the same session asked
        before it too: one turn answers what waited together); a line that holds it back (a rate limit,
        a budget) becomes its status; a notice (a reset) is noted.

        How it ends follows its delivery record, which every instance reads alike (here, after a restart,
        or on the instance that took its session over): an answer ``completed``; a line standing in for one
        (kind ``notice``) ``canceled`` when the turn was stopped, else ``failed`` (the model failed, a
        budget refused the turn, a restart found it too old), the line its status message."""
        if reply_to is None:
            return Delivery(ok=True)
        row = await self.db.a2a.get(reply_to)
        if row is None:
            log.warning("an a2a reply to %s, which is no task here, was dropped", reply_to)
            return Delivery(ok=True)
        command = reply_to in self._commands
        if progress is None and not command:
            # a line that is no answer (the answer is always recorded first, and sent with its progress):
            # held back by a rate limit, a budget or the model's outage; stored, answered when it may be
            self._notes[reply_to] = text
            self._wake(reply_to)
            return Delivery(ok=True)
        state = "completed" if command or progress is None or not progress.notice else \
            "canceled" if text == STOPPED_LINE else "failed"
        now = self.clock()
        # a command's line answers its own task; a turn's reply, every task its batch answered
        ended = [reply_to] if command else await self.db.a2a.working_before(row["session_key"], row["created_at"])
        for task_id in ended:
            if state == "completed":
                await self.db.a2a.end(task_id, state, answer=text, now=now)
            else:
                await self.db.a2a.end(task_id, state, error=text if state == "failed" else None, now=now)
            self._finished(task_id)
        if progress is not None:
            await progress.confirmed(reply_to, last=True)
        return Delivery(ok=True, message_ids=(reply_to,))

    def _wake(self, task_id: str) -> None:
        for event in self._waiters.get(task_id, ()):
            event.set()

    def _finished(self, task_id: str) -> None:
        self._wake(task_id)
        self._tickets.pop(task_id, None)
        self._written.pop(task_id, None)
        self._notes.pop(task_id, None)
        self._commands.discard(task_id)
        self._push_wake.set()

    def note(self, task_id: str) -> str | None:
        """Why a working task waits, when this instance knows (held back by a limit)."""
        return self._notes.get(task_id)

    def _sink(self, task_id: str) -> SseSink | None:
        ticket = self._tickets.get(task_id)
        return ticket.sink if ticket is not None and isinstance(ticket.sink, SseSink) else None

    def written(self, task_id: str) -> str | None:
        """The answer as the model has written it so far, when the task's turn streams here (None: it does
        not: a task sent whole, or one running on another instance).  Every stream of the task reads the
        same text, from its own offset: the first to read takes what the turn wrote and wakes the others."""
        sink = self._sink(task_id)
        if sink is None:
            return None
        pieces = [text for kind, text in sink.take() if kind == "content" and text]
        text = self._written.get(task_id, "") + "".join(pieces)
        self._written[task_id] = text
        if pieces:
            self._wake(task_id)
        return text

    def writes(self, task_id: str) -> Awaitable[None] | None:
        """A wait until the task's turn here writes more of the answer; None when it does not stream here."""
        sink = self._sink(task_id)
        return sink.changed() if sink is not None else None

    # -- waiting, reading, cancelling ---------------------------------------------------------
    async def wait(self, task_id: str, seconds: float) -> dict:
        """The task once it has ended, or as it stands after ``seconds``."""
        deadline = time.monotonic() + seconds
        with self.watch(task_id) as changed:
            while True:
                row = await self.db.a2a.get(task_id)
                if row is None:
                    raise wire.task_not_found(task_id)
                left = deadline - time.monotonic()
                if row["state"] != "working" or left <= 0:
                    return row
                await changed(min(left, POLL_SECONDS))

    @contextmanager
    def watch(self, task_id: str) -> Iterator[Callable[[float], Awaitable[None]]]:
        """A wait for the task to change here (it ends, or a note changes), at most the seconds given
        (another instance may end it: the caller reads the store again).  Watching starts before the
        caller reads the task, so a change between that read and the wait is not missed."""
        event = asyncio.Event()
        self._waiters.setdefault(task_id, set()).add(event)

        async def changed(seconds: float) -> None:
            try:
                await asyncio.wait_for(event.wait(), seconds)
            except TimeoutError:
                return
            event.clear()

        try:
            yield changed
        finally:
            waiters = self._waiters.get(task_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[task_id]

    async def get(self, caller: Caller, task_id: str) -> dict:
        row = await self.db.a2a.get(task_id)
        if row is None or row["caller"] != caller.name:
            raise wire.task_not_found(task_id)
        return row

    async def history(self, row: dict, length: int | None) -> list[dict] | None:
        """The context's tasks before ``row`` (the last ``length``), or None when none were asked for."""
        if not length:
            return None
        rows = await self.db.a2a.in_context(row["caller"], row["context_id"], length + 1)
        return [r for r in rows if r["id"] != row["id"]][-length:]

    async def cancel(self, caller: Caller, task_id: str) -> dict:
        """/stop for the task's session (here, or on whichever instance runs it); the task ends canceled,
        and the answer the stopped turn gives is not its."""
        row = await self.get(caller, task_id)
        if row["state"] != "working":
            if row["state"] == "canceled":
                return row
            raise wire.RpcError(-32002, f"task {task_id!r} has already ended ({row['state']}); it cannot be canceled")
        if await self.db.a2a.end(task_id, "canceled", now=self.clock()):
            session_id = await self.db.routes.get(row["session_key"])
            await self.router.stop(row["session_key"], session_id)
            self._finished(task_id)
        found = await self.db.a2a.get(task_id)
        assert found is not None
        return found

    # -- push notifications ---------------------------------------------------------------------
    async def run_pushes(self) -> None:
        """Send due push notifications until cancelled (the daemon's listener runs it)."""
        timeout = aiohttp.ClientTimeout(total=self.push.timeout_seconds)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    for row in await self.db.a2a.due_pushes(self.clock()):
                        await self._push(session, row)
                except state.StateError as exc:  # the store is busy or away: the pushes stay due, tried again
                    log.warning("a2a push notifications wait: the store failed (%s)", exc)
                self._push_wake.clear()
                try:
                    await asyncio.wait_for(self._push_wake.wait(), PUSH_POLL_SECONDS)
                except TimeoutError:
                    pass

    async def _push(self, session: aiohttp.ClientSession, row: dict) -> None:
        now = self.clock()
        # taken for one try: its next try is set past this one's timeout, so a sender that dies mid-try
        # leaves it due again (to this instance after a restart, or to another)
        if not await self.db.a2a.take_push(row["id"], row["push_due"], now + self.push.timeout_seconds + 5):
            return
        attempt = row["push_attempts"] + 1
        headers = {"X-A2A-Notification-Token": row["push_token"]} if row["push_token"] else {}
        error: str | None
        try:
            async with session.post(row["push_url"], json={"task": wire.task(row)}, headers=headers) as response:
                if 200 <= response.status < 300:
                    await self.db.a2a.settle_push(row["id"], None)
                    log.info("a2a push for task %s delivered (try %d)", row["id"], attempt)
                    return
                error = f"HTTP {response.status}"
                final = 400 <= response.status < 500 and response.status not in (408, 425, 429)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error, final = f"{type(exc).__name__}: {exc}", False
        if final or attempt >= self.push.attempts:
            log.warning("a2a push for task %s given up after %d tries: %s", row["id"], attempt, error)
            await self.db.a2a.settle_push(row["id"], None, f"given up after {attempt} tries: {error}")
            return
        await self.db.a2a.settle_push(row["id"], self.clock() + PUSH_BACKOFF.delay(attempt - 1), error)
