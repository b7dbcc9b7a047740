"""The IMAP loop: every mail in the mailbox taken once, flagged only after the gateway stored it.

    box = Mailbox(login, deliver, keyword="$SwitchboardTaken", idle=True, poll_seconds=30, ...)
    await box.run()          # until cancelled; reconnects with backoff, never ends on an error

Each round asks the server for the mails without the keyword (``UID SEARCH
UNKEYWORD $SwitchboardTaken``), oldest first, fetches each one whole without
marking it read (``BODY.PEEK[]``), awaits ``deliver(event_id, raw)`` and only
when that returned True sets the keyword (and ``\\Seen``).  A crash between the
two leaves the mail without its keyword: the next round hands it over again and
the gateway, which keeps a session's message ids unique, stores and answers it
once.  So a mail is stored before anything that can fail, and never lost.

When ``deliver`` returns False (the gateway failed on it) the round stops there
and the loop waits before trying again, so the mailbox's order is kept; after
:data:`~gateway.types.DEAD_LETTER_AFTER` failures the adapter sets the mail aside
as a dead letter and returns True, so one bad mail never holds the others.

Between rounds the loop waits in IDLE (RFC 2177) until the server says something
changed, renewed every ``idle_seconds``; a server without IDLE, or ``idle: false``,
is polled every ``poll_seconds``.

When the connection ends (a ``BYE``, a reset, a failed command) every wait on it
ends at once (:func:`_until_lost`: aioimaplib would wait out its timeout), the
health says ``reconnecting`` and a new connection is opened after the backoff's
wait, which grows while no round succeeds.  Its first round catches up: the UIDs
handed over whose keyword the old connection never confirmed are flagged first
(so none is handed over twice), then every mail still without the keyword is
taken, oldest UID first.

The event id is ``<UIDVALIDITY>:<UID>``: what the server guarantees names one mail
in this mailbox for good.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, TypeVar

import aioimaplib

from gateway.retry import Backoff

from .outbound import ImapError, ImapLogin, close, expect, quote

log = logging.getLogger(__name__)

Deliver = Callable[[str, bytes], Awaitable[bool]]
T = TypeVar("T")
_UIDVALIDITY = re.compile(rb"UIDVALIDITY (\d+)")
_FETCH_UID = re.compile(rb"UID (\d+)")


def search_uids(response: aioimaplib.Response) -> set[int]:
    """The UIDs of a SEARCH answer: its lines of numbers only (an untagged ``3 EXISTS`` may sit among them)."""
    found: set[int] = set()
    for line in response.lines[:-1]:
        words = bytes(line).split()
        if words and all(w.isdigit() for w in words):
            found.update(int(w) for w in words)
    return found


@dataclass
class Link:
    """One IMAP connection and the event its end sets (each connection its own: a late callback of an
    old one never marks a new one lost)."""

    client: aioimaplib.IMAP4
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class Mailbox:
    def __init__(self, login: ImapLogin, deliver: Deliver, *, keyword: str, idle: bool, poll_seconds: float,
                 idle_seconds: float, report: Callable[[str, str | None], None], backoff: Backoff):
        self._login = login
        self._deliver = deliver
        self._keyword = keyword
        self._idle = idle
        self._poll_seconds = poll_seconds
        self._idle_seconds = idle_seconds
        self._report = report
        self._backoff = backoff
        self._first: Link | None = None
        self._current: Link | None = None
        self.last_beat = time.monotonic()
        self.rounds = 0  # finished rounds, for tests and health
        self.connections = 0  # connections opened, for tests and health
        self._last_found = 0  # mails the last round's search found
        self._heard_nothing_new = 0  # rounds in a row that heard of new mail and found none
        # UIDs handed over (the gateway stored them) whose keyword the server may not have set: the
        # connection ended before the STORE's answer.  The next connection flags them first, so a mail
        # is never handed over twice across a reconnect (the gateway would answer it once anyway).
        self._unflagged: dict[str, set[int]] = {}

    async def open(self) -> Link:
        """A new logged-in connection, watched: its end (the server's BYE, a cut) sets its ``lost``."""
        lost = asyncio.Event()

        def ended(exc: Exception | None) -> None:
            lost.set()
            if self._current is not None and self._current.lost is lost:
                self._report("reconnecting", f"IMAP: the connection ended ({type(exc).__name__ if exc else 'closed'})")

        # aioimaplib waits out its timeout for a greeting or a login answer from a server that already
        # closed the connection: its end ends the wait
        client = await _until_lost(lost, self._login.open(on_lost=ended), "the login")
        self.connections += 1
        return Link(client, lost)

    def adopt(self, link: Link) -> None:
        """Begin with ``link``, a connection already opened by :meth:`open` (the adapter's start checks
        the login on it)."""
        self._first = link

    async def run(self) -> None:
        """Serve connection after connection, until cancelled.  A connection that ends (the server's BYE,
        a cut, a command that failed) is closed and a new one opened after the backoff's wait, which grows
        while no round succeeds; the new one's first round catches up on every mail not taken yet."""
        failures = 0
        while True:
            link, self._first = self._first, None
            rounds, wait = self.rounds, 0.0
            try:
                if link is None:
                    link = await self.open()
                self._current = link
                self._report("connected", None)
                if failures:
                    log.info("email: the IMAP connection is back after %d failed attempt(s)", failures)
                await self._serve(link)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is reported and retried
                if self.rounds > rounds:  # that connection served: start the backoff afresh
                    failures = 0
                wait = self._backoff.delay(failures)
                failures += 1
                log.warning("email: IMAP failed (%s: %s); reconnecting in %.1fs", type(exc).__name__, exc, wait)
                self._report("reconnecting", f"IMAP: {type(exc).__name__}: {exc}")
            finally:
                self._current = None
                if link is not None:
                    await close(link.client, lost=link.lost.is_set())
            await asyncio.sleep(wait)

    async def _ask(self, link: Link, call: Awaitable[aioimaplib.Response], what: str) -> aioimaplib.Response:
        """``expect(call)``, ended at once when the connection ends."""
        return await _until_lost(link, expect(call, what), what)

    async def _serve(self, link: Link) -> None:
        client = link.client
        validity = await self._uidvalidity(link)
        await self._flag_left_over(link, validity)
        idle = self._idle and client.has_capability("IDLE")
        stuck = 0
        while True:
            if link.lost.is_set():  # polling: the connection ended while we slept
                raise ImapError("the IMAP server closed the connection")
            handed = await self._round(link, validity)
            self.rounds += 1
            self.last_beat = time.monotonic()
            if handed is None:  # the gateway failed on a mail: wait, then hand it over again
                await asyncio.sleep(self._backoff.delay(stuck))
                stuck += 1
                continue
            stuck = 0
            # a server that announced mail no search then found, three rounds running, is not believed again
            self._heard_nothing_new = self._heard_nothing_new + 1 if handed == 1 and self._last_found == 0 else 0
            if handed:
                # Again, until a round finds nothing: a mail that arrived during this one may have been
                # announced (EXISTS) in the answer to a FETCH or STORE, which aioimaplib drops, and the
                # server would not announce it again in IDLE.  After a round that found nothing and heard
                # of nothing, no command runs before IDLE, so whatever arrives next is announced there.
                continue
            if idle:
                await self._wait_idle(link)
            else:
                lost = asyncio.ensure_future(link.lost.wait())
                try:
                    await asyncio.wait({lost}, timeout=self._poll_seconds)
                finally:
                    lost.cancel()

    async def _flag_left_over(self, link: Link, validity: str) -> None:
        """Set the keyword on the mails handed over before the last connection ended, before any search."""
        left = self._unflagged.pop(validity, set())
        self._unflagged.clear()  # another UIDVALIDITY: those UIDs name nothing now
        if not left:
            return
        self._unflagged[validity] = left
        uids = ",".join(str(uid) for uid in sorted(left))
        await self._ask(link, link.client.uid("store", uids, "+FLAGS.SILENT", f"({self._keyword} \\Seen)"), "STORE")
        log.info("email: flagged %d mail(s) taken before the IMAP connection ended", len(left))
        self._unflagged.pop(validity, None)

    async def _uidvalidity(self, link: Link) -> str:
        response = await self._ask(link, link.client.status(quote(self._login.mailbox), "(UIDVALIDITY)"), "STATUS")
        for line in response.lines:
            found = _UIDVALIDITY.search(bytes(line))
            if found:
                return found.group(1).decode()
        return "0"

    async def _round(self, link: Link, validity: str) -> int | None:
        """Hand over every mail not yet taken, oldest UID first; how many there were, or None when the
        gateway failed on one (the rest wait, to keep the mailbox's order)."""
        client = link.client
        # A NOOP in flight beside the SEARCH collects what the server announces meanwhile: a mail that
        # landed while the SEARCH ran comes as an untagged EXISTS after its result, which aioimaplib hands
        # to a pending NOOP and otherwise drops (and the server does not announce it again in IDLE).
        search = self._ask(link, client.uid_search("UNKEYWORD", self._keyword, charset=None), "SEARCH")
        response, noop = await asyncio.gather(search, self._ask(link, client.noop(), "NOOP"))
        announced = any(b"EXISTS" in bytes(line) for line in noop.lines if isinstance(line, (bytes, bytearray)))
        uids = sorted(search_uids(response))
        self._last_found = len(uids)
        for uid in uids:
            raw = await self._fetch(link, uid)
            if raw is None:  # expunged meanwhile
                continue
            if not await self._deliver(f"{validity}:{uid}", raw):
                return None
            pending = self._unflagged.setdefault(validity, set())
            pending.add(uid)  # until the server confirms the keyword
            await self._ask(link, client.uid("store", str(uid), "+FLAGS.SILENT", f"({self._keyword} \\Seen)"),
                            "STORE")
            pending.discard(uid)
        return len(uids) + int(announced and self._heard_nothing_new < 3)  # announced meanwhile: one more round

    async def _fetch(self, link: Link, uid: int) -> bytes | None:
        response = await self._ask(link, link.client.uid("fetch", str(uid), "(BODY.PEEK[])"), "FETCH")
        for line in response.lines:
            if isinstance(line, (bytearray, memoryview)):
                return bytes(line)
        return None

    async def _wait_idle(self, link: Link) -> None:
        """Wait in IDLE until the mailbox changes (or ``idle_seconds`` pass, to renew it).

        aioimaplib does not end a wait when the server goes away, so the connection's end (its
        ``conn_lost_cb``) and a ``BYE`` end it here: the loop reconnects instead of waiting out the
        renewal.  A connection cut without a word (no FIN) shows at the renewal, whose DONE goes
        unanswered for ``timeout`` seconds."""
        client = link.client
        if link.lost.is_set():
            raise ImapError("the IMAP server closed the connection")
        idle = await _until_lost(link, client.idle_start(timeout=self._idle_seconds), "IDLE")
        try:
            while True:
                push = asyncio.ensure_future(client.wait_server_push(timeout=self._idle_seconds + 30))
                lost = asyncio.ensure_future(link.lost.wait())
                done, _ = await asyncio.wait({push, lost}, return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                if push not in done:
                    push.cancel()
                    raise ImapError("the IMAP server closed the connection")
                got = push.result()
                self.last_beat = time.monotonic()
                if got == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    break
                lines = [bytes(line) for line in (got if isinstance(got, list) else [got])
                         if isinstance(line, (bytes, bytearray))]
                bye = next((line for line in lines if line.startswith(b"BYE") or line.startswith(b"* BYE")), None)
                if bye is not None:  # the server is going: no answer to DONE will come
                    link.lost.set()
                    raise ImapError(f"the IMAP server ended the connection: {bye.decode(errors='replace')[:200]}")
                if any(b"EXISTS" in line or b"FETCH" in line for line in lines):
                    break
        finally:
            if link.lost.is_set():
                idle.cancel()
            else:
                if client.has_pending_idle():
                    client.idle_done()
                await self._ask(link, asyncio.wait_for(idle, self._login.timeout), "IDLE")


async def _until_lost(link: Link | asyncio.Event, work: Awaitable[T], what: str) -> T:
    """``await work``, or :class:`ImapError` as soon as the connection ends: aioimaplib does not end a
    command, an IDLE's start or the wait for a greeting when the server goes away (it waits out its
    timeout, or for ever), so every wait on the server is raced against the connection's end."""
    lost = link.lost if isinstance(link, Link) else link
    doing = asyncio.ensure_future(work)
    ended = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait({doing, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        if not doing.done():
            doing.cancel()
            await asyncio.gather(doing, return_exceptions=True)
    if doing.cancelled():
        raise ImapError(f"the IMAP server closed the connection during {what}")
    return doing.result()
