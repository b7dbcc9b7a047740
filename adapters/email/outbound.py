"""SMTP submission on aiosmtplib, retried; and the IMAP connection both directions share.

aiosmtplib and aioimaplib are the maintained asyncio clients of the two protocols
(aiosmtplib has typed errors carrying the server's code; aioimaplib does IDLE);
the standard library's ``smtplib``/``imaplib`` would block the event loop.

    smtp = Submission(host, port, tls="starttls", username=..., password=...)
    await smtp.send(mail)                  # retried on 4xx and dropped connections; a 5xx raises at once

A refusal of the whole message (5xx) is final and says what the server said; a
temporary one (4xx), a timeout or a dropped connection is retried with backoff
(a timed-out DATA may have been accepted: the reply's stable ``Message-ID`` lets
the reader's client show a repeat once).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any, Callable

import aioimaplib
import aiosmtplib

from gateway.errors import AdapterError
from gateway.retry import Backoff, retry_async

log = logging.getLogger(__name__)


class SmtpRefused(AdapterError):
    """The SMTP server refused the reply for good (a 5xx); its answer says why."""


def smtp_retry(exc: BaseException) -> float | None:
    """Seconds to wait before trying again (0: at once), or None to give up."""
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return None
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return 0.0 if all(400 <= r.code < 500 for r in exc.recipients) else None
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return 0.0 if 400 <= exc.code < 500 else None
    if isinstance(exc, (aiosmtplib.SMTPConnectError, aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError,
                        OSError, asyncio.TimeoutError)):
        return 0.0
    return None


def describe_smtp(exc: BaseException) -> str:
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return f"the SMTP server refused the login ({exc.code}): check platforms.email.smtp_username and smtp_password"
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return "the SMTP server refused the recipient: " + "; ".join(f"{r.recipient}: {r.code} {r.message}"
                                                                     for r in exc.recipients)
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return f"the SMTP server answered {exc.code} {exc.message}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Submission:
    host: str
    port: int
    tls: str  # ssl | starttls | none
    username: str
    password: str
    timeout: float = 30.0
    backoff: Backoff = Backoff(base=1.0, factor=2.0, cap=30.0)
    attempts: int = 5
    budget_seconds: float = 120.0

    async def _once(self, mail: EmailMessage, sender: str, to: str) -> None:
        await aiosmtplib.send(
            mail, sender=sender, recipients=[to], hostname=self.host, port=self.port,
            username=self.username or None, password=self.password or None,
            use_tls=self.tls == "ssl", start_tls=True if self.tls == "starttls" else False,
            timeout=self.timeout, tls_context=ssl.create_default_context() if self.tls != "none" else None)

    async def send(self, mail: EmailMessage, *, sender: str, to: str) -> None:
        def retrying(attempt: int, exc: BaseException, wait: float) -> None:
            log.warning("email: sending to %s failed (%s); attempt %d, again in %.1fs", to, describe_smtp(exc),
                        attempt, wait)

        await retry_async(lambda: self._once(mail, sender, to), classify=smtp_retry, backoff=self.backoff,
                          max_attempts=self.attempts, total_seconds=self.budget_seconds, on_retry=retrying)


class ImapError(AdapterError):
    """The IMAP server refused a command or the connection failed; the message says which and why."""


@dataclass(frozen=True)
class ImapLogin:
    host: str
    port: int
    tls: str  # ssl | none (aioimaplib has no STARTTLS)
    username: str
    password: str
    mailbox: str
    timeout: float = 30.0

    async def open(self, on_lost: Callable[[Exception | None], None] | None = None) -> aioimaplib.IMAP4:
        """A logged-in connection with ``mailbox`` selected; ``on_lost`` is called when the connection ends."""
        # IMAP4 itself, with a TLS context for implicit TLS: aioimaplib's IMAP4_SSL takes no conn_lost_cb
        context = ssl.create_default_context() if self.tls == "ssl" else None
        client = aioimaplib.IMAP4(host=self.host, port=self.port, timeout=self.timeout, conn_lost_cb=on_lost,
                                  ssl_context=context)
        try:
            await client.wait_hello_from_server()
            keep_alive(getattr(client.protocol, "transport", None))
            response = await client.login(self.username, self.password)
            if response.result != "OK":
                raise ImapError(f"the IMAP server refused the login of {self.username!r}: check platforms.email."
                                "username and password")
            await expect(client.select(quote(self.mailbox)), f"SELECT {self.mailbox}")
        except BaseException:
            await close(client)
            raise
        return client


# A connection cut without a reset (a NAT or a firewall forgetting it) is otherwise seen only when IDLE is
# renewed: the kernel probes after a minute of silence and gives up after four unanswered probes, 15 s apart.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES = 60, 15, 4


def keep_alive(transport: asyncio.BaseTransport | None) -> None:
    """Turn on TCP keepalive on the IMAP connection, so a silent cut ends it within about two minutes."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                          ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, option):  # Linux has all three; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


async def expect(call, what: str) -> aioimaplib.Response:
    response = await call
    if response.result != "OK":
        detail = b" ".join(line for line in response.lines if isinstance(line, bytes))[:300]
        raise ImapError(f"IMAP {what} failed: {response.result} {detail.decode(errors='replace')}")
    return response


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def close(client: aioimaplib.IMAP4, *, lost: bool = False) -> None:
    """Log out and close; a connection that already ended (``lost``) is only closed, since aioimaplib
    keeps its state and would wait out the timeout for an answer to LOGOUT that cannot come."""
    try:
        if not lost and client.get_state() in ("AUTH", "SELECTED"):
            await asyncio.wait_for(client.logout(), 5)
    except Exception as exc:  # noqa: BLE001 - closing is best effort
        log.debug("email: IMAP logout failed: %s", type(exc).__name__)
    transport = getattr(client.protocol, "transport", None)
    if transport is not None:
        transport.close()


async def probe_servers(cfg: Any, timeout: float) -> tuple[bool, str, str]:
    """Log in to the mailbox and the submission server of ``cfg`` (an ``EmailConfig``); sends nothing."""
    login = ImapLogin(cfg.imap_host, cfg.imap_port, cfg.imap_tls, cfg.username, cfg.password, cfg.mailbox,
                      timeout=timeout)
    try:
        client = await login.open()
    except ImapError as exc:
        return False, str(exc), "check platforms.email.username, password and mailbox"
    except (OSError, asyncio.TimeoutError) as exc:
        return (False, f"cannot reach the IMAP server {cfg.imap_host}:{cfg.imap_port} ({type(exc).__name__})",
                "check platforms.email.imap_host, imap_port and imap_tls")
    idle = client.has_capability("IDLE")
    await close(client)
    smtp = aiosmtplib.SMTP(hostname=cfg.smtp_host, port=cfg.smtp_port, use_tls=cfg.smtp_tls == "ssl",
                           start_tls=cfg.smtp_tls == "starttls", timeout=timeout)
    try:
        await smtp.connect()
        await smtp.login(cfg.smtp_username or cfg.username, cfg.smtp_password or cfg.password)
    except aiosmtplib.SMTPAuthenticationError:
        return False, "the SMTP server refused the login", "check platforms.email.smtp_username and smtp_password"
    except (aiosmtplib.SMTPException, OSError, asyncio.TimeoutError) as exc:
        return (False, f"cannot use the SMTP server {cfg.smtp_host}:{cfg.smtp_port} ({type(exc).__name__})",
                "check platforms.email.smtp_host, smtp_port and smtp_tls")
    finally:
        if smtp.is_connected:
            try:
                await smtp.quit()
            except aiosmtplib.SMTPException:
                smtp.close()
    how = "IDLE" if idle and cfg.idle else f"polling every {cfg.poll_seconds:g}s"
    return True, f"IMAP login to {cfg.mailbox} ({how}) and SMTP login work", ""
