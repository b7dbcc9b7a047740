"""The dashboard's server side: the guard in front of every ``/ui`` route, log-in, templates, static files.

:class:`Dashboard` is built by the daemon (the composition root) and handed to the local API, which
adds :meth:`Dashboard.routes` and :meth:`Dashboard.guard` to its application.  Templates and static
files are read once, off the event loop, by :meth:`Dashboard.load`; a request only renders.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web

from gateway.runtime.dashboard.guard import (
    COOKIE,
    SECURITY_HEADERS,
    BrowserSession,
    BrowserSessions,
    Client,
    ClientLimit,
    Proxies,
    host_name,
    is_loopback_name,
    same_origin,
    same_secret,
)

if TYPE_CHECKING:  # jinja2 is imported by _load_files, off the loop, only when ui.enabled
    import jinja2

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
PREFIX = "/ui"
OPEN_PATHS = ("/ui/login",)  # besides /ui/static/*: what a visitor who has not logged in may load
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# the request's browser session (None: none yet), set by the guard; a typed key where aiohttp has them
SESSION_KEY: Any = web.RequestKey("ui_session", object) if hasattr(web, "RequestKey") else "ui_session"
CLIENT_KEY: Any = web.RequestKey("ui_client", object) if hasattr(web, "RequestKey") else "ui_client"


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    """``api.token`` (None: none set), whether the listener is loopback, ``ui.allow_local_writes``,
    ``ui.trusted_proxies`` and ``ui.cookie_secure``."""

    token: str | None
    loopback: bool
    allow_local_writes: bool = False
    trusted_proxies: tuple[str, ...] = ()
    cookie_secure: bool = False

    @property
    def writes_without_login(self) -> bool:
        return self.token is None and self.allow_local_writes


class Dashboard:
    """The ``/ui`` routes of the local API, with their guard (see :mod:`gateway.runtime.dashboard.guard`)."""

    def __init__(self, settings: DashboardSettings, pages: Any, *, limiter: ClientLimit | None = None):
        self.settings = settings
        self.pages = pages  # a gateway.runtime.dashboard.pages.Pages
        self.sessions = BrowserSessions()
        self.limiter = limiter or ClientLimit()  # failed log-ins
        self.proxies = Proxies(settings.trusted_proxies)
        self._env: jinja2.Environment | None = None
        self._static: dict[str, tuple[bytes, str]] = {}

    async def load(self) -> None:
        """Compile every template and read the static files, on a thread (once, at start)."""
        self._env, self._static = await asyncio.to_thread(_load_files, self.pages.filters())

    # -- routes ---------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        add_get, add_post = app.router.add_get, app.router.add_post
        add_get(PREFIX, self._to_home)
        add_get("/ui/login", self.login_form)
        add_post("/ui/login", self.login)
        add_post("/ui/logout", self.logout)
        add_get("/ui/static/{name}", self.static)
        self.pages.routes(app, self)

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every ``/ui`` request: the checks of the module docstring, then the page; security headers on all."""
        if not _under_ui(request.path):
            return await handler(request)
        try:
            response = await self._guarded(request, handler)
        except web.HTTPException as exc:
            if exc.status >= 400:
                response = self.error_page(request, exc.status, exc.reason)
            else:
                response = web.Response(status=exc.status, headers={"Location": exc.headers.get("Location", "/ui/")})
        except Exception:  # the page says so; the traceback goes to the log
            log.exception("dashboard: %s %s failed", request.method, request.path)
            response = self.error_page(request, 500, "Something went wrong on the server; its log says what.")
        response.headers.update(SECURITY_HEADERS)
        if "Cache-Control" not in response.headers:
            response.headers["Cache-Control"] = "no-store"
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        settings = self.settings
        if settings.token is None and settings.loopback and not is_loopback_name(host_name(request.host)):
            return self.error_page(request, 403, "This dashboard answers on a loopback name only "
                                                 "(127.0.0.1, localhost, [::1]); open it by that address.")
        session = self.sessions.get(request.cookies.get(COOKIE))
        request[SESSION_KEY] = session
        path = request.path
        open_path = path in OPEN_PATHS or path.startswith("/ui/static/")
        if settings.token is not None and not (session is not None and session.signed_in) and not open_path:
            if request.method in ("GET", "HEAD") and not path.endswith("/fragment"):
                return redirect("/ui/login")
            return self.error_page(request, 401, "Log in first.")
        if request.method not in ("GET", "HEAD"):
            refused = self._refuse_change(request, session, await request.post())
            if refused is not None:
                return refused
        return await handler(request)

    def _refuse_change(self, request: web.Request, session: BrowserSession | None, form: Any) -> web.Response | None:
        """Why a POST is refused (a page saying so), or None when it may go ahead."""
        origin = request.headers.get("Origin")
        hosts = [request.host, request.headers.get("X-Forwarded-Host", "").split(",")[0].strip()]
        if origin is not None and not same_origin(origin, [h for h in hosts if h]):
            return self.error_page(request, 403, "This form was sent from another site; nothing was changed.")
        given = form.get("csrf") if form is not None else None
        if session is None or not isinstance(given, str) or not same_secret(given, session.csrf):
            return self.error_page(request, 403, "The form had expired (or was not from this dashboard); "
                                                 "reload the page and try again. Nothing was changed.")
        if request.path in ("/ui/login", "/ui/logout"):
            return None
        if not self.may_change(session):
            return self.error_page(request, 403, "The dashboard is read-only here: set api.token and log in, "
                                                 "or set ui.allow_local_writes: true. Nothing was changed.")
        return None

    def may_change(self, session: BrowserSession | None) -> bool:
        if self.settings.token is not None:
            return session is not None and session.signed_in
        return self.settings.allow_local_writes

    # -- log-in ---------------------------------------------------------------------
    async def _to_home(self, request: web.Request) -> web.StreamResponse:
        return redirect("/ui/")

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self.settings.token is None:
            return redirect("/ui/")
        return self.render(request, "login.html", {"page": "login"})

    async def login(self, request: web.Request) -> web.StreamResponse:
        if self.settings.token is None:
            return redirect("/ui/")
        client = self.client(request).address
        wait = self.limiter.retry_after(client)
        if wait:
            response = self.render(request, "login.html", {
                "page": "login", "error": f"Too many failed log-ins; try again in {wait} seconds."}, status=429)
            response.headers["Retry-After"] = str(wait)
            return response
        form = await request.post()
        given = form.get("token")
        if not isinstance(given, str) or not same_secret(given, self.settings.token):
            self.limiter.count(client)
            log.warning("dashboard: failed log-in from %s", client)
            return self.render(request, "login.html", {"page": "login", "error": "That is not the API token."},
                               status=401)
        session = self.sessions.sign_in(request.get(SESSION_KEY))
        log.info("dashboard: log-in from %s", client)
        response = redirect("/ui/")
        self._set_cookie(request, response, session)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.end(request.get(SESSION_KEY))
        response = redirect("/ui/login" if self.settings.token is not None else "/ui/")
        response.del_cookie(COOKIE, path=PREFIX)
        return response

    # -- rendering ------------------------------------------------------------------
    def render(self, request: web.Request, template: str, context: dict, *, status: int = 200) -> web.Response:
        session = request.get(SESSION_KEY)
        new_session = None
        if session is None:  # a form on the page needs a CSRF token, which needs a session
            session = new_session = self.sessions.new(signed_in=False)
            request[SESSION_KEY] = session
        assert self._env is not None, "Dashboard.load() runs before the API serves"
        html = self._env.get_template(template).render(
            csrf=session.csrf, signed_in=session.signed_in, needs_login=self.settings.token is not None,
            may_change=self.may_change(session), **context)
        response = web.Response(text=html, status=status, content_type="text/html", charset="utf-8")
        if new_session is not None:
            self._set_cookie(request, response, new_session)
        return response

    def error_page(self, request: web.Request, status: int, message: str | None) -> web.Response:
        titles = {500: "Server error", 401: "Log in first", 403: "Refused", 404: "Not found", 405: "Method not allowed",
                  429: "Too many requests"}
        return self.render(request, "error.html", {
            "page": "error", "status": status, "title": titles.get(status, "Error"),
            "message": message if status != 404 else "There is nothing here: the page, session or job does not exist.",
        }, status=status)

    def client(self, request: web.Request) -> Client:
        """The browser behind ``request``: its address and whether its side is HTTPS (forwarding headers
        believed from ``ui.trusted_proxies`` only)."""
        client = request.get(CLIENT_KEY)
        if client is None:
            client = request[CLIENT_KEY] = self.proxies.client(request.remote, request.headers, tls=request.secure)
        return client

    def _set_cookie(self, request: web.Request, response: web.StreamResponse, session: BrowserSession) -> None:
        secure = self.settings.cookie_secure or self.client(request).https
        response.set_cookie(COOKIE, session.id, path=PREFIX, httponly=True, samesite="Strict", secure=secure)

    async def static(self, request: web.Request) -> web.StreamResponse:
        found = self._static.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        body, content_type = found
        return web.Response(body=body, content_type=content_type, headers={"Cache-Control": "no-cache"})


def _under_ui(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def redirect(location: str) -> web.Response:
    """A 303 to ``location`` (after a form: the browser GETs the page it names)."""
    return web.Response(status=303, headers={"Location": location})


def _load_files(filters: dict[str, Callable]) -> tuple[jinja2.Environment, dict[str, tuple[bytes, str]]]:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             auto_reload=False, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(filters)
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)
    static = {}
    for path in (HERE / "static").iterdir():
        if path.is_file():
            static[path.name] = (path.read_bytes(), mimetypes.guess_type(path.name)[0] or "application/octet-stream")
    return env, static
