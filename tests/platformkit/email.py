"""Email for the conformance kit: a real Dovecot (IMAP) and aiosmtpd (SMTP submission), tests/mailservers.py.

A user's mails to the bot are one thread (each after the first answers the first), so the kit's "DM"
is one conversation; a mail lands by IMAP APPEND, as a delivery agent would put it there.  What a
chat shows is the text part of every reply the SMTP server accepted for that address.

Faults in SMTP's terms: a 429 (rate limit) is a 451 (try again later: SMTP has no retry-after, the
adapter's backoff waits 1-2 s), a 5xx server error a 421 (service not available: in SMTP a 5xx would
refuse the mail for good), a slow send a late answer to DATA, a dropped connection ``doveadm kick``
(every IMAP connection cut).  A redelivery is the same mail appended again (a second UID, the same
Message-ID); the kit's out-of-order pair lands newest first.  An edit does not exist in email.
"""

from __future__ import annotations

import asyncio
import time
from email.message import EmailMessage

from tests.crashkit import EmailSide
from tests.mailservers import DovecotServer, SmtpSink, why_no_dovecot

from .contract import FakePlatform, Sent


def _key(chat: str) -> str:
    return "agent:main:email:dm:" + chat.replace("%", "%25").replace(":", "%3A")


class EmailKit(FakePlatform):
    name = "email"

    def __init__(self) -> None:
        self.imap: DovecotServer | None = None
        self.smtp = SmtpSink()
        self._roots: dict[str, str] = {}
        self._count = 0

    async def start(self) -> None:
        reason = why_no_dovecot()
        if reason:
            import pytest

            pytest.skip(reason)
        self.imap = await asyncio.to_thread(DovecotServer.start)
        self.smtp.start()

    async def stop(self) -> None:
        self.smtp.stop()
        if self.imap is not None:
            await asyncio.to_thread(self.imap.stop)

    def settings(self) -> dict:
        assert self.imap is not None
        return {"imap_host": "127.0.0.1", "imap_port": self.imap.port, "imap_tls": "none",
                "username": self.imap.user, "password": self.imap.password, "smtp_host": "127.0.0.1",
                "smtp_port": self.smtp.port, "smtp_tls": "none", "smtp_password": self.smtp.password,
                "poll_seconds": 1}

    def user_id(self, who: str) -> str:
        return f"{who}@example.com"

    # -- inbound

    def _mail(self, who: str, text: str, attach: tuple[str, bytes, str] | None = None) -> tuple[bytes, str]:
        """A mail from ``who`` in their thread with the bot (no subject: the model reads the body alone)."""
        self._count += 1
        address = self.user_id(who)
        msg = EmailMessage()
        msg["From"] = address
        msg["To"] = "bot@example.com"
        msg["Message-ID"] = f"<kit.{self._count}.{time.monotonic_ns()}@example.com>"
        root = self._roots.setdefault(address, str(msg["Message-ID"]))
        if root != msg["Message-ID"]:
            msg["In-Reply-To"] = root
            msg["References"] = root
        try:
            msg.set_content(text)
        except UnicodeEncodeError:  # a lone surrogate: the bytes a broken client would send
            msg.set_content(text.encode("utf-8", "surrogatepass"), maintype="text", subtype="plain",
                            cte="8bit")
            msg.replace_header("Content-Type", 'text/plain; charset="utf-8"')
        if attach is not None:
            name, data, mime = attach
            major, minor = mime.split("/")
            msg.add_attachment(data, maintype=major, subtype=minor, filename=name)
        return msg.as_bytes(), f"{address} {root}"

    async def _land(self, raw: bytes) -> None:
        assert self.imap is not None
        await asyncio.to_thread(self.imap.append, raw)

    async def dm(self, who: str, text: str) -> Sent:
        raw, chat = self._mail(who, text)
        await self._land(raw)
        return Sent(self.user_id(who), _key(chat), raw)

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        raw, chat = self._mail(who, text, (name, data, mime))
        await self._land(raw)
        return Sent(self.user_id(who), _key(chat), raw)

    async def redeliver(self, sent: Sent) -> None:
        await self._land(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        (first, chat), (second, _) = (self._mail(who, t) for t in texts)
        await self._land(second)
        await self._land(first)
        return Sent(self.user_id(who), _key(chat), first), Sent(self.user_id(who), _key(chat), second)

    async def malformed(self) -> int:
        bad = [
            b"",  # nothing at all
            b"\x00\xff\xfe\r\n\r\n\x80\x81",  # garbage
            b"From: ann@example.com, eve@example.com\r\nSubject: two senders\r\n\r\nhi\r\n",
            b"Subject: no sender\r\n\r\nhi\r\n",
            b'From: "ann@example.com" <eve@example.com\r\n\r\nhalf an address\r\n',
            b"From: ann@example.com\r\nContent-Type: multipart/mixed; boundary=\"x\"\r\n\r\n--x\r\n",  # cut short
            b"From: ann@example.com\r\nContent-Type: text/plain; charset=martian\r\n\r\n\xe9\xe9\r\n",
        ]
        for raw in bad:
            await self._land(raw or b"\r\n")
        return len(bad)

    # -- what the chats show

    def _to(self, chat: str):
        return [a for a in list(self.smtp.messages) if a.rcpt_tos == [chat]]

    def shown(self, chat: str) -> list[str]:
        out = []
        for accepted in self._to(chat):
            body = accepted.message.get_body(("plain",))
            out.append(body.get_content().replace("\r\n", "\n").strip() if body is not None else "")
        return out

    def send_times(self, chat: str) -> list[float]:
        return [at for at, rcpts, _answer in list(self.smtp.attempts) if rcpts == [chat]]

    def edits(self, chat: str) -> int:
        return 0

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        answer = "451 4.7.1 slow down, try again later" if status == 429 else "421 4.3.2 service not available"
        self.smtp.refusals.extend([answer] * times)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.smtp.delays.extend([seconds] * times)

    async def drop_connection(self) -> None:
        assert self.imap is not None
        await asyncio.to_thread(self.imap.kick)

    def crash_side(self):
        assert self.imap is not None
        return EmailSide(self.imap, self.smtp)
