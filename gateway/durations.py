"""Durations as an operator writes them (``30m``, ``2 hours``, ``1d``), and how long ago a moment was."""

from __future__ import annotations

import re
import time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hr|hrs|hours?|d|days?)\s*$", re.I)


def parse_duration(text: str) -> float:
    """``45m`` -> 2700.0; raises ValueError naming the accepted units."""
    m = _DURATION.match(str(text))
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: write a positive number and a unit, like 30m, 2h or 1d")
    return float(int(m.group(1)) * _UNITS[m.group(2)[0].lower()])


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def time_ago(ts: float | None, now: float | None = None, *, never: str = "-") -> str:
    """``just now``, ``5 min ago``, ``3 h ago``, ``2 d ago``; ``never`` for no time at all."""
    if not ts:
        return never
    delta = max(0.0, (time.time() if now is None else now) - ts)
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    return f"{int(delta // 86400)} d ago"
