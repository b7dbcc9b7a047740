"""The dashboard guard's parts on their own: the log-in limiter's window, browser sessions' lifetime, names."""

from __future__ import annotations

from gateway.runtime.dashboard.guard import (
    MAX_ANONYMOUS,
    SESSION_IDLE_SECONDS,
    BrowserSessions,
    ClientLimit,
    host_name,
    is_loopback_name,
    same_origin,
)
from tests.harness import Clock


def test_failed_log_ins_open_again_once_the_window_has_passed():
    clock = Clock()
    limiter = ClientLimit(per_client=3, overall=5, window=60.0, clock=clock)
    for _ in range(3):
        assert limiter.retry_after("a") == 0
        limiter.count("a")
    wait = limiter.retry_after("a")
    assert 1 <= wait <= 61
    assert limiter.retry_after("b") == 0  # another address is not held up by a's failures...
    limiter.count("b")
    limiter.count("c")
    assert limiter.retry_after("d") > 0  # ...until the failures of all addresses reach the overall limit
    clock.advance(61)
    assert limiter.retry_after("a") == 0 and limiter.retry_after("d") == 0


def test_a_browser_session_ends_when_idle_and_the_oldest_anonymous_ones_make_room():
    clock = Clock()
    sessions = BrowserSessions(clock=clock)
    signed_in = sessions.new(signed_in=True)
    clock.advance(SESSION_IDLE_SECONDS - 1)
    assert sessions.get(signed_in.id) is signed_in  # a use keeps it alive...
    clock.advance(SESSION_IDLE_SECONDS - 1)
    assert sessions.get(signed_in.id) is signed_in
    clock.advance(SESSION_IDLE_SECONDS + 1)
    assert sessions.get(signed_in.id) is None  # ...idle longer than that, it is over
    first = sessions.new(signed_in=False)
    kept = sessions.sign_in(sessions.new(signed_in=False))
    for _ in range(MAX_ANONYMOUS):
        sessions.new(signed_in=False)
    assert sessions.get(first.id) is None  # pushed out by a flood of anonymous ones...
    assert sessions.get(kept.id) is kept  # ...which never push out a signed-in one
    assert sessions.get("") is None and sessions.get(None) is None


def test_names_of_the_loopback_and_origins():
    assert [is_loopback_name(host_name(h)) for h in ("127.0.0.1:8642", "localhost:80", "[::1]:8642", "LOCALHOST",
                                                     "127.1.2.3", "app.localhost:1")] == [True] * 6
    assert [is_loopback_name(host_name(h)) for h in ("evil.example", "127.0.0.1.evil.example:80", "10.0.0.1",
                                                     "[::2]:80", "")] == [False] * 5
    assert same_origin("http://127.0.0.1:8642", ["127.0.0.1:8642"])
    assert same_origin("https://board.example", ["127.0.0.1:8642", "board.example"])
    assert not same_origin("null", ["127.0.0.1:8642"])
    assert not same_origin("http://127.0.0.1:8643", ["127.0.0.1:8642"])
