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

The event id is ``<UIDVALIDITY>:<UID>``: what the server guarantees names one mail
in this mailbox for good.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Awaitable, Callable

import aioimaplib

from gateway.retry import Backoff

from .outbound import ImapError, ImapLogin, close, expect

log = logging.getLogger(__name__)

Deliver = Callable[[str, bytes], Awaitable[bool]]
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
        self._first: aioimaplib.IMAP4 | None = None
        self.last_beat = time.monotonic()
        self.rounds = 0  # finished rounds, for tests and health
        self._last_found = 0  # mails the last round's search found
        self._heard_nothing_new = 0  # rounds in a row that heard of new mail and found none
        self.lost = asyncio.Event()  # set when the current connection ended

    def adopt(self, client: aioimaplib.IMAP4) -> None:
        """Begin with ``client``, a connection already opened with :meth:`connection_lost` as its callback
        (the adapter's start checks the login on it)."""
        self._first = client

    def connection_lost(self, exc: Exception | None) -> None:
        """aioimaplib's callback: the server closed the connection (or the network cut it)."""
        self.lost.set()

    async def run(self) -> None:
        failures = 0
        while True:
            client, self._first = self._first, None
            try:
                if client is None:
                    self.lost = asyncio.Event()
                    client = await self._login.open(on_lost=self.connection_lost)
                self._report("connected", None)
                if failures:
                    log.info("email: the IMAP connection is back after %d failed attempt(s)", failures)
                    failures = 0
                await self._serve(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is reported and retried
                wait = self._backoff.delay(failures)
                failures += 1
                log.warning("email: IMAP failed (%s: %s); reconnecting in %.1fs", type(exc).__name__, exc, wait)
                self._report("reconnecting", f"IMAP: {type(exc).__name__}: {exc}")
                await asyncio.sleep(wait)
            finally:
                if client is not None:
                    await close(client)

    async def _serve(self, client: aioimaplib.IMAP4) -> None:
        validity = await self._uidvalidity(client)
        idle = self._idle and client.has_capability("IDLE")
        stuck = 0
        while True:
            if self.lost.is_set():  # polling: the connection ended while we slept
                raise ImapError("the IMAP server closed the connection")
            handed = await self._round(client, validity)
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
                await self._wait_idle(client)
            else:
                await asyncio.sleep(self._poll_seconds)

    async def _uidvalidity(self, client: aioimaplib.IMAP4) -> str:
        response = await expect(client.status(self._quoted_mailbox(), "(UIDVALIDITY)"), "STATUS")
        for line in response.lines:
            found = _UIDVALIDITY.search(bytes(line))
            if found:
                return found.group(1).decode()
        return "0"

    def _quoted_mailbox(self) -> str:
        from .outbound import quote

        return quote(self._login.mailbox)

    async def _round(self, client: aioimaplib.IMAP4, validity: str) -> int | None:
        """Hand over every mail not yet taken; how many there were, or None when the gateway failed on one
        (the rest wait, to keep the mailbox's order)."""
        # A NOOP in flight beside the SEARCH collects what the server announces meanwhile: a mail that
        # landed while the SEARCH ran comes as an untagged EXISTS after its result, which aioimaplib hands
        # to a pending NOOP and otherwise drops (and the server does not announce it again in IDLE).
        response, noop = await asyncio.gather(
            expect(client.uid_search("UNKEYWORD", self._keyword, charset=None), "SEARCH"), client.noop())
        announced = any(b"EXISTS" in bytes(line) for line in noop.lines if isinstance(line, (bytes, bytearray)))
        uids = sorted(search_uids(response))
        self._last_found = len(uids)
        for uid in uids:
            raw = await self._fetch(client, uid)
            if raw is None:  # expunged meanwhile
                continue
            if not await self._deliver(f"{validity}:{uid}", raw):
                return None
            await expect(client.uid("store", str(uid), "+FLAGS.SILENT", f"({self._keyword} \\Seen)"), "STORE")
        return len(uids) + int(announced and self._heard_nothing_new < 3)  # announced meanwhile: one more round

    async def _fetch(self, client: aioimaplib.IMAP4, uid: int) -> bytes | None:
        response = await expect(client.uid("fetch", str(uid), "(BODY.PEEK[])"), "FETCH")
        for line in response.lines:
            if isinstance(line, (bytearray, memoryview)):
                return bytes(line)
        return None

    async def _wait_idle(self, client: aioimaplib.IMAP4) -> None:
        """Wait in IDLE until the mailbox changes (or ``idle_seconds`` pass, to renew it).

        aioimaplib does not end a wait when the server goes away, so the connection's end (its
        ``conn_lost_cb``) and a ``BYE`` end it here: the loop reconnects instead of waiting out the renewal."""
        if self.lost.is_set():
            raise ImapError("the IMAP server closed the connection")
        idle = await client.idle_start(timeout=self._idle_seconds)
        try:
            while True:
                push = asyncio.ensure_future(client.wait_server_push(timeout=self._idle_seconds + 30))
                lost = asyncio.ensure_future(self.lost.wait())
                done, _ = await asyncio.wait({push, lost}, return_when=asyncio.FIRST_COMPLETED)
                if push not in done:
                    push.cancel()
                    raise ImapError("the IMAP server closed the connection")
                lost.cancel()
                got = push.result()
                self.last_beat = time.monotonic()
                if got == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    break
                lines = [bytes(line) for line in (got if isinstance(got, list) else [got])
                         if isinstance(line, (bytes, bytearray))]
                bye = next((line for line in lines if line.startswith(b"BYE")), None)
                if bye is not None:
                    raise ImapError(f"the IMAP server ended the connection: {bye.decode(errors='replace')[:200]}")
                if any(b"EXISTS" in line or b"FETCH" in line for line in lines):
                    break
        finally:
            if self.lost.is_set():
                idle.cancel()
            else:
                if client.has_pending_idle():
                    client.idle_done()
                await asyncio.wait_for(idle, self._login.timeout)
