"""A platform's own paths on the local API: webhooks arrive on the server that is already listening.

A platform's settings model names its paths (``PlatformConfig.HTTP_PATHS``: the webhook platform's
``/webhooks/{name}``); for every installed platform the local API mounts them and hands each
request, read whole into a plain :class:`gateway.types.HttpRequest`, to the platform's running
adapter (:class:`gateway.types.HttpInbound`).  The adapter authenticates its own requests (a hook's
HMAC signature), so these paths skip ``api.token``; no adapter ever sees the server, and the
gateway never names a platform.  While the adapter is not running (starting, restarting after a
reload, or off) a request gets 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
from typing import Callable

from aiohttp import web

from gateway.types import HttpInbound, HttpRequest

log = logging.getLogger(__name__)

ROUTE_PREFIX = "platform:"  # the aiohttp route names of these paths (the API's auth lets them through)


class PlatformHttp:
    """The platforms' paths: ``routes`` is (platform, path) pairs; ``adapter(name)`` the running adapter or None."""

    def __init__(self, routes: tuple[tuple[str, str], ...], adapter: Callable[[str], object | None]):
        self.routes = routes
        self.adapter = adapter

    @classmethod
    def installed(cls, adapter: Callable[[str], object | None]) -> "PlatformHttp":
        """Every installed platform's paths (mounted whether it is on or not, so a reload that turns it on
        needs no new listener; while it is off they answer 503)."""
        from gateway.config import platform_models

        return cls(tuple((name, path) for name, model in platform_models().items() for path in model.HTTP_PATHS),
                   adapter)

    def mount(self, app: web.Application) -> None:
        for i, (platform, path) in enumerate(self.routes):
            app.router.add_route("*", path, self._handler(platform), name=f"{ROUTE_PREFIX}{platform}:path{i}")

    @staticmethod
    def owns(request: web.Request) -> bool:
        route = request.match_info.route
        return (getattr(route, "name", None) or "").startswith(ROUTE_PREFIX)

    def _handler(self, platform: str):
        async def handle(request: web.Request) -> web.StreamResponse:
            adapter = self.adapter(platform)
            if not isinstance(adapter, HttpInbound):
                return web.json_response({"error": f"{platform} is not running in this process (off in the config, "
                                                   "or starting: retry shortly)"}, status=503,
                                         headers={"Retry-After": "5"})
            body = await request.read()
            answer = await adapter.handle_http(HttpRequest(
                method=request.method, path=request.path, params=dict(request.match_info), query=dict(request.query),
                headers={k.lower(): v for k, v in request.headers.items()}, body=body, remote=request.remote))
            if answer.text is not None:
                return web.Response(text=answer.text, status=answer.status, headers=answer.headers)
            return web.json_response(answer.body, status=answer.status, headers=answer.headers)

        return handle
