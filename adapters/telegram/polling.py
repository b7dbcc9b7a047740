"""Long polling that acknowledges an update only after the gateway stored it.

PTB's ``Updater`` advances the offset as soon as it fetched a batch; here the
loop awaits ``deliver(update)`` for every update of a batch (different chats
at once, one chat's updates in order) and moves the offset past the leading
updates that returned True.  When delivery fails, the next ``getUpdates``
starts at the first update not stored, so Telegram hands it over again; after
the last allowed attempt ``deliver`` sets the update aside as a dead letter and
returns True, so one bad update never holds the offset.

An update python-telegram-bot cannot read (a field missing that it requires, a type it does not
expect: Telegram adds fields, and a proxy or a fake can send anything) makes ``get_updates`` fail
for the whole batch, and so for every poll after it: the bot would answer nobody again.  Then the
batch is fetched once more raw (``Bot.do_api_request``, which warns that ``get_updates`` exists: it
is the only public way to the raw JSON), each update read on its own, and one that cannot be read
handed to ``unreadable`` (the adapter sets it aside as a dead letter), so the offset moves past it.

409 Conflict (another process polls the same token, or a webhook is set),
network errors and flood waits are logged, shown in health and retried with
backoff: the loop itself never ends on an error.

With several instances on one store, only the instance that owns the bot's
poller polls, and ``may_poll`` (the owner's remaining trust) is asked before
every ``getUpdates``: no poll starts without it, and none may outlast it, so
a new owner, who waits out an old owner's trust before its first poll, never
overlaps the old owner's last one (Telegram would answer one of them 409).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, RetryAfter, TelegramError

from gateway.retry import Backoff
from gateway.types import PollGate

from .redact import retry_after_seconds

log = logging.getLogger(__name__)

ALLOWED_UPDATES = ("message", "channel_post", "callback_query")  # callback_query: a press of our buttons
# A gated long poll ends this long before the gate's allowance runs out (the request's own round trip).
GATE_MARGIN_SECONDS = 1.0
GATE_RECHECK_SECONDS = 0.2  # how soon a poll the gate did not allow is asked for again
# A long poll ends on Telegram's side this long after its timeout at most: it reaches Telegram, and its
# timeout starts there, up to a round trip after it was sent (the margin the gate keeps, above).
POLL_END_SLACK_SECONDS = GATE_MARGIN_SECONDS
CONFLICT_HINT = (
    "Telegram answered 409 Conflict: another process is polling this bot token (or a webhook is set). "
    "Stop the other bot instance or give this one its own token"
)


# What python-telegram-bot raises when it cannot read an update (its network and API errors are
# TelegramError, which are none of these).
UNREADABLE = (TypeError, KeyError, ValueError, AttributeError)


class _SetAside:
    """An unreadable update already set aside, holding its place in a batch (delivered: True at once)."""

    def __init__(self, update_id: int):
        self.update_id = update_id
        self.effective_chat = None
        self.callback_query = None


class Poller:
    """Fetches updates and hands them to ``deliver``, in order within each chat."""

    def __init__(
        self,
        bot: Bot,
        deliver: Callable[[Update], Awaitable[bool]],
        *,
        report: Callable[[str, str | None], None],
        poll_timeout: int,
        backoff: Backoff,
        may_poll: PollGate | None = None,
        unreadable: Callable[[dict, Exception], Awaitable[bool]] | None = None,
    ):
        self._bot = bot
        self._deliver = deliver
        self._unreadable = unreadable  # (raw update, why) -> True once set aside
        self._report = report  # (state, error) -> None
        self._poll_timeout = poll_timeout
        self._backoff = backoff
        self._may_poll = may_poll
        self._poll_ends_at = 0.0  # monotonic: when Telegram ends the long poll last sent, even if we gave up on it
        self.offset = 0
        self.last_beat = time.monotonic()
        self.busy = False  # inside deliver(): time spent there is not a stall
        self._handler_failures = 0  # consecutive: the wait before a redelivery grows with it

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    async def run(self) -> None:
        failures = 0
        while True:
            timeout = self._allowed_timeout()
            if timeout is None:
                await asyncio.sleep(GATE_RECHECK_SECONDS)
                continue
            self._poll_ends_at = time.monotonic() + timeout + POLL_END_SLACK_SECONDS
            try:
                updates = await self._bot.get_updates(
                    offset=self.offset or None,
                    timeout=timeout,
                    allowed_updates=list(ALLOWED_UPDATES),
                )
            except asyncio.CancelledError:
                raise
            except UNREADABLE as exc:  # the library could not read an update of the batch
                updates = await self._read_one_by_one(exc)
                if updates is None:
                    wait = self._backoff.delay(failures)
                    failures += 1
                    self._on_poll_error(exc, wait)
                    await asyncio.sleep(wait)
                    continue
            except Exception as exc:  # noqa: BLE001 - every error is reported and retried
                wait = self._backoff.delay(failures)
                failures += 1
                self._on_poll_error(exc, wait)
                await asyncio.sleep(max(wait, retry_after_seconds(exc) or 0.0))
                continue
            self.beat()
            if failures:
                log.info("telegram polling is back after %d failed attempt(s)", failures)
                failures = 0
            self._report("connected", None)
            if not updates:
                continue
            self.busy = True
            try:
                delivered = await self._deliver_batch(updates)
            finally:
                self.busy = False
                self.beat()
            if delivered < len(updates):
                # Not acknowledged: the next getUpdates starts at the first update not stored.
                await asyncio.sleep(self._backoff.delay(self._handler_failures))
                self._handler_failures += 1
            else:
                self._handler_failures = 0

    async def _read_one_by_one(self, why: Exception) -> list[Update] | None:
        """The batch fetched again raw and read update by update; the unreadable ones are set aside and
        the offset moves past them.  None when even that failed (the poll is retried with backoff)."""
        if self._unreadable is None:
            return None
        try:
            raw = await self._bot.do_api_request(
                "getUpdates", api_kwargs={"offset": self.offset or None, "timeout": 0,
                                          "allowed_updates": list(ALLOWED_UPDATES)})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported and retried like any failed poll
            log.warning("telegram: could not fetch the batch again raw (%s: %s)", type(exc).__name__, exc)
            return None
        readable: list[Update] = []
        for item in raw if isinstance(raw, list) else []:
            try:
                readable.append(Update.de_json(item, self._bot))
            except UNREADABLE as exc:
                if not await self._unreadable(item if isinstance(item, dict) else {"raw": repr(item)}, exc):
                    return None
                update_id = item.get("update_id") if isinstance(item, dict) else None
                if isinstance(update_id, int) and not readable:  # nothing before it waits: move past it now
                    self.offset = max(self.offset, update_id + 1)
                elif isinstance(update_id, int):
                    readable.append(_SetAside(update_id))  # type: ignore[arg-type]
        log.info("telegram: read a batch update by update after %s: %s", type(why).__name__, why)
        return readable

    def _allowed_timeout(self) -> int | None:
        """The long-poll timeout for the next getUpdates; None: the gate allows no poll now."""
        if self._may_poll is None:
            return self._poll_timeout
        allowed = self._may_poll() - GATE_MARGIN_SECONDS
        if allowed < 0:
            self.beat()  # waiting for the gate is not a stall
            return None
        return min(self._poll_timeout, int(allowed))

    async def _deliver_batch(self, updates: list[Update]) -> int:
        """Deliver a batch: chats at once, each chat's updates in order; returns how many
        leading updates were all stored (the offset moves past those only).

        An update stored after an earlier one failed is fetched again with it and
        recognised as a duplicate by the gateway, so nothing is answered twice.
        """
        stored = [False] * len(updates)
        chats: dict[object, list[int]] = {}
        for index, update in enumerate(updates):
            chat = update.effective_chat
            chats.setdefault(chat.id if chat is not None else ("update", update.update_id), []).append(index)

        leading = 0

        async def in_order(indexes: list[int]) -> None:
            nonlocal leading
            for index in indexes:
                if not isinstance(updates[index], _SetAside) and not await self._deliver(updates[index]):
                    return  # later updates of this chat wait for the redelivery, to keep its order
                stored[index] = True
                while leading < len(updates) and stored[leading]:
                    leading += 1
                    self.offset = updates[leading - 1].update_id + 1  # stop() confirms what is stored

        await asyncio.gather(*(in_order(indexes) for indexes in chats.values()))
        return leading

    def _on_poll_error(self, exc: BaseException, wait: float) -> None:
        if isinstance(exc, Conflict):
            log.error("%s; retrying in %.1fs (%s)", CONFLICT_HINT, wait, exc)
            self._report("reconnecting", f"{CONFLICT_HINT} ({exc})")
        elif isinstance(exc, InvalidToken):
            log.error("Telegram rejected the bot token while polling; check platforms.telegram.token (retrying in %.1fs)", wait)
            self._report("failed", "Telegram rejected the bot token (401/404): check platforms.telegram.token")
        elif isinstance(exc, RetryAfter):
            log.warning("Telegram asked to slow down polling: %s", exc)
            self._report("reconnecting", str(exc))
        elif isinstance(exc, TelegramError):
            log.warning("telegram polling failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, wait)
            self._report("reconnecting", f"{type(exc).__name__}: {exc}")
        else:
            log.exception("unexpected error while polling telegram; retrying in %.1fs", wait)
            self._report("reconnecting", f"{type(exc).__name__}: {exc}")

    async def confirm(self) -> None:
        """Tell Telegram which updates are stored, so a restart does not fetch them again (best effort)."""
        if not self.offset:
            return
        if self._may_poll is not None and self._allowed_timeout() is not None:
            # The poll cancelled at stop still runs on Telegram's side: wait it out (it is short when
            # gated), or Telegram would see two getUpdates at once.
            await asyncio.sleep(max(0.0, self._poll_ends_at - time.monotonic()))
        if self._allowed_timeout() is None:
            log.info("not confirming the telegram offset: this instance no longer owns the bot's poller "
                     "(the new owner fetches the unconfirmed updates again; they are deduplicated)")
            return
        try:
            await self._bot.get_updates(offset=self.offset, timeout=0, limit=1, read_timeout=3, connect_timeout=3)
        except Exception as exc:  # noqa: BLE001 - a redelivery after restart is harmless (deduplicated)
            log.debug("could not confirm the telegram offset on stop: %s", type(exc).__name__)
