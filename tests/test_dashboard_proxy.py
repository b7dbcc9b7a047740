"""The dashboard behind a reverse proxy: which forwarding headers are believed, the cookie's Secure flag,
and failed log-ins counted per browser rather than per proxy.

A real gateway serves the dashboard; every request comes from 127.0.0.1, which is a trusted proxy
when ``ui.trusted_proxies`` names it and an ordinary client when it does not.
"""

from __future__ import annotations

import re

import pytest

from gateway.errors import ConfigError
from gateway.runtime.dashboard.guard import Proxies, forwarded_elements
from tests.fakes.model_server import FakeModel
from tests.harness import gateway_config
from tests.test_dashboard import TOKEN, Browser, dashboard


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def _log_in(browser: Browser, token: str, headers: dict) -> tuple[int, str, str]:
    """A log-in from a fresh form: (status, body, Set-Cookie of the answer)."""
    csrf = await browser.csrf("/ui/login")
    status, body, response = await browser.post("/ui/login", {"csrf": csrf, "token": token}, headers=headers)
    return status, body, response.headers.get("Set-Cookie", "")


def _secure(set_cookie: str) -> bool:
    return "secure" in [part.strip().lower() for part in set_cookie.split(";")]


async def test_behind_a_trusted_proxy_an_https_browser_gets_a_secure_cookie(tmp_path, model):
    async with dashboard(tmp_path, model, trusted_proxies=["127.0.0.1"]) as gw:
        for headers in ({"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"},
                        {"Forwarded": 'for="203.0.113.9:5555";proto=https;host=board.example'}):
            browser = Browser(gw)
            try:
                status, _, cookie = await _log_in(browser, TOKEN, headers)
                assert status == 303 and _secure(cookie), (headers, cookie)
                # the form's own anonymous session cookie was Secure too
                async with browser.http.get(browser.base + "/ui/login", headers=headers) as r:
                    assert _secure(r.headers["Set-Cookie"])
            finally:
                await browser.close()
        browser = Browser(gw)  # the proxy says the browser used plain HTTP: no Secure (it would not come back)
        try:
            status, _, cookie = await _log_in(browser, TOKEN, {"X-Forwarded-Proto": "http"})
            assert status == 303 and cookie and not _secure(cookie)
        finally:
            await browser.close()


async def test_from_an_untrusted_peer_forwarding_headers_change_nothing(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:  # no trusted proxies: 127.0.0.1 is just a client
        browser = Browser(gw)
        try:
            spoofed = {"X-Forwarded-Proto": "https", "Forwarded": "for=198.51.100.1;proto=https"}
            status, _, cookie = await _log_in(browser, TOKEN, spoofed)
            assert status == 303 and cookie and not _secure(cookie)
            # failed log-ins claiming five different addresses are all 127.0.0.1's: the sixth try is held up
            for n in range(5):
                status, body, _ = await _log_in(browser, "guess", {"X-Forwarded-For": f"198.51.100.{n + 1}"})
                assert status == 401 and "not the API token" in body
            status, body, _ = await _log_in(browser, TOKEN, {"X-Forwarded-For": "198.51.100.99"})
            assert status == 429 and "Too many failed log-ins" in body
        finally:
            await browser.close()


async def test_cookie_secure_makes_the_cookie_secure_without_any_header(tmp_path, model):
    async with dashboard(tmp_path, model, cookie_secure=True) as gw:
        browser = Browser(gw)
        try:
            # a browser keeps a Secure cookie for HTTPS pages only: this client hands it back itself
            async with browser.http.get(browser.base + "/ui/login") as r:
                form_cookie = r.headers["Set-Cookie"]
                csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text()).group(1)
            assert _secure(form_cookie)
            status, _, response = await browser.post("/ui/login", {"csrf": csrf, "token": TOKEN},
                                                     headers={"Cookie": form_cookie.split(";")[0]})
            assert status == 303 and _secure(response.headers["Set-Cookie"])
        finally:
            await browser.close()


async def test_behind_a_trusted_proxy_one_locked_out_browser_does_not_lock_out_another(tmp_path, model):
    async with dashboard(tmp_path, model, trusted_proxies=["127.0.0.0/8"]) as gw:
        browser = Browser(gw)
        try:
            attacker = {"X-Forwarded-For": "203.0.113.5"}
            for _ in range(5):
                status, _, _ = await _log_in(browser, "guess", attacker)
                assert status == 401
            status, body, _ = await _log_in(browser, TOKEN, attacker)
            assert status == 429 and "Too many failed log-ins" in body
            # the attacker cannot slip out by writing another address in front: the proxy appended its real one
            status, _, _ = await _log_in(browser, TOKEN, {"X-Forwarded-For": "192.0.2.77, 203.0.113.5"})
            assert status == 429
            # the operator, behind the same proxy, logs in with the right token
            status, _, cookie = await _log_in(browser, TOKEN, {"X-Forwarded-For": "198.51.100.20",
                                                                "X-Forwarded-Proto": "https"})
            assert status == 303 and _secure(cookie)
            # and so does a browser the proxy names with Forwarded
            status, _, _ = await _log_in(browser, TOKEN, {"Forwarded": "for=198.51.100.21"})
            assert status == 303
        finally:
            await browser.close()


async def test_the_overall_limit_still_holds_behind_a_trusted_proxy(tmp_path, model):
    async with dashboard(tmp_path, model, trusted_proxies=["127.0.0.1"]) as gw:
        limiter = gw.api.dashboard.limiter
        browser = Browser(gw)
        try:
            for n in range(limiter.overall):  # one failure each from many addresses
                status, _, _ = await _log_in(browser, "guess", {"X-Forwarded-For": f"203.0.113.{n + 1}"})
                assert status == 401
            status, body, _ = await _log_in(browser, TOKEN, {"X-Forwarded-For": "198.51.100.20"})
            assert status == 429 and "Too many failed log-ins" in body
        finally:
            await browser.close()


def test_trusted_proxies_names_a_bad_entry(tmp_path):
    with pytest.raises(ConfigError) as caught:
        gateway_config(tmp_path, "http://127.0.0.1:1/v1", ui={"trusted_proxies": ["10.0.0.0/8", "proxy.local"]})
    assert caught.value.key == "ui.trusted_proxies[1]" and "'proxy.local' is not an IP address" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        gateway_config(tmp_path, "http://127.0.0.1:1/v1", ui={"trusted_proxies": "10.0.0.1"})
    assert caught.value.key == "ui.trusted_proxies"
    config = gateway_config(tmp_path, "http://127.0.0.1:1/v1", ui={"trusted_proxies": ["10.0.0.1", "fd00::/8"],
                                                                   "cookie_secure": True})
    assert config.ui.trusted_proxies == ("10.0.0.1/32", "fd00::/8") and config.ui.cookie_secure


def test_the_client_is_read_from_the_right_past_trusted_hops():
    proxies = Proxies(["10.0.0.0/8", "::1"])
    client = proxies.client
    # a chain of two trusted proxies: the first address before them is the browser's
    assert client("10.0.0.2", {"X-Forwarded-For": "198.51.100.1, 203.0.113.4, 10.0.0.7",
                               "X-Forwarded-Proto": "http, https, http"}) == \
        client("10.0.0.2", {"X-Forwarded-For": "203.0.113.4, 10.0.0.7", "X-Forwarded-Proto": "https, http"})
    found = client("10.0.0.2", {"X-Forwarded-For": "198.51.100.1, 203.0.113.4, 10.0.0.7",
                                "X-Forwarded-Proto": "http, https, http"})
    assert (found.address, found.https) == ("203.0.113.4", True)
    # one proxy that overwrites X-Forwarded-Proto with one value: that value
    assert client("::1", {"X-Forwarded-For": "9.9.9.9, 203.0.113.4", "X-Forwarded-Proto": "https"}).https
    # the peer itself, IPv4-mapped, is trusted; ports and brackets are read off
    assert client("::ffff:10.1.2.3", {"X-Forwarded-For": "[2001:db8::5]:4711"}).address == "2001:db8::5"
    assert client("10.0.0.2", {"Forwarded": 'for="[2001:db8::5]:4711";proto=https, for=10.0.0.9'}) == \
        type(found)("2001:db8::5", True)
    # an untrusted peer: its own address, whatever it claims
    assert client("192.0.2.1", {"X-Forwarded-For": "10.0.0.3", "X-Forwarded-Proto": "https"}) == \
        type(found)("192.0.2.1", False)
    # a hop the proxy could not name: kept as its token (RFC 7239's obfuscated names), else "unknown"
    assert client("10.0.0.2", {"Forwarded": "for=_hidden7"}).address == "_hidden7"
    assert client("10.0.0.2", {"X-Forwarded-For": "<script>"}).address == "unknown"
    assert forwarded_elements(['for=1.2.3.4;proto="https", For="[::1]";by=x']) == [
        {"for": "1.2.3.4", "proto": "https"}, {"for": "[::1]", "by": "x"}]
