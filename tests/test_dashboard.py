"""The web dashboard over HTTP: who may see and change what, the pages, escaping, exports, 404s.

A real gateway serves the dashboard on its local API; aiohttp's client is the browser (the real
browser walks the same pages in test_dashboard_browser.py).
"""

from __future__ import annotations

import html
import json
import os
import re
import time

import aiohttp
import pytest
from click.testing import CliRunner
from yarl import URL

import compression
from gateway.cli.main import main
from gateway.config import platform_models
from gateway.errors import ConfigError
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, gateway_config, running_gateway

# the installed platforms' own paths on the local API (webhooks, Teams, Lark): their adapters check the requests
PLATFORM_PATHS = {path for model in platform_models().values() for path in model.HTTP_PATHS}
# open by design, each with a check of its own: an MCP sign-in comes back with its flow's one-time state
# (a visitor without one is refused, 400), and authorisation servers fetch the client's public document
SIGN_IN_PATHS = {"/mcp/oauth/callback", "/mcp/oauth/client.json"}

TOKEN = "dashboard-test-token-7f3a9c"
EVIL_TITLE = "<script>alert('title')</script>"
EVIL_TEXT = 'hello "><img src=x onerror=alert(1)> <script>alert(2)</script> needle'
EVIL_NAME = '"><img src=x onerror=alert(3)>'
JOB = {"id": "digest", "name": "Daily <b>digest</b>", "schedule": "0 8 * * *", "prompt": "Summarize the day",
       "deliver": "local"}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def dashboard(tmp_path, model, *, token: str | None = TOKEN, identities: dict | None = None, **ui):
    overrides: dict = {"ui": {"enabled": True, **ui}, "cron": {"jobs": [JOB]}}
    if identities:
        overrides["identities"] = identities
    if token:
        overrides["api"] = {"token": token}
    return running_gateway(tmp_path, model, **overrides)


def base(gw) -> str:
    return f"http://127.0.0.1:{gw.api.bound_port}"


async def seed(gw) -> dict:
    """A conversation with hostile text in it, a compression chain, a stranger's pairing code."""
    db = gw.db
    now = time.time()
    await db.sessions.create("s-evil", "telegram", user_id="666", user_name=EVIL_NAME, title=EVIL_TITLE,
                            session_key="agent:main:telegram:dm:666")
    await db.messages.append("s-evil", "user", EVIL_TEXT)
    await db.messages.append("s-evil", "assistant", "an answer about the needle")
    await db.sessions.create("s-root", "discord", user_id="42", user_name="Dora", title="Trip planning")
    await db.messages.append("s-root", "user", "plan a trip to Lisbon")
    await db.sessions.end("s-root", "compression")
    await db.sessions.create("s-child", "discord", user_id="42", user_name="Dora", title="Trip planning #2",
                            parent_session_id="s-root")
    summary = compression.make_summary_message("They want three days in Lisbon in May.")
    await db.messages.append("s-child", summary["role"], summary["content"])
    await db.messages.append("s-child", "user", "and Porto?")
    pairing = await db.pairing.request("telegram", "999", EVIL_NAME, "ABCD2345", now=now, ttl=3600, max_pending=3)
    return {"pairing": pairing}


class Browser:
    """An aiohttp client session that keeps cookies, like a browser, and reads forms' CSRF tokens."""

    def __init__(self, gw, **kwargs):
        self.base = base(gw)
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), **kwargs)

    async def get(self, path: str, **kwargs) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.get(self.base + path, allow_redirects=False, **kwargs) as r:
            return r.status, await r.text(), r

    async def post(self, path: str, data: dict, **kwargs) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.post(self.base + path, data=data, allow_redirects=False, **kwargs) as r:
            return r.status, await r.text(), r

    async def csrf(self, path: str = "/ui/pairing") -> str:
        status, body, _ = await self.get(path)
        assert status == 200, body
        return re.search(r'name="csrf" value="([^"]+)"', body).group(1)

    async def login(self, token: str = TOKEN) -> None:
        csrf = await self.csrf("/ui/login")
        status, _, response = await self.post("/ui/login", {"csrf": csrf, "token": token})
        assert status == 303 and response.headers["Location"] == "/ui/", status

    async def close(self) -> None:
        await self.http.close()


# -- the route walk ---------------------------------------------------------------------

EXAMPLES = {"session_id": "s-root", "kind": "json", "job_id": "digest", "action": "run", "name": "dashboard.css",
            "model_id": "fake-model"}
OPEN = {("GET", "/ui/login"), ("POST", "/ui/login"), ("GET", "/ui/static/{name}")}


def every_route(gw) -> list[tuple[str, str, str]]:
    """(method, pattern, example path) of every route the API serves, read from its router."""
    app = gw.api.app()
    out = []
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        pattern = route.resource.canonical
        path = re.sub(r"\{(\w+)\}", lambda m: EXAMPLES[m.group(1)], pattern)
        out.append((route.method, pattern, path))
    return out


async def test_every_route_refuses_a_visitor_who_has_not_logged_in(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        routes = every_route(gw)
        patterns = {(m, p) for m, p, _ in routes}
        # the walk covers the API, every page, every form, the log-in and the static files
        assert {("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/ui/"), ("POST", "/ui/cron/{job_id}/{action}"),
                ("POST", "/ui/pairing/approve"), ("GET", "/ui/static/{name}")} <= patterns
        extra = [("GET", "/ui/no-such-page", "/ui/no-such-page"), ("GET", "/ui/sessions/nope", "/ui/sessions/nope"),
                 ("POST", "/ui/no-such-form", "/ui/no-such-form"), ("GET", "/nope", "/nope"),
                 ("GET", "/ui/static/{name}", "/ui/static/nope.css"), ("GET", "/ui/static/{name}", "/ui/static/dashboard.js")]
        visitor = Browser(gw)
        try:
            for method, pattern, path in routes + extra:
                if method == "GET":
                    status, body, response = await visitor.get(path)
                else:
                    status, body, response = await visitor.post(path, {"csrf": "x", "token": "wrong"})
                where = f"{method} {path}"
                if (method, pattern) in OPEN:
                    if pattern == "/ui/static/{name}" and "nope" not in path:
                        assert status == 200, where
                    elif "nope" in path:
                        assert status == 404, where
                    continue
                if pattern in SIGN_IN_PATHS:
                    assert status in (200, 400, 404), where
                    for secret in ("Lisbon", "needle", "Trip planning", "ABCD2345", TOKEN):
                        assert secret not in body, where
                    continue
                if pattern in PLATFORM_PATHS:  # signed for its platform (a hook secret, a JWT), not api.token: off here
                    assert status in (401, 503), where
                    assert "Lisbon" not in body, where
                    continue
                if path.startswith("/ui"):
                    assert status in (303, 401, 403), where
                    if status == 303:
                        assert response.headers["Location"] == "/ui/login", where
                    for secret in ("Lisbon", "needle", "Trip planning", "ABCD2345", "Summarize the day", TOKEN):
                        assert secret not in body, where
                else:
                    assert status == 401, where
                if path.startswith("/ui"):
                    assert response.headers["X-Frame-Options"] == "DENY", where
                    assert "script-src 'self'" in response.headers["Content-Security-Policy"], where
                    assert response.headers["Referrer-Policy"] == "same-origin", where
            # and nothing was changed by those POSTs
            assert (await gw.db.pairing.list())["pending"][0]["code"] == "ABCD2345"
            assert (await gw.db.cron.list_runs("digest")) == []
        finally:
            await visitor.close()


async def test_logging_in_sets_a_strict_httponly_cookie_and_never_shows_the_token(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            csrf = await browser.csrf("/ui/login")
            before = _cookie(browser)
            # a log-in form posted from elsewhere (no CSRF token of this browser's session) does not log in
            status, body, _ = await browser.post("/ui/login", {"token": TOKEN})
            assert status == 403 and "Nothing was changed" in body
            assert (await browser.get("/ui/sessions"))[0] == 303
            status, _, response = await browser.post("/ui/login", {"csrf": csrf, "token": TOKEN})
            assert status == 303 and response.headers["Location"] == "/ui/"
            assert _cookie(browser) != before  # a new session id: one planted before the log-in is worth nothing
            cookie = response.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
            assert TOKEN not in cookie
            for path in ("/ui/", "/ui/sessions", "/ui/sessions/s-root", "/ui/cron", "/ui/pairing", "/ui/health/fragment",
                         "/ui/sessions/s-root/export.json", "/ui/sessions/s-root/export.md"):
                status, body, response = await browser.get(path)
                assert status == 200, path
                assert TOKEN not in body and TOKEN not in str(response.url), path
            # logging out ends the session
            status, _, _ = await browser.post("/ui/logout", {"csrf": await browser.csrf("/ui/")})
            assert status == 303
            status, _, response = await browser.get("/ui/sessions")
            assert status == 303 and response.headers["Location"] == "/ui/login"
        finally:
            await browser.close()


def _cookie(browser: Browser) -> str:
    return browser.http.cookie_jar.filter_cookies(URL(browser.base + "/ui/"))["switchboard_ui"].value


async def test_behind_a_reverse_proxy_the_forwarded_host_is_the_origin(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            await browser.login()
            csrf = await browser.csrf()
            proxied = {"Origin": "https://board.example", "X-Forwarded-Host": "board.example", "Host": "127.0.0.1:1"}
            status, _, _ = await browser.post("/ui/pairing/approve", {"csrf": csrf, "platform": "telegram",
                                                                     "code": "ABCD2345"}, headers=proxied)
            assert status == 303 and await gw.db.pairing.is_approved("telegram", "999")
        finally:
            await browser.close()


async def test_failed_log_ins_are_rate_limited(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        browser = Browser(gw)
        try:
            csrf = await browser.csrf("/ui/login")
            for _ in range(5):
                status, body, _ = await browser.post("/ui/login", {"csrf": csrf, "token": "guess"})
                assert status == 401 and "not the API token" in body
            status, body, response = await browser.post("/ui/login", {"csrf": csrf, "token": TOKEN})
            assert status == 429 and "Too many failed log-ins" in body
            assert int(response.headers["Retry-After"]) > 0
            status, _, _ = await browser.get("/ui/sessions")
            assert status == 303  # still not logged in, even with the right token during the pause
        finally:
            await browser.close()


async def test_a_change_needs_its_csrf_token_and_a_same_site_origin(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            await browser.login()
            status, body, _ = await browser.post("/ui/pairing/approve", {"platform": "telegram", "code": "ABCD2345"})
            assert status == 403 and "Nothing was changed" in body
            csrf = await browser.csrf()
            status, body, _ = await browser.post("/ui/pairing/approve",
                                                 {"csrf": csrf, "platform": "telegram", "code": "ABCD2345"},
                                                 headers={"Origin": "https://evil.example"})
            assert status == 403 and "another site" in body
            assert not await gw.db.pairing.is_approved("telegram", "999")
            status, _, response = await browser.post("/ui/pairing/approve",
                                                     {"csrf": csrf, "platform": "telegram", "code": "abcd2345"})
            assert status == 303
            assert await gw.db.pairing.is_approved("telegram", "999")
            status, body, _ = await browser.get(response.headers["Location"])
            assert "Approved telegram:999" in body
            status, _, _ = await browser.post("/ui/pairing/revoke", {"csrf": csrf, "platform": "telegram", "user_id": "999"})
            assert status == 303 and not await gw.db.pairing.is_approved("telegram", "999")
            status, body, _ = await browser.post("/ui/pairing/approve", {"csrf": csrf, "platform": "telegram", "code": "NOPE"})
            assert status == 404 and "no pending telegram pairing request" in body
        finally:
            await browser.close()


async def test_on_loopback_without_a_token_the_dashboard_is_read_only(tmp_path, model):
    async with dashboard(tmp_path, model, token=None) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            status, body, _ = await browser.get("/ui/pairing")
            assert status == 200 and "ABCD2345" in body and "read-only" in body
            assert "Approve</button>" not in body  # no form to press
            status, _, response = await browser.get("/ui/login")
            assert status == 303 and response.headers["Location"] == "/ui/"  # nothing to log in with
            status, body, _ = await browser.get("/ui/cron")
            assert "Run now" not in body
            # even a well-formed POST is refused
            token = await _session_csrf(gw, browser)
            status, body, _ = await browser.post("/ui/pairing/approve", {"csrf": token, "platform": "telegram",
                                                                        "code": "ABCD2345"})
            assert status == 403 and "read-only" in body
            for method, pattern, path in every_route(gw):  # every form, with this session's own CSRF token
                if method == "POST" and pattern.startswith("/ui/") and pattern not in ("/ui/login", "/ui/logout"):
                    for action in (("run", "pause", "resume") if "{action}" in pattern else ("",)):
                        where = path.replace("/run", f"/{action}") if action else path
                        status, body, _ = await browser.post(where, {"csrf": token, "platform": "telegram",
                                                                     "code": "ABCD2345", "user_id": "999"})
                        assert status == 403 and "read-only" in body, where
            assert not await gw.db.pairing.is_approved("telegram", "999")
            assert not (await gw.db.cron.get_job("digest"))["paused"]
            assert await gw.db.cron.list_runs("digest") == []
            # a page asked for by another name (DNS rebinding onto 127.0.0.1) is refused
            status, body, _ = await browser.get("/ui/sessions", headers={"Host": "evil.example"})
            assert status == 403 and "Lisbon" not in body
        finally:
            await browser.close()


async def _session_csrf(gw, browser: Browser) -> str:
    """The CSRF token of the browser's dashboard session (a read-only page has no form to read it from)."""
    return gw.api.dashboard.sessions.get(_cookie(browser)).csrf


async def test_on_loopback_allow_local_writes_lets_the_dashboard_act(tmp_path, model):
    async with dashboard(tmp_path, model, token=None, allow_local_writes=True) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            csrf = await browser.csrf()
            status, _, _ = await browser.post("/ui/pairing/approve", {"platform": "telegram", "code": "ABCD2345"})
            assert status == 403  # still a CSRF token per change
            status, _, _ = await browser.post("/ui/pairing/approve", {"csrf": csrf, "platform": "telegram",
                                                                     "code": "ABCD2345"})
            assert status == 303 and await gw.db.pairing.is_approved("telegram", "999")
        finally:
            await browser.close()


async def test_the_dashboard_is_off_unless_enabled(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        async with aiohttp.ClientSession() as http:
            async with http.get(base(gw) + "/ui/") as r:
                assert r.status == 404


def test_a_malformed_ui_setting_names_its_key(tmp_path):
    with pytest.raises(ConfigError) as caught:
        gateway_config(tmp_path, "http://127.0.0.1:1/v1", ui={"enabled": "sometimes"})
    assert "ui.enabled" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        gateway_config(tmp_path, "http://127.0.0.1:1/v1", ui={"allow_local_writes": [1]})
    assert "ui.allow_local_writes" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        gateway_config(tmp_path, "http://127.0.0.1:1/v1", ui={"enable": True})
    assert "ui.enable" in str(caught.value)


# -- the pages ----------------------------------------------------------------------------

async def test_hostile_text_is_escaped_on_every_page(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        await gw.cron.run_job("digest")
        browser = Browser(gw)
        try:
            await browser.login()
            pages = ["/ui/sessions", "/ui/sessions?q=needle", "/ui/sessions/s-evil", "/ui/pairing", "/ui/cron",
                     "/ui/cron/digest", "/ui/sessions?user=" + EVIL_NAME, "/ui/sessions?q=" + EVIL_TEXT]
            for path in pages:
                status, body, _ = await browser.get(path)
                assert status == 200, path
                assert "<script>alert" not in body and "<img src=x" not in body, path
                assert "<b>digest</b>" not in body, path
            _, body, _ = await browser.get("/ui/sessions/s-evil")
            assert html.escape(EVIL_TITLE, quote=False) in body or "&lt;script&gt;alert(&#39;title&#39;)" in body
            assert "&lt;img src=x onerror=alert(1)&gt;" in body
            _, body, _ = await browser.get("/ui/pairing")
            assert "&#34;&gt;&lt;img src=x onerror=alert(3)&gt;" in body
        finally:
            await browser.close()


async def test_search_highlights_matches_and_a_broken_query_finds_nothing(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/sessions?q=Lisbon")
            assert "<mark>Lisbon</mark>" in body and "/ui/sessions/s-root" in body
            for broken in ('"unclosed', "AND OR (", "NOT", "*", ")))"):
                status, body, _ = await browser.get("/ui/sessions", params={"q": broken})
                assert status == 200 and "No matches." in body, broken
        finally:
            await browser.close()


async def test_search_shows_a_compressed_conversation_once_by_its_newest_tip(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)  # "Lisbon" is in s-root's message and in s-child's summary of it
        await gw.db.messages.append("s-child", "assistant", "Lisbon, then Porto by train")
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/sessions?q=Lisbon")
        finally:
            await browser.close()
    hits = re.findall(r'<table id="hits">.*?</table>', body, re.S)[0]
    rows = re.findall(r"<tr><td>.*?</tr>", hits, re.S)
    assert len(rows) == 1, rows  # not one row per half of the chain
    links = re.findall(r'href="(/ui/sessions/[^"#]+)', rows[0])
    assert links[0] == "/ui/sessions/s-child"  # the conversation is opened where it goes on
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", rows[0]))
    assert "s-child" in text and "and 2 more matches" in text, text


async def test_the_sessions_list_filters_by_platform_user_title_and_date(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        today = time.strftime("%Y-%m-%d", time.gmtime())

        async def listed(**params) -> set[str]:
            status, body, _ = await browser.get("/ui/sessions", params=params)
            assert status == 200
            return set(re.findall(r'href="/ui/sessions/(s-[a-z]+)"', body))

        try:
            await browser.login()
            assert await listed() == {"s-evil", "s-child"}  # a compression chain is one row, its tip
            assert await listed(platform="discord") == {"s-child"}
            assert await listed(user="666") == {"s-evil"}
            assert await listed(user="Dora") == {"s-child"}
            assert await listed(title="trip") == {"s-child"}
            assert await listed(since=today) == {"s-evil", "s-child"}
            assert await listed(until="2001-01-01") == set()
            _, body, _ = await browser.get("/ui/sessions", params={"since": "yesterday"})
            assert "since must be a date like" in body
            # a page past any the store could hold (or none at all) is page 1, and the page says so
            for page in ("99999999999999999999999", "0", "-3", "two"):
                status, body, _ = await browser.get("/ui/sessions", params={"page": page})
                assert status == 200 and "page must be a whole number from 1 to 1,000,000; showing page 1" in body
                assert set(re.findall(r'href="/ui/sessions/(s-[a-z]+)"', body)) == {"s-evil", "s-child"}, page
            assert await listed(page="2") == set()
        finally:
            await browser.close()


async def test_a_transcript_shows_its_lineage_and_compression_summary(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/sessions/s-child")
            assert 'parent <a href="/ui/sessions/s-root">Trip planning</a>' in body
            assert "They want three days in Lisbon in May." in body and "Compression summary" in body
            assert "and Porto?" in body
            _, body, _ = await browser.get("/ui/sessions/s-root")
            assert '<a href="/ui/sessions/s-child">Trip planning #2</a>' in body
            assert "continued in" in body
        finally:
            await browser.close()


async def test_a_session_exports_as_the_stores_json_and_as_markdown(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            await browser.login()
            status, body, response = await browser.get("/ui/sessions/s-child/export.json")
            assert status == 200 and response.headers["Content-Disposition"] == 'attachment; filename="session-s-child.json"'
            assert json.loads(body) == json.loads(json.dumps(await gw.db.transfer.export("s-child"), default=str))
            status, body, response = await browser.get("/ui/sessions/s-child/export.md")
            assert status == 200 and response.content_type == "text/markdown"
            assert body.startswith("# Trip planning #2\n")
            assert "They want three days in Lisbon in May." in body and "and Porto?" in body
            assert "[Summary of earlier conversation]" not in body
        finally:
            await browser.close()


async def test_unknown_ids_get_the_404_page(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        browser = Browser(gw)
        try:
            await browser.login()
            csrf = await browser.csrf("/ui/cron")
            for path in ("/ui/sessions/nope", "/ui/sessions/nope/export.json", "/ui/sessions/nope/export.md",
                         "/ui/cron/nope", "/ui/nowhere", "/ui/static/nope.js", "/ui/sessions/x/export.exe"):
                status, body, response = await browser.get(path)
                assert status == 404 and "404 · Not found" in body and response.content_type == "text/html", path
            for path in ("/ui/cron/nope/run", "/ui/cron/nope/pause", "/ui/cron/digest/explode"):
                status, body, _ = await browser.post(path, {"csrf": csrf})
                assert status == 404 and "404 · Not found" in body, path
        finally:
            await browser.close()


async def test_cron_runs_now_pauses_and_resumes_from_the_dashboard(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        browser = Browser(gw)
        try:
            await browser.login()
            csrf = await browser.csrf("/ui/cron")
            status, _, response = await browser.post("/ui/cron/digest/run", {"csrf": csrf})
            assert status == 303 and "/ui/cron/digest?started=" in response.headers["Location"]
            run = (await gw.db.cron.list_runs("digest"))[0]
            assert run["trigger"] == "manual"
            await eventually(lambda: _run_ended(gw, run["id"]), 10, "the run to end")
            _, body, _ = await browser.get("/ui/cron/digest")
            assert f"#{run['id']}" in body and "kept in the store (local)" in body
            # the page's runs table refreshes itself from its fragment while a run is running
            assert 'data-refresh="/ui/cron/digest/runs/fragment"' in body and 'data-while=".badge.running"' in body
            for path in ("/ui/cron/digest/runs/fragment", "/ui/cron/runs/fragment"):
                status, fragment, _ = await browser.get(path)
                assert status == 200 and "<html" not in fragment and "kept in the store (local)" in fragment, path
            assert (await browser.get("/ui/cron/nope/runs/fragment"))[0] == 404
            status, _, _ = await browser.post("/ui/cron/digest/pause", {"csrf": csrf})
            assert status == 303 and (await gw.db.cron.get_job("digest"))["paused"]
            _, body, _ = await browser.get("/ui/cron")
            assert 'badge paused' in body and "Resume" in body
            assert '<span class="badge ok">ok</span> just now' in body  # the last run
            status, _, _ = await browser.post("/ui/cron/digest/resume", {"csrf": csrf})
            job = await gw.db.cron.get_job("digest")
            assert status == 303 and not job["paused"] and job["next_run_at"] > time.time()
        finally:
            await browser.close()


async def test_cron_schedules_are_shown_in_words_with_the_timezone_and_the_raw_text(tmp_path, model):
    jobs = [{**JOB, "schedule": "0 9 * * *"}, {"id": "weekly", "schedule": "30 7 * * 1-5", "prompt": "Plan the week"},
            {"id": "odd", "schedule": "5 4 1-7 */2 *", "prompt": "Rare"}]
    async with running_gateway(tmp_path, model, timezone="Europe/Paris", ui={"enabled": True}, api={"token": TOKEN},
                               cron={"jobs": jobs}) as gw:
        browser = Browser(gw)
        try:
            await browser.login()
            _, listing, _ = await browser.get("/ui/cron")
            _, page, _ = await browser.get("/ui/cron/digest")
        finally:
            await browser.close()
    cells = [re.sub(r"<[^>]+>", "|", c) for c in re.findall(r'<td[^>]*class="schedule">(.*?)</td>', listing, re.S)]
    assert sorted(cells) == ["cron 5 4 1-7 */2 * (Europe/Paris) |5 4 1-7 */2 *|",
                             "every day at 09:00 (Europe/Paris) |0 9 * * *|",
                             "weekdays at 07:30 (Europe/Paris) |30 7 * * 1-5|"]
    assert "every day at 09:00 (Europe/Paris)" in page and "0 9 * * *" in page


@pytest.mark.parametrize(("text", "words"), [
    ("0 9 * * *", "every day at 09:00 (Europe/Paris)"),
    ("0 8,18 * * *", "every day at 08:00 and 18:00 (Europe/Paris)"),
    ("15 6 * * 0,6", "weekends at 06:15 (Europe/Paris)"),
    ("0 9 * * mon,wed", "every Monday, Wednesday at 09:00 (Europe/Paris)"),
    ("0 9 * * 7", "every Sunday at 09:00 (Europe/Paris)"),
    ("0 12 1 * *", "on day 1 of every month at 12:00 (Europe/Paris)"),
    ("*/15 * * * *", "every 15 minutes (Europe/Paris)"),
    ("5 * * * *", "every hour at :05 (Europe/Paris)"),
    ("0 */6 * * *", "every 6 hours at :00 (Europe/Paris)"),
    ("every 30m", "every 30m"),
    ("2026-12-01T09:00", "once at 2026-12-01 09:00 (Europe/Paris)"),
    ("0 9 * 1 *", "cron 0 9 * 1 * (Europe/Paris)"),
])
def test_a_schedule_in_words(text, words):
    from gateway.runtime.dashboard.schedules import readable_schedule

    assert readable_schedule(text, "Europe/Paris") == words


async def _run_ended(gw, run_id: int) -> bool:
    return (await gw.db.cron.get_run(run_id))["status"] not in ("running",)


async def test_health_shows_platforms_queues_and_the_instance(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await gw.db.dead_letters.add(platform="slack", event_id="Ev1", payload="{}", message=None,
                                    error="<b>boom</b> handler failed")
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/")
            assert 'data-refresh="/ui/health/fragment"' in body
            for text in ("uptime", "turns running", "replies waiting to be sent", "dead letters held", "Ev1",
                         "&lt;b&gt;boom&lt;/b&gt; handler failed", gw.config.agent, str(gw.config.home)):
                assert text in body, text
            status, fragment, _ = await browser.get("/ui/health/fragment")
            assert status == 200 and "<html" not in fragment and "Ev1" in fragment
        finally:
            await browser.close()


async def test_health_says_why_it_is_degraded_and_shows_the_model_endpoints(tmp_path):
    from gateway.runtime.daemon import Gateway
    from tests.fakes.telegram import FakeTelegram

    async with FakeModel(model_name="llama3.1:8b") as other, FakeTelegram() as tg:
        platforms = {"telegram": {"token": "999:wrong-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "base_url": tg.base_url}}
        gw = Gateway(gateway_config(tmp_path, other.base_url, ui={"enabled": True}, api={"token": TOKEN},
                                    platforms=platforms))  # the platforms found through their entry points
        await gw.start()
        try:
            await eventually(lambda: "telegram" in gw.rejected_platforms, 20, "telegram rejected")
            browser = Browser(gw)
            try:
                await browser.login()
                _, body, _ = await browser.get("/ui/")
            finally:
                await browser.close()
        finally:
            await gw.stop(grace_seconds=5)
    text = html.unescape(re.sub(r"<[^>]+>", " ", body))
    text = re.sub(r"\s+", " ", text)
    assert "Degraded because: telegram: failed: the token was rejected" in text
    assert (f"model: not serving: {other.base_url} does not serve 'fake-model' (it has: llama3.1:8b)") in text
    assert f"default fake-model {other.base_url} not serving closed" in text  # the endpoint, its state and breaker
    assert "No MCP tool server is configured" in text


async def test_the_guard_does_not_change_the_apis_bearer_token(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        browser = Browser(gw)
        try:
            await browser.login()
            status, _, _ = await browser.get("/healthz")  # a dashboard log-in is not an API token
            assert status == 401
            status, _, _ = await browser.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
            assert status == 200
        finally:
            await browser.close()



async def test_the_usage_page_charts_the_days_and_sums_each_model_and_identity(tmp_path, model):
    evil_model = '"><img src=x onerror=alert(4)>'
    now = time.time()
    async with dashboard(tmp_path, model, token=TOKEN, identities={"ann": ["telegram:111", "discord:222"]}) as gw:
        for platform, user, model_name, prompt, cost in (("telegram", "111", "gpt-small", 100, 0.25),
                                                        ("discord", "222", "gpt-small", 50, 0.125),
                                                        ("telegram", "333", evil_model, 7, None)):
            await gw.db.usage.record_call({"at": now - 60, "platform": platform, "user_id": user, "purpose": "turn",
                                           "model": model_name, "outcome": "ok", "prompt_tokens": prompt,
                                           "completion_tokens": 10, "cost": cost})
        browser = Browser(gw)
        try:
            await browser.login()
            status, body, _ = await browser.get("/ui/usage?days=7&by=model")
            assert status == 200
            rows = {html.unescape(re.sub(r"<[^>]+>", "", cells[0])): [html.unescape(re.sub(r"<[^>]+>", "", c))
                                                                     for c in cells[1:]]
                    for cells in (re.findall(r"<td[^>]*>(.*?)</td>", row)
                                  for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)) if cells}
            assert rows["gpt-small"] == ["2", "150", "0", "20", "$0.3750"]
            assert rows[evil_model] == ["1", "7", "0", "10", "no price"]
            assert "<img src=x" not in body, "a model's name is escaped in the table and the chart"
            assert body.count('class="day"') == 7, "one bar group per day of the window"
            assert "<script" not in body.split("</head>", 1)[1], "no inline script"

            _, body, _ = await browser.get("/ui/usage?days=7&by=user")
            users = re.findall(r"<tr[^>]*><td>([^<]*)</td><td class=\"num\">([\d,]+)</td>", body)
            assert sorted(users) == [("ann", "2"), ("telegram:333", "1")], "ann's two accounts are one row"

            status, body, _ = await browser.get("/ui/usage?days=abc&by=nonsense")
            assert status == 200
            assert "days must be a whole number from 1 to 366" in html.unescape(body)
            assert "unknown grouping &#39;nonsense&#39;" in body or "unknown grouping 'nonsense'" in html.unescape(body)
        finally:
            await browser.close()


async def test_usage_by_user_names_a_cron_jobs_calls_by_the_job(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await gw.cron.run_job("digest")
        await eventually(lambda: _cron_calls(gw), 10, "the cron run's model call in the ledger")
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/usage?days=7&by=user")
            names = [html.unescape(n) for n in re.findall(r'<tr[^>]*><td>([^<]*)</td><td class="num">', body)]
            assert names == [f"cron:{JOB['name']}"]  # escaped on the page; not "cron:?"
        finally:
            await browser.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD")}
    result = CliRunner(env={**env, "SWITCHBOARD_HOME": str(tmp_path)}).invoke(
        main, ["insights", "--by", "user", "--json", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in json.loads(result.output)["rows"]] == [f"cron:{JOB['name']}"]


async def _cron_calls(gw) -> bool:
    summary = await gw.db.usage.summary(time.time() - 3600, "purpose")
    return any(row["grp"] == "cron" for row in summary["groups"])


async def test_a_transcript_renders_markdown_with_raw_html_as_text_and_no_foreign_loads(tmp_path, model):
    answer = ("**bold** and `code`\n\n```sh\nmake run\n```\n\n"
              '<img src=x onerror=alert(5)> [click](javascript:alert(6)) [ok](https://example.com "t") '
              "![pixel](https://tracker.example/p.png) <a href=\"https://evil.example\">raw link</a>")
    async with dashboard(tmp_path, model) as gw:
        await gw.db.sessions.create("s-md", "telegram", user_id="1")
        await gw.db.messages.append("s-md", "assistant", answer)
        await gw.db.messages.append("s-md", "tool", "**not markdown** <b>x</b>")
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/sessions/s-md")
            main = body.split("<main>", 1)[1]
            assert "<strong>bold</strong>" in main and "<code>code</code>" in main
            assert "<pre><code>make run\n</code></pre>" in main  # a fence, shown in the monospace font
            assert "<img" not in main and "&lt;img src=x onerror=alert(5)&gt;" in main
            assert "javascript:" not in main.replace("[click](javascript:alert(6))", "")  # stays text, no link
            assert '<a href="https://example.com" title="t" rel="noopener noreferrer nofollow">ok</a>' in main
            assert '<a href="https://tracker.example/p.png" rel="noopener noreferrer nofollow">pixel</a>' in main
            assert '<a href="https://evil.example"' not in main and "&lt;a href=" in main  # raw HTML is text
            assert "<pre><code>**not markdown** &lt;b&gt;x&lt;/b&gt;</code></pre>" in main  # a tool's output as it is
        finally:
            await browser.close()


async def test_the_storage_page_shows_the_storage_report_with_what_reduces_each_line(tmp_path, model):
    async with dashboard(tmp_path, model, token=TOKEN) as gw:
        await seed(gw)
        await gw.db.messages.append("s-root", "assistant", "x" * 5000)  # the largest session by text
        browser = Browser(gw)
        try:
            await browser.login()
            status, body, _ = await browser.get("/ui/storage")
        finally:
            await browser.close()
        report = await gw.db.storage.report()
    assert status == 200
    text = html.unescape(body)
    assert 'class="here">Storage</a>' in body
    assert "switchboard sessions prune --older-than DAYS --source discord" in text
    assert "switchboard maintenance --vacuum (daemon stopped)" in text
    largest = re.findall(r'<table id="largest">.*?</table>', body, re.S)[0]
    rows = re.findall(r'<tr><td><a href="/ui/sessions/([^"]+)">', largest)
    assert rows == [s.session_id for s in report.largest_sessions]
    assert rows[0] == "s-root" and "switchboard sessions delete s-root" in text
    platforms = dict(re.findall(r"<tr><td>(\w+)</td><td class=\"num\">([\d,]+)</td>",
                                re.findall(r'<table id="platforms">.*?</table>', body, re.S)[0]))
    assert platforms == {"discord": "4", "telegram": "2"}
    assert "<script>alert('title')</script>" not in body  # the hostile title is escaped here too
    assert "Integrity check" in body


async def test_the_storage_page_folds_the_empty_tables_into_one_line(tmp_path, model):
    async with dashboard(tmp_path, model, token=TOKEN) as gw:
        await seed(gw)
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/storage")
        finally:
            await browser.close()
        report = await gw.db.storage.report()
    empty = [o for o in report.objects if o.bytes is not None and o.bytes <= 4096]
    assert len(empty) >= 10  # a fresh store: most of its tables and indexes are one page
    listed = re.findall(r"<tr><td>([^<]+)</td>", re.findall(r'<table id="objects">.*?</table>', body, re.S)[0])
    assert not {o.name for o in empty} & set(listed), listed  # no row each ...
    assert listed and listed[0] == report.objects[0].name  # ... while the big ones keep theirs
    folded = re.findall(r'<details id="small-objects" class="folded">\s*<summary>(.*?)</summary>', body, re.S)[0]
    kib = sum(o.bytes for o in empty) / 1024
    assert re.sub(r"<[^>]+>", "", folded).startswith(f"{len(empty)} empty tables and indexes, {kib:.1f} KiB (")
    shown = re.findall(r'<details id="small-objects".*?</details>', body, re.S)[0]
    assert all(f"<td>{o.name}</td>" in shown for o in empty)  # one click shows them


async def test_an_untitled_session_is_listed_by_when_it_started_not_by_its_raw_id(tmp_path, model):
    async with dashboard(tmp_path, model) as gw:
        await gw.db.sessions.create("20261201_101500_abcdef12", "telegram", user_id="7", user_name="Ann")
        await gw.db.messages.append("20261201_101500_abcdef12", "user", "first words")
        browser = Browser(gw)
        try:
            await browser.login()
            _, body, _ = await browser.get("/ui/sessions")
        finally:
            await browser.close()
    link = re.search(r'<a href="/ui/sessions/20261201_101500_abcdef12"[^>]*>(.*?)</a>', body, re.S)
    assert link, body
    shown = html.unescape(re.sub(r"<[^>]+>", "", link.group(1)))
    assert shown.startswith("Untitled, started ") and "abcdef12" not in shown
    assert 'title="20261201_101500_abcdef12"' in link.group(0)  # the id is still there, on hover
