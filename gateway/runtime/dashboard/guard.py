"""Who may see and change what on the dashboard: browser sessions, CSRF tokens, log-in limits, headers.

The rules (the README's "Dashboard" section says the same to operators):

* With ``api.token`` set, every page needs a log-in: a form takes the token and answers with an
  HttpOnly, SameSite=Strict cookie naming a session held in memory here (the token itself is never
  put in a cookie, a URL or a page).  Only the log-in form and the static files (the package's own
  stylesheet and script, the same on every install) are served without one.
* Without a token (the config allows that on loopback only) the pages are readable, and changes are
  refused unless ``ui.allow_local_writes`` is true.  Requests whose ``Host`` is not a loopback name
  are refused there, so a web page cannot read the dashboard by pointing its own name at 127.0.0.1.
* Every change is a POST that carries its session's CSRF token (and, when the browser says where it
  comes from, an ``Origin`` of this very server).
* Failed log-ins are limited per client address and overall (:class:`LoginLimiter`).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

COOKIE = "switchboard_ui"
SESSION_IDLE_SECONDS = 12 * 3600
MAX_SIGNED_IN = 64  # browser sessions logged in at once; the oldest is signed out past this
MAX_ANONYMOUS = 1024  # sessions that only hold a CSRF token (the log-in form, loopback use)

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    # not no-referrer: with it a browser sends "Origin: null" on the dashboard's own forms, which the origin
    # check then cannot tell from a foreign page's; same-origin still tells other sites nothing
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@dataclass(slots=True)
class BrowserSession:
    """One browser's session: its CSRF token, and whether it logged in with the token."""

    id: str
    csrf: str
    signed_in: bool
    seen_at: float


class BrowserSessions:
    """The dashboard's sessions, in memory (a restart signs everyone out)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._signed_in: OrderedDict[str, BrowserSession] = OrderedDict()
        self._anonymous: OrderedDict[str, BrowserSession] = OrderedDict()

    def get(self, session_id: str | None) -> BrowserSession | None:
        if not session_id:
            return None
        for table in (self._signed_in, self._anonymous):
            session = table.get(session_id)
            if session is None:
                continue
            now = self.clock()
            if now - session.seen_at > SESSION_IDLE_SECONDS:
                del table[session_id]
                return None
            session.seen_at = now
            table.move_to_end(session_id)
            return session
        return None

    def new(self, *, signed_in: bool) -> BrowserSession:
        session = BrowserSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), signed_in, self.clock())
        table, cap = (self._signed_in, MAX_SIGNED_IN) if signed_in else (self._anonymous, MAX_ANONYMOUS)
        table[session.id] = session
        while len(table) > cap:
            table.popitem(last=False)
        return session

    def sign_in(self, old: BrowserSession | None) -> BrowserSession:
        """A new signed-in session (a new id: one fixed before the log-in is worth nothing after it)."""
        self.end(old)
        return self.new(signed_in=True)

    def end(self, session: BrowserSession | None) -> None:
        if session is not None:
            self._signed_in.pop(session.id, None)
            self._anonymous.pop(session.id, None)


@dataclass(slots=True)
class LoginLimiter:
    """Failed log-ins: at most ``per_client`` per client address and ``overall`` in all per ``window`` seconds."""

    per_client: int = 5
    overall: int = 30
    window: float = 300.0
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _all: deque[float] = field(default_factory=deque)

    def retry_after(self, client: str) -> int:
        """Seconds until ``client`` may try again; 0 when it may now."""
        now = self.clock()
        self._forget(now)
        waits = []
        mine = self._failures.get(client)
        if mine is not None and len(mine) >= self.per_client:
            waits.append(mine[0] + self.window - now)
        if len(self._all) >= self.overall:
            waits.append(self._all[0] + self.window - now)
        return max(1, int(max(waits)) + 1) if waits else 0

    def failed(self, client: str) -> None:
        now = self.clock()
        self._failures.setdefault(client, deque()).append(now)
        self._all.append(now)

    def _forget(self, now: float) -> None:
        cutoff = now - self.window
        while self._all and self._all[0] <= cutoff:
            self._all.popleft()
        for client in list(self._failures):
            times = self._failures[client]
            while times and times[0] <= cutoff:
                times.popleft()
            if not times:
                del self._failures[client]


def same_secret(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def is_loopback_name(host: str) -> bool:
    """Whether ``host`` (a Host header's name, without the port) names this machine's loopback."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name in a Host header (``127.0.0.1:8642`` -> ``127.0.0.1``, ``[::1]:80`` -> ``[::1]``)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def same_origin(origin: str, hosts: list[str]) -> bool:
    """Whether an ``Origin`` header names this server by one of ``hosts`` (the Host header, and the
    one a reverse proxy forwarded).  The scheme is not compared: behind an HTTPS proxy the browser's
    is https and ours http.  (The CSRF token is the defence; this check is a second one.)"""
    netloc = urlsplit(origin).netloc.lower()
    return bool(netloc) and any(netloc == host.lower() for host in hosts)
