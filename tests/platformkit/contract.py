"""The contract a platform's fake implements for the conformance kit (tests/test_platform_kit.py).

A platform's fake is its test server (tests/fakes/telegram.py: the real client library talks to it
on 127.0.0.1) wrapped in a :class:`FakePlatform`: the kit drives it only through these methods, as
the platform's users would, and reads back only what the chats show.  The people are the kit's
own names, mapped by each fake to its platform's users::

    ann, bob   allowed (the kit puts user_id("ann") and user_id("bob") in auth.allowed_users)
    eve        a stranger

Every inbound method delivers one event and returns a :class:`Sent`: the chat it was written in
(an opaque handle :meth:`FakePlatform.shown` understands), the session key the gateway must file
it under, and the platform's own event (for :meth:`FakePlatform.redeliver` and
:meth:`FakePlatform.edit`).

Faults are scripted before the event that meets them: :meth:`FakePlatform.fail_sends` (a 429 with
its retry-after, or a 5xx, on the next sends), :meth:`FakePlatform.slow_sends` (the next sends
answered late), :meth:`FakePlatform.drop_connection` (the platform cuts the connection),
:meth:`FakePlatform.redeliver` (a duplicate), :meth:`FakePlatform.out_of_order` (two messages
delivered in the reverse of the order written) and :meth:`FakePlatform.malformed` (events no
adapter may choke on).

A capability the platform lacks (``PlatformConfig.CAPABILITIES``) needs no method: the kit reports
the check as not applicable before calling it, so the default raises :class:`NotApplicable`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.types import Capabilities

__all__ = ["FakePlatform", "NotApplicable", "Sent", "USERS"]

USERS = ("ann", "bob", "eve")


class NotApplicable(Exception):
    """The platform cannot do what the check needs (the message names the capability)."""


@dataclass(frozen=True)
class Sent:
    """One inbound event the fake delivered."""

    chat: str  # where the bot's answer shows (FakePlatform.shown reads it)
    key: str  # the session key the gateway must file the message under
    event: Any = None  # the platform's own payload, for redeliver() and edit()
    extra: dict = field(default_factory=dict)


class FakePlatform(abc.ABC):
    """One platform's fake, as the kit drives it (an async context manager)."""

    #: the platform's name: its ``switchboard.adapter_configs`` entry point
    name: ClassVar[str]
    #: the gateway must serve its local API (a platform whose endpoint lives there, like webhooks)
    serve_api: ClassVar[bool] = False
    #: an event the killed daemon had not acknowledged comes again (crashkit.Side.redelivers)
    redelivers: ClassVar[bool] = True

    @property
    def capabilities(self) -> Capabilities:
        from gateway.config import platform_models

        return platform_models()[self.name].CAPABILITIES

    # -- lifecycle -------------------------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the fake server (127.0.0.1, port 0)."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    async def __aenter__(self) -> "FakePlatform":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @abc.abstractmethod
    def settings(self) -> dict:
        """The ``platforms.<name>`` section that points the real adapter at this fake."""

    @abc.abstractmethod
    def user_id(self, who: str) -> str:
        """The id ``auth.allowed_users`` names ``who`` by (without the platform prefix)."""

    async def ready(self, gateway) -> None:
        """Until the adapter listens (default: ``/healthz`` says connected)."""
        from tests.waiting import eventually

        await eventually(lambda: gateway.health()["platforms"][self.name]["state"] == "connected", 15,
                         f"{self.name} connected")

    def attach(self, gateway) -> None:
        """Told the running gateway (a fake that posts to the gateway's own endpoint needs its address)."""
        return None

    # -- inbound ---------------------------------------------------------------------------

    @abc.abstractmethod
    async def dm(self, who: str, text: str) -> Sent:
        """``who`` writes ``text`` to the bot directly."""

    async def group(self, who: str, text: str) -> Sent:
        """``who`` writes ``text`` in the shared group, mentioning the bot."""
        raise NotApplicable(f"{self.name} has no groups (capability groups=False)")

    async def thread(self, who: str, text: str) -> Sent:
        """``who`` writes ``text`` in a thread (or topic) of the group; the same thread every time."""
        raise NotApplicable(f"{self.name} has no threads (capability threads=False)")

    async def edit(self, sent: Sent, text: str) -> None:
        """The author of ``sent`` changes it to ``text``."""
        raise NotApplicable(f"{self.name} cannot edit a message")

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        """``who`` sends a file with ``text`` in a DM."""
        raise NotApplicable(f"{self.name} receives no files (capability files=False)")

    async def press(self, who: str, chat: str, command: str) -> None:
        """``who`` presses the button, under the bot's latest message in ``chat`` that has it, whose
        command is ``command`` (``/approve 3f9a1c07``)."""
        raise NotApplicable(f"{self.name} has no buttons (capability buttons=False)")

    @abc.abstractmethod
    async def redeliver(self, sent: Sent) -> None:
        """The platform delivers ``sent`` again (a retry, a redelivery after a reconnect)."""

    @abc.abstractmethod
    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        """Two DMs from ``who``, written in this order and delivered in the other."""

    @abc.abstractmethod
    async def malformed(self) -> int:
        """Deliver events no adapter may choke on (missing fields, wrong types, garbage); how many."""

    # -- what the chats show ---------------------------------------------------------------

    @abc.abstractmethod
    def shown(self, chat: str) -> list[str]:
        """The text of each message the bot has in ``chat`` now, in order, as a user sees it (edits applied)."""

    def buttons(self, chat: str) -> list[str]:
        """The commands of the buttons under the bot's messages in ``chat``, in order."""
        return []

    @abc.abstractmethod
    def send_times(self, chat: str) -> list[float]:
        """``time.monotonic()`` of every send and edit the platform accepted into ``chat``."""

    @abc.abstractmethod
    def edits(self, chat: str) -> int:
        """How many edits the platform accepted in ``chat``."""

    # -- faults ----------------------------------------------------------------------------

    @abc.abstractmethod
    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        """Refuse the next ``times`` message sends with HTTP ``status`` (a 429 says ``retry_after``)."""

    @abc.abstractmethod
    def slow_sends(self, seconds: float, times: int = 1) -> None:
        """Answer the next ``times`` message sends only after ``seconds``."""

    @abc.abstractmethod
    async def drop_connection(self) -> None:
        """Cut the adapter's connection (events then wait for, or are lost until, the reconnect)."""

    # -- kill -9 ---------------------------------------------------------------------------

    @abc.abstractmethod
    def crash_side(self):
        """A ``tests.crashkit.Side`` for this fake: the kill test runs the daemon as a process."""

    def chaos_plan(self, seed: int):
        """The kill test's load (``tests.crashkit.Plan``): one kill while 4 chats write 10 messages a second,
        at a moment a turn is running; ``kill_on_send`` instead freezes the daemon at the moment and kills
        it once one more event reached it unacknowledged (for a platform that redelivers those)."""
        from tests.crashkit import Plan

        return Plan(kills=1, rate=10, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)
