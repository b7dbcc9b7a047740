"""A cron job's schedule in words, with the timezone it runs in: ``0 9 * * *`` is shown as
"every day at 09:00 (Europe/Paris)".

Only the common shapes are put into words (a time every day, on weekdays, on some weekdays, on a
day of the month; every N minutes or hours); anything else is the cron text with its timezone.
The raw text is always shown next to it by the templates.
"""

from __future__ import annotations

import re

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_ABBREVIATIONS = {name[:3].lower(): i for i, name in enumerate(_DAYS)}
_NUMBER = re.compile(r"^\d{1,2}$")


def readable_schedule(text: str, tz_name: str) -> str:
    """``text`` (a stored schedule) in words, followed by ``(tz_name)`` where the time of day matters."""
    text = text.strip()
    if text.startswith("every "):
        return text  # an interval: the same in every timezone
    fields = text.split()
    if len(fields) != 5:  # a one-shot ISO time
        return f"once at {text.replace('T', ' ')} ({tz_name})"
    words = _cron_words(*fields)
    return f"{words or 'cron ' + text} ({tz_name})"


def _cron_words(minute: str, hour: str, day: str, month: str, weekday: str) -> str | None:
    if month != "*":
        return None
    if hour == "*" and day == "*" and weekday == "*":
        if minute.startswith("*/") and minute[2:].isdigit():
            return f"every {int(minute[2:])} minutes"
        if _NUMBER.match(minute):
            return f"every hour at :{int(minute):02d}"
        return None
    if not _NUMBER.match(minute):
        return None
    if hour.startswith("*/") and hour[2:].isdigit() and day == "*" and weekday == "*":
        return f"every {int(hour[2:])} hours at :{int(minute):02d}"
    hours = hour.split(",")
    if not all(_NUMBER.match(h) and int(h) < 24 for h in hours):
        return None
    at = " and ".join(f"{int(h):02d}:{int(minute):02d}" for h in hours)
    if day == "*" and weekday == "*":
        return f"every day at {at}"
    if day == "*":
        days = _weekdays(weekday)
        if days is None:
            return None
        if days == [1, 2, 3, 4, 5]:
            return f"weekdays at {at}"
        if days == [0, 6]:
            return f"weekends at {at}"
        return f"every {', '.join(_DAYS[d] for d in days)} at {at}"
    if weekday == "*" and _NUMBER.match(day) and 1 <= int(day) <= 31:
        return f"on day {int(day)} of every month at {at}"
    return None


def _weekdays(field: str) -> list[int] | None:
    """Cron's weekday field (0 and 7 are Sunday; names allowed) as sorted day numbers, or None."""
    days: set[int] = set()
    for part in field.lower().split(","):
        ends = part.split("-")
        if len(ends) > 2:
            return None
        numbers = []
        for end in ends:
            if end.isdigit() and int(end) <= 7:
                numbers.append(int(end))
            elif end[:3] in _ABBREVIATIONS:
                numbers.append(_ABBREVIATIONS[end[:3]])
            else:
                return None
        lo, hi = numbers[0], numbers[-1]
        if hi < lo:
            return None
        days.update(n % 7 for n in range(lo, hi + 1))
    return sorted(days)
