"""The platforms' adapters in a running daemon: started, restarted, opened for sending, stopped.

    platforms = PlatformSupervisor(router.take, gateway.on_dead_letter)
    platforms.run("telegram", adapter)             # started in the background, retried until it connects
    adapter = await platforms.ready("telegram", 30)  # what a reply waits for while it connects
    platforms.open_for_sending("discord", adapter)   # a cluster standby: sends, does not receive
    await platforms.remove("telegram")              # a reload restarts it: stopped, forgotten
    await platforms.stop(keep=...)                  # shutdown, in reverse order of starting

An adapter that fails to start (bad token, unreachable server), or a standby
that fails to open for sending, is logged with the reason and run again through
:func:`gateway.retry.supervise` while the others serve; :attr:`start_errors`
holds the last reason for ``/healthz``.  A platform that refuses the token
(:class:`~gateway.errors.TokenRejected`: Telegram's 401, Discord's 4004, Slack's
``invalid_auth``) is not retried: it shows ``failed: the token was rejected``
until a reload starts it again (:attr:`rejected`).  Where a platform's connection is owned
by one instance of a cluster, :class:`gateway.runtime.cluster.OwnedConnection`
decides when it runs and calls :meth:`start_owned` and :meth:`stop_owned`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Container

from gateway.errors import TokenRejected
from gateway.retry import Backoff, supervise
from gateway.tasks import spawn
from gateway.types import (
    Adapter,
    Button,
    ButtonOutput,
    ChatRef,
    DeadLetterHandler,
    Delivery,
    InboundHandler,
    ReceiptHandler,
    ReportsReceipts,
    SendingOnly,
    SendProgress,
    VoiceOutput,
)

log = logging.getLogger(__name__)

ADAPTER_BACKOFF = Backoff(base=1.0, cap=60.0)  # an adapter that fails to start or to open for sending
# A reply due while its platform is still connecting (resumed at start, or during a reload's
# restart of that adapter) waits this long for it before the adapter is asked anyway.
SEND_WAITS_FOR_CONNECTION_SECONDS = 30.0


class PlatformSupervisor:
    """Runs each platform's adapter, restarts it after a failed start, and stops it."""

    def __init__(self, handler: InboundHandler, dead_letter: DeadLetterHandler, *,
                 backoff: Backoff = ADAPTER_BACKOFF, named: Callable[[str], str] = str,
                 receipts: ReceiptHandler | None = None):
        self._handler = handler
        self._dead_letter = dead_letter
        self._receipts = receipts  # where an adapter that reports receipts (ReportsReceipts) hands them
        self._backoff = backoff
        self._named = named  # a config key as errors name it: with the variable that set it (Config.named)
        self.adapters: dict[str, Adapter] = {}  # the platforms whose adapter runs (or stands by) here
        self.start_errors: dict[str, str] = {}  # why a platform's last start failed, until one succeeds
        self.rejected: dict[str, TokenRejected] = {}  # platforms that refused their token: not retried
        self._first_try: dict[str, asyncio.Event] = {}  # set once a platform's first start has succeeded or failed
        self._connected: dict[str, asyncio.Event] = {}  # set once a platform's adapter has started
        self._starting: dict[str, asyncio.Task] = {}
        self._sending_only: dict[str, asyncio.Task] = {}  # standbys: adapters opened to send, not to receive

    def add(self, name: str, adapter: Adapter) -> None:
        """Hold ``adapter`` for ``name``, not yet connected (replies due meanwhile wait for it)."""
        self.adapters[name] = adapter
        if self._receipts is not None and isinstance(adapter, ReportsReceipts):
            adapter.report_receipts(self._receipts)
        self._connected[name] = asyncio.Event()
        self._first_try[name] = asyncio.Event()
        self.rejected.pop(name, None)

    def run(self, name: str) -> None:
        """Start ``name``'s adapter in the background, again after each failure, until it connects."""
        adapter = self.adapters[name]

        first_try = self._first_try.setdefault(name, asyncio.Event())

        async def start() -> None:
            try:
                await adapter.start(self._handler, dead_letter=self._dead_letter)
            except TokenRejected as exc:  # retrying cannot help: given up until a reload
                self.rejected[name] = exc
                self.start_errors[name] = f"{TokenRejected.SUMMARY}: {exc.help}"
                log.error("platform %s failed: %s (%s); %s (not retried until a reload)", name,
                          TokenRejected.SUMMARY, self._named(exc.key), exc.help)
                first_try.set()
                return
            self._connected[name].set()
            self.start_errors.pop(name, None)
            first_try.set()
            log.info("platform %s connected", name)  # from here the adapter keeps its own connection alive

        def failed(failures: int, exc: Exception, wait: float) -> None:  # one platform's failure never stops the others
            self.start_errors[name] = str(exc)
            first_try.set()
            log.error("platform %s failed to start: %s; retrying in %.0fs", name, exc, wait)

        self._starting[name] = spawn(supervise(start, name=f"adapter:{name}", backoff=self._backoff,
                                               on_failure=failed), name=f"adapter:{name}")

    async def first_tries(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every platform's first start has connected or failed:
        what the daemon's "serving" line then says of each."""
        waits = [asyncio.ensure_future(e.wait()) for name, e in self._first_try.items()
                 if not e.is_set() and name in self._starting and not self._starting[name].done()]
        if waits:
            _done, pending = await asyncio.wait(waits, timeout=timeout)
            for w in pending:
                w.cancel()

    def state(self, name: str) -> str:
        """One platform's state in words, as the serving line, ``/healthz``'s detail and the dashboard say it:
        ``connected``, ``starting``, ``failed: the token was rejected``, ``failed: <why>; retrying``."""
        if name in self.rejected:
            return f"failed: {TokenRejected.SUMMARY}"
        if name in self.start_errors:
            return f"failed: {self.start_errors[name]}; retrying"
        connected = self._connected.get(name)
        return "connected" if connected is not None and connected.is_set() else "starting"

    def open_for_sending(self, name: str) -> None:
        """While another instance owns ``name``'s connection, this one still sends the replies of the turns
        it runs: the adapter is opened for sending only (retried with backoff until it is)."""
        adapter = self.adapters[name]
        assert isinstance(adapter, SendingOnly)

        async def open_it() -> None:
            await adapter.open_for_sending()
            self._connected[name].set()

        def failed(failures: int, exc: Exception, wait: float) -> None:  # /healthz shows the platform meanwhile
            log.error("platform %s could not be opened for sending: %s; retrying in %.0fs", name, exc, wait)

        previous = self._sending_only.get(name)
        if previous is None or previous.done():
            self._sending_only[name] = spawn(
                supervise(open_it, name=f"adapter-send:{name}", backoff=self._backoff, on_failure=failed),
                name=f"adapter-send:{name}")

    def sending_only(self, name: str) -> bool:
        """Whether ``name``'s adapter was opened for sending only here (a standby)."""
        return name in self._sending_only

    async def start_owned(self, name: str) -> None:
        """Start ``name``'s adapter once, now that this instance owns its connection; a failure is
        recorded for ``/healthz`` and raised (the owner gives the connection up for a while)."""
        try:
            await self.adapters[name].start(self._handler, dead_letter=self._dead_letter)
        except Exception as exc:
            self.start_errors[name] = str(exc)
            raise
        self.start_errors.pop(name, None)
        self._connected[name].set()

    async def stop_owned(self, name: str) -> None:
        """Stop ``name``'s adapter, whose connection this instance no longer owns."""
        self._connected[name] = asyncio.Event()  # replies due meanwhile wait (then stay pending)
        await self.adapters[name].stop()

    async def ready(self, name: str, timeout: float) -> Adapter | None:
        """``name``'s adapter, once it has connected or after ``timeout`` seconds; None if none runs here."""
        connected = self._connected.get(name)
        if connected is not None and not connected.is_set():
            try:
                await asyncio.wait_for(connected.wait(), timeout)
            except asyncio.TimeoutError:
                pass  # the adapter says why it cannot send; a recorded reply stays pending
        return self.adapters.get(name)

    # -- the outbox's senders: the platform's current adapter, once it has connected --------
    async def send(self, name: str, chat: ChatRef, text: str, reply_to: str | None,
                   progress: SendProgress | None) -> Delivery:
        """Send ``text`` through ``name``'s current adapter, once it has connected (a reply resumed at
        start, or due while a reload restarts the adapter, waits for it)."""
        adapter = await self.ready(name, SEND_WAITS_FOR_CONNECTION_SECONDS)
        if adapter is None:
            return Delivery(ok=False, error=f"platform {name} is not running", retry_later=True)
        return await adapter.send(chat, text, reply_to=reply_to, progress=progress)

    async def send_buttons(self, name: str, chat: ChatRef, text: str, buttons: tuple[Button, ...],
                           reply_to: str | None) -> Delivery:
        """A message with buttons (an approval request) through ``name``'s current adapter."""
        adapter = await self.ready(name, SEND_WAITS_FOR_CONNECTION_SECONDS)
        if not isinstance(adapter, ButtonOutput):
            return Delivery(ok=False, error=f"platform {name} is not running", retry_later=True)
        return await adapter.send_buttons(chat, text, buttons, reply_to=reply_to)

    async def send_voice(self, name: str, chat: ChatRef, audio: bytes, reply_to: str | None) -> Delivery:
        """A voice message (a spoken reply) through ``name``'s current adapter."""
        adapter = await self.ready(name, SEND_WAITS_FOR_CONNECTION_SECONDS)
        if not isinstance(adapter, VoiceOutput):
            return Delivery(ok=False, error=f"platform {name} is not running")
        return await adapter.send_voice(chat, audio, reply_to=reply_to)

    def forget_start(self, name: str) -> None:
        """Stop trying to start ``name``'s adapter (a reload is about to replace it)."""
        task = self._starting.pop(name, None)
        if task is not None:
            task.cancel()

    async def remove(self, name: str) -> None:
        """Stop ``name``'s adapter and forget it; replies due meanwhile wait for the next one."""
        adapter = self.adapters.pop(name, None)
        self.start_errors.pop(name, None)
        self.rejected.pop(name, None)
        self._connected[name] = asyncio.Event()
        if adapter is not None:
            try:
                await adapter.stop()
            except Exception:  # the new one starts anyway
                log.exception("platform %s did not stop cleanly", name)

    def cancel(self) -> None:
        """Stop every start and every opening for sending still being retried."""
        for task in [*self._starting.values(), *self._sending_only.values()]:
            task.cancel()

    async def stop(self, *, skip: Container[str] = ()) -> None:
        """Stop every adapter but those in ``skip``, in reverse order of starting; one failing does not
        keep the rest open."""
        for name, adapter in reversed(list(self.adapters.items())):
            if name in skip:
                continue
            try:
                await adapter.stop()
            except Exception:  # keep closing the rest
                log.exception("platform %s did not stop cleanly", name)
