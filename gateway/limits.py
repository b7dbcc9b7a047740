"""Inbound rate limits: ``limits.messages_per_minute`` per user (and per chat).

A :class:`MessageLimit` is a sliding window of the messages the gateway answered in the last minute,
one per key (``user:<platform>:<user_id>``, ``chat:<session key>``).  The router asks it before a turn
runs: :meth:`MessageLimit.wait` says how long until a key has room (0: now); a turn that runs
counts its batch (:meth:`MessageLimit.count`), and a message held back is answered, and counted, by the next
turn that runs.  :meth:`MessageLimit.first_refusal` says whether the user was told already in
this window, so a burst gets one "try again" line, not one per message.

Per identity: a user's linked identities (gateway/memory/identity.py) are counted apart.  In memory,
per instance: instances sharing a PostgreSQL store each keep their own window, and a restart forgets it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

WINDOW_SECONDS = 60.0


class MessageLimit:
    """At most ``per_minute`` messages answered per key in any 60 seconds (``clock`` in seconds)."""

    def __init__(self, per_minute: int, clock: Callable[[], float]):
        if per_minute < 1:
            raise ValueError("limits.messages_per_minute must be at least 1 (leave it empty for no limit)")
        self.per_minute = per_minute
        self.clock = clock
        self._seen: dict[str, deque[float]] = {}
        self._told_until: dict[str, float] = {}

    def _window(self, key: str, now: float) -> deque[float]:
        seen = self._seen.setdefault(key, deque())
        while seen and seen[0] <= now - WINDOW_SECONDS:
            seen.popleft()
        return seen

    def wait(self, key: str) -> float:
        """Seconds until ``key`` has room for one more message (0: it has room now)."""
        now = self.clock()
        seen = self._window(key, now)
        if len(seen) < self.per_minute:
            return 0.0
        # room once the oldest messages that keep the window full have left it
        return seen[len(seen) - self.per_minute] + WINDOW_SECONDS - now

    def count(self, key: str, messages: int) -> None:
        """Count ``messages`` answered now under ``key``; the next refusal is told to the user again."""
        self._window(key, self.clock()).extend([self.clock()] * messages)
        self._told_until.pop(key, None)

    def first_refusal(self, key: str, wait: float) -> bool:
        """Whether this refusal is the first since ``key`` was last answered (then the user is told once)."""
        now = self.clock()
        if self._told_until.get(key, 0.0) > now:
            return False
        self._told_until[key] = now + wait
        return True

    def forget_idle(self) -> None:
        """Drop the windows that emptied, so keys of users gone quiet do not pile up."""
        now = self.clock()
        for key in [k for k in self._seen if not self._window(k, now)]:
            del self._seen[key]
        for key in [k for k, until in self._told_until.items() if until <= now]:
            del self._told_until[key]


def try_again_line(wait: float) -> str:
    """What the user reads when a message is held back."""
    seconds = max(1, math.ceil(wait))
    when = f"{seconds} seconds" if seconds != 1 else "1 second"
    return (f"You are sending messages faster than this gateway answers them. Your messages are saved; "
            f"try again in {when}, and the next one will answer them.")
