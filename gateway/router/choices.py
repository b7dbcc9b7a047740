"""A chat's choices: ``/stream``, ``/model`` and ``/voice``, kept in the store, read once per lane.

Clustered, where another instance may change them, a choice is read again when older than
``settings.prefs_fresh_for`` seconds.  A chat turn's lane reads those it would read again
(:meth:`ChatChoices.to_read`) with the turn's context, in the same store call (:meth:`ChatChoices.learned`).
"""

from __future__ import annotations

import time

from gateway.types import InboundMessage
from state import TurnContext

from .lanes import Lane
from .shared import RouterState

CHOICES = ("model", "stream", "voice")  # what a chat turn may read: its model, whether it streams, is spoken


class ChatChoices:
    """The chat's ``/stream``, ``/model`` and ``/voice`` preferences, cached in its lane."""

    def __init__(self, shared: RouterState) -> None:
        self._shared = shared

    def _stale(self, read_at: float | None, ahead: float = 0.0) -> bool:
        """Whether a chat choice read at ``read_at`` (monotonic; None: never) must be read again (``ahead``:
        ``ahead`` seconds from now): never read, or (clustered, where another instance may change it) read
        over ``settings.prefs_fresh_for`` seconds before."""
        fresh_for = self._shared.settings.prefs_fresh_for
        return read_at is None or (fresh_for is not None and time.monotonic() + ahead - read_at > fresh_for)

    async def choice(self, lane: Lane, name: str) -> str | None:
        """The chat's choice ``name`` (``stream``, ``model``, ``voice``) as stored, None when it made none;
        read once per lane (clustered: again when older than ``settings.prefs_fresh_for``)."""
        cached = lane.choices.get(name)
        if self._stale(cached[1] if cached is not None else None):
            value = await self._shared.db.prefs.get(lane.key, name)
            lane.choices[name] = (value, time.monotonic())
            return value
        assert cached is not None
        return cached[0]

    def to_read(self, lane: Lane, *, model: bool = True, stream: bool = True, voice: bool = True,
                ahead: float = 0.0) -> tuple[str, ...]:
        """The :data:`CHOICES` whose lane copy :meth:`choice` would read again now (``ahead``: ``ahead``
        seconds from now), of those a turn uses (``model``: False when the request named its model;
        ``stream``, ``voice``: False where the platform does not stream, a reply cannot be spoken)."""
        used = {"model": model, "stream": stream, "voice": voice}
        return tuple(name for name in CHOICES
                     if used[name] and self._stale(lane.choices.get(name, (None, None))[1], ahead))

    def learned(self, lane: Lane, context: TurnContext, read_at: float) -> None:
        """The choices ``context`` read (the chat's: its lane's key) as the lane's copy, read at ``read_at``
        (monotonic, when the read was sent: never fresher than it is)."""
        asked = context.asked
        if asked is not None and asked.prefs is not None and asked.prefs[0] == lane.key:
            for name, value in context.prefs or ():
                lane.choices[name] = (value, read_at)

    async def remember(self, lane: Lane, name: str, value: str) -> None:
        """The chat's ``/<name> <value>``: remembered in the store, used from its next turn or reply."""
        await self._shared.db.prefs.set(lane.key, name, value, now=self._shared.clock())
        lane.choices[name] = (value, time.monotonic())

    async def chat_model(self, lane: Lane, msg: InboundMessage) -> str:
        """The model this chat's turn for ``msg`` starts on: its /model choice while the sender may still use
        it, else ``default``."""
        return self._allowed(lane, msg, await self.choice(lane, "model"))

    def known_model(self, lane: Lane, msg: InboundMessage) -> str | None:
        """:meth:`chat_model` from the lane's copy of the choice; None when that is stale (or was never read):
        then a turn reads the choice with its context and gives it to :meth:`model_of`."""
        cached = lane.choices.get("model")
        if cached is None or self._stale(cached[1]):
            return None
        return self._allowed(lane, msg, cached[0])

    def model_of(self, lane: Lane, msg: InboundMessage, choice: str | None) -> str:
        """:meth:`chat_model` for the choice as just read from the store (kept as the lane's copy)."""
        lane.choices["model"] = (choice, time.monotonic())
        return self._allowed(lane, msg, choice)

    def _allowed(self, lane: Lane, msg: InboundMessage, choice: str | None) -> str:
        if choice and self._shared.settings.models.allowed(choice, msg.platform, msg.user_id, lane.key):
            return choice
        return "default"
