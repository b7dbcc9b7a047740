"""Who may see and change what on the dashboard: browser sessions, CSRF tokens, log-in limits, headers.

The rules (docs/operating.md, "Dashboard", says the same to operators):

* With ``api.token`` set, every page needs a log-in: a form takes the token and answers with an
  HttpOnly, SameSite=Strict cookie naming a session held in memory here (the token itself is never
  put in a cookie, a URL or a page).  Only the log-in form and the static files (the package's own
  stylesheet and script, the same on every install) are served without one.
* Without a token (the config allows that on loopback only) the pages are readable, and changes are
  refused unless ``ui.allow_local_writes`` is true.  Requests whose ``Host`` is not a loopback name
  are refused there, so a web page cannot read the dashboard by pointing its own name at 127.0.0.1.
* Every change is a POST that carries its session's CSRF token (and, when the browser says where it
  comes from, an ``Origin`` of this very server).
* Failed log-ins are limited per client address and overall (:class:`ClientLimit`).
* Behind a reverse proxy, who the client is and whether it came over HTTPS are read from the
  forwarding headers only when the request's peer is one of ``ui.trusted_proxies``
  (:class:`Proxies`); from any other peer they change nothing.  The session cookie is ``Secure``
  whenever the browser's side is HTTPS (or always, with ``ui.cookie_secure``).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence
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
class ClientLimit:
    """At most ``per_client`` counted requests per client address and ``overall`` in all per ``window``
    seconds (the dashboard's failed log-ins; the MCP sign-in callback's requests).  Only what is counted
    fills the window, so a refused request costs nothing and the clients held are at most ``overall``."""

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

    def count(self, client: str) -> None:
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


# -- behind a reverse proxy -----------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9._:\[\]-]{1,64}")  # what an unparsable hop may be kept as (RFC 7239's "_hidden")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Client:
    """Who is at the other end of a dashboard request: the browser's address (an IP address, or the
    token a proxy put in its place, or ``unknown``), and whether the browser's side is HTTPS."""

    address: str
    https: bool


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """``ui.trusted_proxies`` as networks: an address is a network of one; ValueError names a bad one."""
    return tuple(ipaddress.ip_network(v.strip(), strict=False) for v in values)


def _address(text: str | None) -> str | None:
    """The IP address in a hop (``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80``, ``"[::1]"``), normalized
    (an IPv4-mapped IPv6 address as IPv4); None when it is not one."""
    if not text:
        return None
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _split(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def forwarded_elements(values: Sequence[str]) -> list[dict[str, str]]:
    """RFC 7239 ``Forwarded`` headers as a list of elements (``{"for": ..., "proto": ...}``), nearest
    proxy last.  Quoted values may hold ``,`` and ``;``; names are lower-cased."""
    elements: list[dict[str, str]] = []
    for value in values:
        element: dict[str, str] = {}
        name, text, quoted, in_value = "", "", False, False
        for ch in value + ",":
            if quoted:
                if ch == '"':
                    quoted = False
                else:
                    text += ch
            elif ch == '"' and in_value:
                quoted = True
            elif ch == "=" and not in_value:
                name, text, in_value = text.strip().lower(), "", True
            elif ch in ";,":
                if in_value and name:
                    element[name] = text.strip()
                name, text, in_value = "", "", False
                if ch == ",":
                    elements.append(element)
                    element = {}
            else:
                text += ch
    return elements


class Proxies:
    """``ui.trusted_proxies``: the peers whose ``X-Forwarded-For``, ``X-Forwarded-Proto`` and
    ``Forwarded`` headers are believed.

    The client is found as reverse proxies write it: each proxy appends the address it was reached
    from, so the list is read from the right, past every hop that is itself a trusted proxy; the first
    other one is the client (a client's own header, passed on in front, is never read).  The scheme is
    the one written for that hop (or the only one the proxy wrote).  ``X-Forwarded-*`` are read when
    the request has them, else ``Forwarded``."""

    def __init__(self, trusted: Iterable[str] = ()):
        self.networks = parse_networks(trusted)

    def trusts(self, address: str | None) -> bool:
        found = _address(address)
        if found is None:
            return False
        ip = ipaddress.ip_address(found)
        return any(ip in network for network in self.networks)

    def client(self, peer: str | None, headers: Mapping[str, str], *, tls: bool = False) -> Client:
        """Who sent a request that came from ``peer`` with ``headers`` (over TLS to us: ``tls``)."""
        direct = Client(_address(peer) or "unknown", tls)
        if not self.networks or not self.trusts(peer):
            return direct
        getall = getattr(headers, "getall", None)

        def values(name: str) -> list[str]:
            return list(getall(name, [])) if getall is not None else ([headers[name]] if name in headers else [])

        protos: list[str | None]
        if "X-Forwarded-For" in headers or "X-Forwarded-Proto" in headers:
            hops: list[str] = _split(values("X-Forwarded-For"))
            protos = list(_split(values("X-Forwarded-Proto")))
            aligned = len(protos) == len(hops)
        else:
            elements = forwarded_elements(values("Forwarded"))
            hops = [e.get("for", "") for e in elements]
            protos = [e.get("proto") for e in elements]
            aligned = True
        if not hops:
            proto = protos[-1] if protos else None
            return Client(direct.address, tls if proto is None else proto.lower() == "https")
        at = len(hops) - 1
        while at > 0 and self.trusts(hops[at]):
            at -= 1
        hop = hops[at]
        address = _address(hop) or (hop if _TOKEN.fullmatch(hop) else "unknown")
        proto = protos[at] if aligned else (protos[-1] if protos else None)
        return Client(address, tls if proto is None else proto.lower() == "https")
