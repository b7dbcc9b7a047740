"""The email adapter: one mailbox read over IMAP, replies submitted over SMTP.

    adapter = EmailAdapter(EmailConfig(imap_host="imap.example.com", username="bot@example.com", password="...",
                                       smtp_host="smtp.example.com"))
    await adapter.start(handler)      # logs in (a refused login raises AdapterError), then IDLE/polls
    await adapter.send(ChatRef("email", "boss@example.com", "<root@example.com>"), "**hi**",
                       reply_to="<question@example.com>")
    await adapter.stop()

Chats: the chat is the sender's address with the thread's root ``Message-ID``
(``boss@example.com <root@example.com>``, :func:`~adapters.email.message.chat_id`), a
private conversation like a DM, so each thread is a session of its own.  A stranger
(a sender not in ``allowed_users``) is offered pairing as on any platform, within the
gateway's limits (one answer per sender per 10 minutes, 3 codes pending); set
``authserv_id`` so only mail your server authenticated gets that far, or
``auth.unauthorized_dm: ignore``.

A reply threads under the mail it answers.  Its subject and references come from
the mail as it was read; after a restart, or on a standby of a cluster, which never
read it, they are looked up in the mailbox by ``Message-ID`` (a short IMAP
connection of its own).  A reply is one mail, never split; resent after a crash it
carries the same ``Message-ID`` (:func:`~adapters.email.compose.reply_id`).  A reply
over :data:`MESSAGE_LIMIT` characters goes as several mails, each threaded the same.

Email cannot edit a sent mail, so replies are never streamed, and there is no
typing indicator.  A cluster runs the IMAP loop on one instance (the connection
key is the mailbox, hashed); every instance can send (:meth:`open_for_sending`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Sequence

from gateway.errors import AdapterError
from gateway.formatting import split_message
from gateway.retry import Backoff
from gateway.tasks import spawn
from gateway.types import (
    AdapterHealth,
    ChatRef,
    DeadLetterHandler,
    Delivery,
    FailedEvents,
    InboundHandler,
    MediaLimits,
    SendProgress,
)

from .compose import compose_reply
from .config import EmailConfig, strict_address
from .mailbox import Mailbox, search_uids
from .message import PLATFORM, Rules, Thread, parse_headers, read_mail, split_chat, thread_of
from .outbound import ImapError, ImapLogin, Submission, close, describe_smtp, expect, quote

log = logging.getLogger(__name__)

THREADS_REMEMBERED = 10_000
# A mail can be far longer, but a reply longer than this is more readable as several (and the kit's
# split check needs a limit); the model's replies are rarely a tenth of it.
MESSAGE_LIMIT = 100_000


class EmailAdapter:
    """One mailbox (see the module docstring)."""

    platform = PLATFORM

    def __init__(
        self,
        config: EmailConfig,
        *,
        commands: Sequence[tuple[str, str]] = (),
        vision: bool = False,
        media: MediaLimits | None = None,
        timeout: float = 30.0,
        reconnect_backoff: Backoff = Backoff(base=1.0, factor=2.0, cap=60.0),
        # SMTP says no retry-after: a 4xx is tried again after 1-2 s, then 2-4 s, ...
        send_backoff: Backoff = Backoff(base=2.0, factor=2.0, cap=30.0),
        send_attempts: int = 5,
    ):
        """``config`` (``platforms.email``, checked when it was loaded: the login, the SMTP server, the From
        address) names the mailbox and how to answer; ``media`` comes from the rest of the config (mail has
        no commands menu and reads no pictures); the keywords after it time and retry (tests turn them)."""
        c = config
        problem = c.credential_problem()  # the model's own rule: what the gateway asked before building this
        if problem is not None:
            raise AdapterError(f"email: {problem}")
        sender = c.from_address or ""
        self._sender = strict_address(sender) or sender
        self._from_name = c.from_name
        self._login = ImapLogin(c.imap_host, c.imap_port, c.imap_tls, c.username, c.password, c.mailbox,
                                timeout=timeout)
        self._smtp = Submission(c.smtp_host, c.smtp_port, c.smtp_tls, c.smtp_username or c.username,
                                c.smtp_password or c.password, timeout=timeout, backoff=send_backoff,
                                attempts=send_attempts)
        self._keyword = c.taken_keyword
        self._idle = c.idle
        self._poll_seconds = c.poll_seconds
        self._idle_seconds = c.idle_seconds
        self._rules = Rules(own=self._sender, authserv_id=c.authserv_id, max_body_chars=c.max_body_chars,
                            media=media or MediaLimits())
        self._reconnect_backoff = reconnect_backoff
        self._health = AdapterHealth(platform=PLATFORM)
        self._handler: InboundHandler | None = None
        self._failed = FailedEvents(PLATFORM, None)
        self._threads: OrderedDict[str, Thread] = OrderedDict()  # Message-ID -> its threading headers
        self._mailbox: Mailbox | None = None
        self._task: asyncio.Task | None = None
        self._open = False  # sending allowed (started, or opened for sending)

    @classmethod
    def from_config(cls, platform_cfg: EmailConfig, *, commands: Sequence[tuple[str, str]] = (), vision: bool = False,
                    media: MediaLimits | None = None) -> "EmailAdapter":
        """The gateway's way in (``gateway.types.Adapter``): the adapter of ``Config.platforms.email``."""
        return cls(platform_cfg, commands=commands, vision=vision, media=media)

    # -- lifecycle ---------------------------------------------------------------------

    def health(self) -> AdapterHealth:
        return self._health

    def _report(self, state: str, error: str | None) -> None:
        self._health.state = state
        if error is not None:
            self._health.last_error = error

    async def open_for_sending(self) -> None:
        """Send without reading the mailbox (a standby of a cluster: another instance holds the IMAP loop)."""
        self._open = True

    async def start(self, handler: InboundHandler, *, dead_letter: DeadLetterHandler | None = None) -> None:
        if self._task is not None:
            return
        self._handler = handler
        self._failed = FailedEvents(PLATFORM, dead_letter)
        self._report("starting", None)
        mailbox = Mailbox(self._login, self._deliver, keyword=self._keyword, idle=self._idle,
                          poll_seconds=self._poll_seconds, idle_seconds=self._idle_seconds, report=self._report,
                          backoff=self._reconnect_backoff)
        try:
            link = await mailbox.open()
        except ImapError as exc:
            self._report("failed", str(exc))
            raise AdapterError(f"email: {exc}") from exc
        except (OSError, asyncio.TimeoutError) as exc:
            self._report("failed", f"{type(exc).__name__}: {exc}")
            raise AdapterError(f"email: could not reach the IMAP server {self._login.host}:{self._login.port} "
                               f"({type(exc).__name__}: {exc}); check platforms.email.imap_host and imap_port") from exc
        self._mailbox = mailbox
        mailbox.adopt(link)
        self._open = True
        self._task = spawn(self._mailbox.run(), name=f"email:{self._login.username}:mailbox")
        self._report("connected", None)
        log.info("email adapter started: %s on %s:%d (%s)", self._login.mailbox, self._login.host, self._login.port,
                 "IDLE" if self._idle else f"polling every {self._poll_seconds:g}s")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._mailbox = None
        self._open = False
        self._health.state = "stopped"

    # -- inbound -------------------------------------------------------------------------

    async def _deliver(self, event_id: str, raw: bytes) -> bool:
        """Hand one mail to the gateway; True when it may be flagged taken (stored, skipped on purpose,
        or set aside as a dead letter)."""
        self._health.last_event_at = time.time()
        try:
            read = await asyncio.to_thread(read_mail, raw, event_id=event_id, rules=self._rules)
        except Exception as exc:  # a mail the parser chokes on: read again, set aside after the last attempt
            set_aside = await self._failed.give_up(event_id, {"event": event_id, "size": len(raw)}, None, exc)
            log.error("could not read email %s; %s", event_id,
                      "set aside as a dead letter" if set_aside else "it will be read again", exc_info=exc)
            self._health.last_error = f"could not read mail {event_id}: {type(exc).__name__}: {exc}"
            return set_aside
        if read.thread is not None:
            self._remember(read.thread)
        if read.message is None:
            log.info("email: not answering mail %s: %s", event_id, read.skipped)
            return True
        assert self._handler is not None
        try:
            await self._handler(read.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # delivered again, or set aside after the last attempt
            payload = {"event": event_id, "message_id": read.message.message_id, "from": read.message.user_id,
                       "subject": read.thread.subject if read.thread else ""}
            set_aside = await self._failed.give_up(event_id, payload, read.message, exc)
            log.error("the gateway failed on email %s from %s; %s", read.message.message_id, read.message.user_id,
                      "set aside as a dead letter" if set_aside else "it will be delivered again", exc_info=exc)
            self._health.last_error = f"handler failed on mail {event_id}: {type(exc).__name__}: {exc}"
            return set_aside
        self._failed.forget(event_id)
        return True

    def _remember(self, thread: Thread) -> None:
        self._threads[thread.message_id] = thread
        self._threads.move_to_end(thread.message_id)
        while len(self._threads) > THREADS_REMEMBERED:
            self._threads.popitem(last=False)

    # -- outbound ------------------------------------------------------------------------

    async def _thread_for(self, message_id: str) -> Thread | None:
        """The threading headers of the mail ``message_id``: remembered, else looked up in the mailbox."""
        known = self._threads.get(message_id)
        if known is not None:
            return known
        try:
            client = await self._login.open()
        except Exception as exc:  # noqa: BLE001 - the reply still goes, threaded by what the chat knows
            log.warning("email: could not look up %s in the mailbox (%s); the reply keeps its references only",
                        message_id, type(exc).__name__)
            return None
        try:
            found = await expect(client.uid_search("HEADER", "Message-ID", quote(message_id), charset=None), "SEARCH")
            uids = sorted(search_uids(found))
            if not uids:
                return None
            fields = "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID REFERENCES IN-REPLY-TO SUBJECT)])"
            response = await expect(client.uid("fetch", str(uids[-1]), fields), "FETCH")
            header = next((bytes(line) for line in response.lines if isinstance(line, bytearray)), b"")
            thread, _root = thread_of(parse_headers(header), "lookup")
            if thread.message_id != message_id:
                return None
            self._remember(thread)
            return thread
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("email: looking up %s failed (%s: %s)", message_id, type(exc).__name__, exc)
            return None
        finally:
            await close(client)

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None,
                   progress: SendProgress | None = None) -> Delivery:
        if not self._open:
            return Delivery(ok=False, error="email adapter is not running", retry_later=True)
        progress = progress if progress is not None else SendProgress()
        to, root = split_chat(chat.chat_id)
        if to is None:
            return Delivery(ok=False, error=f"email: {chat.chat_id!r} is not an address to reply to")
        parts = split_message(text, MESSAGE_LIMIT)
        if not parts:
            return Delivery(ok=False, error="nothing to send: the reply is empty")
        answering = reply_to if reply_to and reply_to.startswith("<") else root
        thread = await self._thread_for(answering) if answering else None
        if thread is None and answering:
            thread = Thread(message_id=answering, references=(root,) if root else (), subject="")
        for index, part in enumerate(parts):
            if index < progress.skip:
                continue  # confirmed before a restart
            mail = await asyncio.to_thread(compose_reply, part, sender=self._sender, sender_name=self._from_name,
                                           to=to, thread=thread)
            try:
                await self._smtp.send(mail, sender=self._sender, to=to)
            except Exception as exc:  # noqa: BLE001 - reported in the Delivery, never raised
                error = f"part {index + 1}/{len(parts)} not sent: {describe_smtp(exc)}"
                log.warning("email: the reply to %s was not sent: %s", to, error)
                return Delivery(ok=False, message_ids=tuple(progress.sent_ids), error=error)
            sent_id = str(mail["Message-ID"])
            self._remember(Thread(message_id=sent_id, references=thread.reply_references() if thread else (),
                                  subject=str(mail["Subject"])))
            await progress.confirmed(sent_id, last=index == len(parts) - 1)
        return Delivery(ok=True, message_ids=tuple(progress.sent_ids))

    async def send_typing(self, chat: ChatRef) -> None:
        """Email has no typing indicator."""
