"""Durations as an operator writes them: ``30m``, ``2 hours``, ``1d``."""

from __future__ import annotations

import re

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
