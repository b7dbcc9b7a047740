import datetime as dt
from zoneinfo import ZoneInfo

from gateway.reset import ResetPolicy, reset_reason

TZ = ZoneInfo("Europe/Paris")


def at(day, hour, minute=0):
    return dt.datetime(2026, 3, day, hour, minute, tzinfo=TZ).timestamp()


def test_idle_resets_after_the_idle_window_only():
    p = ResetPolicy(mode="idle", idle_minutes=60)
    assert reset_reason(p, at(10, 9), at(10, 9, 59), TZ) is None
    assert reset_reason(p, at(10, 9), at(10, 10, 0), TZ) == "idle"


def test_daily_resets_when_the_hour_was_crossed():
    p = ResetPolicy(mode="daily", at_hour=4)
    assert reset_reason(p, at(10, 3, 50), at(10, 4, 10), TZ) == "daily"
    assert reset_reason(p, at(10, 4, 10), at(10, 23, 0), TZ) is None
    assert reset_reason(p, at(10, 23, 0), at(11, 3, 59), TZ) is None
    assert reset_reason(p, at(10, 23, 0), at(11, 4, 0), TZ) == "daily"


def test_both_takes_whichever_comes_first_and_none_never_resets():
    both = ResetPolicy(mode="both", idle_minutes=24 * 60, at_hour=4)
    assert reset_reason(both, at(10, 3, 0), at(10, 5, 0), TZ) == "daily"
    assert reset_reason(both, at(10, 5, 0), at(12, 3, 0), TZ) == "idle"
    assert reset_reason(ResetPolicy(mode="none"), at(1, 0), at(20, 0), TZ) is None


def test_daily_boundary_follows_the_timezone_across_dst():
    # 29 March 2026: clocks go forward in Paris; 04:00 local still exists and is the boundary.
    p = ResetPolicy(mode="daily", at_hour=4)
    assert reset_reason(p, at(29, 3, 30), at(29, 4, 30), TZ) == "daily"
