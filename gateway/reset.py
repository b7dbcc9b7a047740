"""Session reset policies (idle, daily, both or none, per platform and chat type), evaluated in one place.

    idle   reset when the session saw no message for ``idle_minutes``
    daily  reset when the last activity was before the most recent ``at_hour``:00
           in the configured timezone and now is after it
    both   whichever comes first (the default)
    none   never

:func:`reset_reason` is pure: the router calls it on every path (the first
message after a restart included) and skips it while a turn is running.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from gateway.config import ResetPolicy

__all__ = ["ResetPolicy", "describe_reset", "last_daily_boundary", "reset_reason"]


def last_daily_boundary(now: float, at_hour: int, tz: ZoneInfo) -> float:
    """The most recent moment at ``at_hour``:00 local time at or before ``now``."""
    local = dt.datetime.fromtimestamp(now, tz)
    boundary = local.replace(hour=at_hour, minute=0, second=0, microsecond=0)
    if boundary > local:
        boundary -= dt.timedelta(days=1)
        boundary = boundary.replace(hour=at_hour)  # keep the wall-clock hour across DST changes
    return boundary.timestamp()


def reset_reason(policy: ResetPolicy, last_active: float, now: float, tz: ZoneInfo) -> str | None:
    """``"idle"``, ``"daily"`` or None: why a session last active at ``last_active`` must reset now."""
    if policy.mode in ("idle", "both") and now - last_active >= policy.idle_minutes * 60:
        return "idle"
    if policy.mode in ("daily", "both") and last_active < last_daily_boundary(now, policy.at_hour, tz) <= now:
        return "daily"
    return None


def describe_reset(reason: str, policy: ResetPolicy) -> str:
    if reason == "idle":
        hours, minutes = divmod(policy.idle_minutes, 60)
        span = f"{hours} h" if not minutes else (f"{policy.idle_minutes} min" if not hours else f"{hours} h {minutes} min")
        return f"the previous one was idle for more than {span}"
    return f"sessions start fresh every day at {policy.at_hour:02d}:00"
